"""A scripted stand-in for loadwatch's /metrics: the documented metrics, text a test changes.

`Scene` is one moment of a load as loadwatch would export it (names, types and labels from
docs/metrics.md); `render()` turns it into the text exposition format. `ExpositionServer` serves
the current text on loopback, so a real Prometheus can scrape a load that progresses, stalls or
fails on the test's command.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GIB = 1 << 30
PHASES = ("starting", "loading_weights", "post_load", "ready", "failed", "stalled", "stopped")
VLLM_STATES = ("starting", "running", "backoff", "stopping", "exited", "fatal")
FAILURE_KINDS = (
    "cuda_oom",
    "kv_cache_too_small",
    "max_model_len",
    "engine_init_failed",
    "startup_timeout",
    "worker_died",
    "nccl",
    "fp8_kv_unsupported",
    "completion_failed",
    "other",
    "vanished",
)


@dataclass(frozen=True)
class Scene:
    """One moment of a Kimi-K2.5-like load on `gpus` GPUs; times are epoch seconds."""

    now_s: float
    started_s: float  # the daemon
    session_start_s: float
    phase: str = "loading_weights"
    shards_done: int = 0
    shards_total: int = 64
    shard_bytes: int = 9 * GIB
    last_progress_s: float | None = None
    stalled: bool = False
    stall_threshold_s: float = 120.0
    stalls: int = 0
    budget_s: float | None = 1800.0
    eta_s: float | None = None
    oom_predicted: bool = False
    failure: str | None = None  # the kind the current session failed with
    failures: Mapping[str, int] = field(default_factory=dict)
    sessions: int = 1
    vllm_state: str = "running"
    vllm_starts: int = 1
    vllm_exits: Mapping[str, int] = field(default_factory=dict)
    orphans: int = 0
    warnings: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (code, verdict)
    gpus: int = 8
    gpu_down: frozenset[int] = frozenset()
    gpu_total_bytes: int = 141 * GIB
    xids: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid) -> count
    log_up: bool = True
    gpu_source_up: bool = True
    time_to_ready_s: float | None = None
    first_completion_s: float | None = None
    weights_load_s: float | None = None
    # the start-up timeline: seconds per phase, of the current start and the last ready one
    startup_seconds: Mapping[str, float] = field(default_factory=dict)
    last_startup_seconds: Mapping[str, float] = field(default_factory=dict)
    startup_eta_s: tuple[float, float, float] | None = None  # low, mid, high: from the history
    startup_overdue_s: float = 0.0
    startup_phase_overdue_s: float = 0.0  # the step under way's (the last of startup_seconds)
    log_lines: int = 0
    scrapes: int = 0
    node_role: str = "head"
    node_rank: int = 0
    node_progress: float | None = None  # None: the bar's ratio (shards_done / shards_total)
    node_stalled: bool = False
    node_ready: bool | None = None  # None: as the phase says

    @property
    def ready(self) -> bool:
        return self.phase == "ready"


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        if labels:
            inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
            name = f"{name}{{{inner}}}"
        self.lines.append(f"{name} {_number(value)}")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _gpus(scene: Scene) -> Iterator[tuple[int, dict[str, str]]]:
    for i in range(scene.gpus):
        yield i, {"gpu": str(i), "UUID": f"GPU-{i:08x}-0000-4000-8000-{i:012x}"}


def render(scene: Scene) -> str:
    """The scene as Prometheus text exposition (version 0.0.4)."""
    t = _Text()
    loading = scene.phase in ("starting", "loading_weights", "stalled")
    total_bytes = scene.shards_total * scene.shard_bytes
    done_bytes = scene.shards_done * scene.shard_bytes

    t.family("loadwatch_build_info", "gauge", "The build that runs; always 1.")
    t.sample("loadwatch_build_info", 1, {"version": "0.1.0", "python": "3.11.2"})
    t.family("loadwatch_vllm_info", "gauge", "The vLLM of the current session; always 1.")
    labels = {"model_name": "/models/Kimi-K2.5-NVFP4", "served_model_name": "", "version": "0.15.1"}
    t.sample("loadwatch_vllm_info", 1, labels)
    t.family("loadwatch_start_time_seconds", "gauge", "When the daemon started.")
    t.sample("loadwatch_start_time_seconds", scene.started_s)

    t.family("loadwatch_load_phase", "gauge", "1 for the current phase.")
    for phase in PHASES:
        t.sample("loadwatch_load_phase", 1 if phase == scene.phase else 0, {"phase": phase})
    t.family("loadwatch_load_phase_since_timestamp_seconds", "gauge", "When the phase began.")
    t.sample("loadwatch_load_phase_since_timestamp_seconds", scene.session_start_s)
    t.family("loadwatch_load_ready", "gauge", "1 while vLLM is ready.")
    t.sample("loadwatch_load_ready", 1 if scene.ready else 0)
    t.family("loadwatch_session_start_timestamp_seconds", "gauge", "When the session started.")
    t.sample("loadwatch_session_start_timestamp_seconds", scene.session_start_s)
    t.family("loadwatch_load_shards_done", "gauge", "Weight shards loaded.")
    t.sample("loadwatch_load_shards_done", scene.shards_done)
    t.family("loadwatch_load_shards", "gauge", "Weight shards to load.")
    t.sample("loadwatch_load_shards", scene.shards_total)
    t.family("loadwatch_load_done_bytes", "gauge", "Checkpoint bytes loaded.")
    t.sample("loadwatch_load_done_bytes", done_bytes)
    t.family("loadwatch_load_total_bytes", "gauge", "Checkpoint bytes to load.")
    t.sample("loadwatch_load_total_bytes", total_bytes)
    t.family("loadwatch_load_progress_ratio", "gauge", "Weight loading progress.")
    t.sample("loadwatch_load_progress_ratio", scene.shards_done / scene.shards_total)
    if scene.eta_s is not None and loading:
        t.family("loadwatch_load_eta_seconds", "gauge", "Seconds until the weights are loaded.")
        t.sample("loadwatch_load_eta_seconds", scene.eta_s)
        t.family("loadwatch_load_eta_low_seconds", "gauge", "Optimistic ETA.")
        t.sample("loadwatch_load_eta_low_seconds", scene.eta_s * 0.8)
        t.family("loadwatch_load_eta_high_seconds", "gauge", "Pessimistic ETA.")
        t.sample("loadwatch_load_eta_high_seconds", scene.eta_s * 1.3)
    t.family("loadwatch_load_bytes_total", "counter", "Checkpoint bytes loaded in the session.")
    t.sample("loadwatch_load_bytes_total", done_bytes)
    t.family(
        "loadwatch_load_shards_loaded_total", "counter", "Weight shards loaded in the session."
    )
    t.sample("loadwatch_load_shards_loaded_total", scene.shards_done)
    if scene.last_progress_s is not None:
        t.family("loadwatch_load_last_progress_timestamp_seconds", "gauge", "Last progress.")
        t.sample("loadwatch_load_last_progress_timestamp_seconds", scene.last_progress_s)
    t.family("loadwatch_load_stalled", "gauge", "1 while the load is stalled.")
    t.sample("loadwatch_load_stalled", 1 if scene.stalled else 0)
    if loading or scene.phase == "post_load":  # the stall check's watch
        t.family("loadwatch_load_stall_threshold_seconds", "gauge", "Silence that is a stall.")
        t.sample("loadwatch_load_stall_threshold_seconds", scene.stall_threshold_s)
        since = (
            scene.last_progress_s if scene.last_progress_s is not None else scene.session_start_s
        )
        t.family("loadwatch_load_silence_seconds", "gauge", "Silence the stall check counts.")
        t.sample("loadwatch_load_silence_seconds", max(scene.now_s - since, 0.0))
    if scene.budget_s is not None:
        t.family("loadwatch_load_budget_seconds", "gauge", "The configured load budget.")
        t.sample("loadwatch_load_budget_seconds", scene.budget_s)
    t.family("loadwatch_load_stalls_total", "counter", "Stalls raised.")
    t.sample("loadwatch_load_stalls_total", scene.stalls)
    if scene.time_to_ready_s is not None:
        t.family("loadwatch_time_to_ready_seconds", "gauge", "Start to ready, last session.")
        t.sample("loadwatch_time_to_ready_seconds", scene.time_to_ready_s)
    if scene.first_completion_s is not None:
        t.family("loadwatch_first_completion_seconds", "gauge", "Time to first token at start-up.")
        t.sample("loadwatch_first_completion_seconds", scene.first_completion_s)
    if scene.weights_load_s is not None:
        t.family("loadwatch_weights_load_seconds", "gauge", "Weight loading time, last session.")
        t.sample("loadwatch_weights_load_seconds", scene.weights_load_s)
    _startup(t, scene)
    t.family("loadwatch_sessions_total", "counter", "vLLM sessions seen.")
    t.sample("loadwatch_sessions_total", scene.sessions)
    t.family("loadwatch_vllm_restarts_total", "counter", "Sessions after the first.")
    t.sample("loadwatch_vllm_restarts_total", max(scene.sessions - 1, 0))

    t.family("loadwatch_session_warnings", "gauge", "Warnings of the session by code, verdict.")
    for (code, verdict), count in sorted(scene.warnings.items()):
        t.sample("loadwatch_session_warnings", count, {"code": code, "verdict": verdict})
    t.family("loadwatch_warnings_total", "counter", "Warnings seen by code.")
    by_code: dict[str, int] = {}
    for (code, _), count in scene.warnings.items():
        by_code[code] = by_code.get(code, 0) + count
    for code, count in sorted(by_code.items()):
        t.sample("loadwatch_warnings_total", count, {"code": code})
    t.family("loadwatch_session_failure", "gauge", "1 for the kind the session failed with.")
    if scene.failure is not None:
        t.sample("loadwatch_session_failure", 1, {"kind": scene.failure})
    t.family("loadwatch_failures_total", "counter", "Failures seen by kind.")
    for kind in FAILURE_KINDS:
        t.sample("loadwatch_failures_total", scene.failures.get(kind, 0), {"kind": kind})
    t.family("loadwatch_oom_predicted", "gauge", "1 while a GPU is projected to run out.")
    t.sample("loadwatch_oom_predicted", 1 if scene.oom_predicted else 0)

    share = scene.shard_bytes * scene.shards_total / scene.gpus
    loaded = scene.shards_done / scene.shards_total
    t.family("loadwatch_gpu_info", "gauge", "One per GPU; always 1.")
    for _, labels in _gpus(scene):
        info = {**labels, "name": "NVIDIA H200", "compute_capability": "9.0"}
        t.sample("loadwatch_gpu_info", 1, info)
    t.family("loadwatch_gpu_up", "gauge", "1 if the GPU answered its last poll.")
    for i, labels in _gpus(scene):
        t.sample("loadwatch_gpu_up", 0 if i in scene.gpu_down else 1, labels)
    answering = [(i, g) for i, g in _gpus(scene) if i not in scene.gpu_down]
    per_gpu = (
        ("loadwatch_gpu_memory_used_bytes", lambda i: 2 * GIB + share * loaded),
        ("loadwatch_gpu_memory_total_bytes", lambda i: scene.gpu_total_bytes),
        ("loadwatch_gpu_utilization_ratio", lambda i: 0.35 + 0.05 * (i % 3)),
        ("loadwatch_gpu_temperature_celsius", lambda i: 41 + i),
        ("loadwatch_gpu_power_watts", lambda i: 180.5 + 10 * i),
    )
    for name, value in per_gpu:
        t.family(name, "gauge", "Per-GPU reading.")
        for i, labels in answering:
            t.sample(name, value(i), labels)
    if loading:
        extra = 40 * GIB if scene.oom_predicted else 0
        t.family("loadwatch_gpu_memory_projected_bytes", "gauge", "Projected once loaded.")
        for _, labels in answering:
            t.sample("loadwatch_gpu_memory_projected_bytes", 2 * GIB + share + extra, labels)
        if scene.oom_predicted:
            t.family("loadwatch_gpu_memory_shortfall_bytes", "gauge", "Projection over capacity.")
            for _, labels in answering:
                over = 2 * GIB + share + extra - scene.gpu_total_bytes
                t.sample("loadwatch_gpu_memory_shortfall_bytes", max(over, 0), labels)
    t.family("loadwatch_gpu_xid_events_total", "counter", "NVML Xid errors, all codes.")
    for gpu, labels in _gpus(scene):
        total = sum(n for (g, _), n in scene.xids.items() if g == gpu)
        t.sample("loadwatch_gpu_xid_events_total", total, dict(labels))
    t.family("loadwatch_gpu_xid_errors_total", "counter", "NVML Xid errors by code.")
    for (gpu, xid), count in sorted(scene.xids.items()):
        labels = dict(dict(_gpus(scene))[gpu])
        t.sample("loadwatch_gpu_xid_errors_total", count, {**labels, "xid": str(xid)})

    sources = {"log": scene.log_up, "gpu": scene.gpu_source_up, "vllm": True}
    t.family("loadwatch_source_up", "gauge", "1 if the source works.")
    for source, up in sources.items():
        t.sample("loadwatch_source_up", 1 if up else 0, {"source": source})
    t.family("loadwatch_source_errors_total", "counter", "Errors of the source.")
    for source, up in sources.items():
        t.sample("loadwatch_source_errors_total", 0 if up else 3, {"source": source})
    t.family("loadwatch_source_last_success_timestamp_seconds", "gauge", "Last success.")
    for source, up in sources.items():
        when = scene.now_s if up else scene.started_s
        t.sample("loadwatch_source_last_success_timestamp_seconds", when, {"source": source})

    t.family("loadwatch_log_state", "gauge", "1 for the log file's state.")
    for state in ("ok", "missing", "unreadable"):
        t.sample("loadwatch_log_state", 1 if state == "ok" else 0, {"state": state})
    t.family("loadwatch_log_lines_total", "counter", "Log records read.")
    t.sample("loadwatch_log_lines_total", scene.log_lines)
    t.family("loadwatch_log_read_bytes_total", "counter", "Log bytes read.")
    t.sample("loadwatch_log_read_bytes_total", scene.log_lines * 120)
    for name, help_text in (
        ("loadwatch_log_records_cut_total", "Records cut at the cap."),
        ("loadwatch_log_rotations_total", "Log rotations followed."),
        ("loadwatch_log_truncations_total", "Log truncations followed."),
    ):
        t.family(name, "counter", help_text)
        t.sample(name, 0)
    t.family(
        "loadwatch_log_client_text_records_total", "counter", "Client text set aside, by kind."
    )
    t.sample("loadwatch_log_client_text_records_total", scene.log_lines // 100, {"kind": "access"})
    t.family("loadwatch_events_total", "counter", "Events parsed from the log.")
    t.sample("loadwatch_events_total", scene.shards_done, {"type": "weights_progress"})
    t.sample("loadwatch_events_total", sum(scene.warnings.values()), {"type": "warning"})
    t.sample("loadwatch_events_total", sum(scene.failures.values()), {"type": "failure"})

    t.family("loadwatch_vllm_state", "gauge", "Supervisor state.")
    for state in VLLM_STATES:
        t.sample("loadwatch_vllm_state", 1 if state == scene.vllm_state else 0, {"state": state})
    t.family("loadwatch_vllm_starts_total", "counter", "vLLM processes started.")
    t.sample("loadwatch_vllm_starts_total", scene.vllm_starts)
    t.family("loadwatch_vllm_exits_total", "counter", "vLLM process exits.")
    for outcome in ("clean", "failed", "signal"):
        t.sample(
            "loadwatch_vllm_exits_total", scene.vllm_exits.get(outcome, 0), {"outcome": outcome}
        )
    t.family("loadwatch_vllm_health_up", "gauge", "1 if vLLM's /health answered 200.")
    t.sample("loadwatch_vllm_health_up", 1 if scene.ready else 0)
    t.family("loadwatch_vllm_orphans", "gauge", "Processes of the last run still on a GPU.")
    t.sample("loadwatch_vllm_orphans", scene.orphans)
    t.family("loadwatch_vllm_remedies_total", "counter", "Remedies of failed starts.")
    t.sample("loadwatch_vllm_remedies_total", 0, {"remedy": "max_model_len", "outcome": "applied"})
    t.family("loadwatch_vllm_remedy_ladder_exhausted", "gauge", "No remedy left.")
    t.sample("loadwatch_vllm_remedy_ladder_exhausted", 0)
    _node(t, scene, loading, total_bytes)
    t.family("loadwatch_http_requests_total", "counter", "Requests served.")
    t.sample("loadwatch_http_requests_total", scene.scrapes, {"route": "/metrics", "code": "200"})
    for name, kind, value in (
        ("cpu_seconds_total", "counter", 0.5),
        ("resident_memory_bytes", "gauge", 30e6),
        ("virtual_memory_bytes", "gauge", 200e6),
        ("start_time_seconds", "gauge", scene.started_s),
        ("open_fds", "gauge", 12),
        ("max_fds", "gauge", 1024),
    ):
        t.family(f"loadwatch_http_process_{name}", kind, "The HTTP process's own.")
        t.sample(f"loadwatch_http_process_{name}", value)
    _memory_plan(t, scene)
    return "\n".join(t.lines) + "\n"


# The start-up step under way, by the load phase (the timeline's own is finer).
STARTUP_STEP = {"starting": "config", "loading_weights": "weights", "post_load": "kv_cache"}
STARTUP_PHASES = (
    *("config", "weights", "weight_postprocess", "torch_compile", "autotune", "kv_cache"),
    *("graph_capture", "engine_ready", "api_server", "first_completion", "unknown"),
)


def _startup(t: _Text, scene: Scene) -> None:
    under_way = STARTUP_STEP.get(scene.phase)
    t.family("loadwatch_startup_phase", "gauge", "1 for the start-up step under way.")
    for phase in STARTUP_PHASES:
        t.sample("loadwatch_startup_phase", 1 if phase == under_way else 0, {"phase": phase})
    t.family("loadwatch_startup_phase_seconds", "gauge", "Seconds per start-up phase.")
    for start, took in (("current", scene.startup_seconds), ("last", scene.last_startup_seconds)):
        for phase, seconds in took.items():
            t.sample("loadwatch_startup_phase_seconds", seconds, {"phase": phase, "start": start})
    if scene.startup_eta_s is not None:
        t.family("loadwatch_startup_eta_seconds", "gauge", "Seconds left to ready, learned.")
        for bound, value in zip(("low", "mid", "high"), scene.startup_eta_s, strict=True):
            t.sample("loadwatch_startup_eta_seconds", value, {"bound": bound})
        t.family("loadwatch_startup_overdue_seconds", "gauge", "Seconds past the slowest start.")
        t.sample("loadwatch_startup_overdue_seconds", scene.startup_overdue_s)
        if scene.startup_seconds:
            t.family(
                "loadwatch_startup_phase_overdue_seconds", "gauge", "Seconds past, this phase."
            )
            under_way = list(scene.startup_seconds)[-1]
            labels = {"phase": under_way}
            t.sample(
                "loadwatch_startup_phase_overdue_seconds", scene.startup_phase_overdue_s, labels
            )


def _memory_plan(t: _Text, scene: Scene) -> None:
    """Kimi-K2.5 with a bf16 KV cache on GPUs of this size (docs/preflight.md's plan, scaled)."""
    t.family("loadwatch_memory_plan_verdict", "gauge", "The memory plan's verdict.")
    for verdict in ("fits", "tight", "will_fail", "unknown"):
        t.sample(
            "loadwatch_memory_plan_verdict", 1 if verdict == "fits" else 0, {"verdict": verdict}
        )
    t.family("loadwatch_kv_cache_bytes_per_token", "gauge", "Planned KV bytes per token.")
    t.sample("loadwatch_kv_cache_bytes_per_token", 61 * 1152)
    t.family("loadwatch_weights_planned_bytes", "gauge", "Planned weights per GPU.")
    t.sample(
        "loadwatch_weights_planned_bytes", scene.shards_total * scene.shard_bytes // scene.gpus
    )
    budgets = (("low", 18 * GIB), ("high", 22 * GIB))
    t.family("loadwatch_kv_cache_planned_budget_bytes", "gauge", "Planned KV memory per GPU.")
    for bound, budget in budgets:
        t.sample("loadwatch_kv_cache_planned_budget_bytes", budget, {"bound": bound})
    t.family("loadwatch_kv_cache_planned_tokens", "gauge", "Planned KV tokens.")
    for bound, budget in budgets:
        t.sample("loadwatch_kv_cache_planned_tokens", budget // (61 * 1152), {"bound": bound})
    t.family("loadwatch_kv_cache_vs_plan", "gauge", "vLLM's KV cache against the plan.")
    done = scene.phase in ("post_load", "ready")
    for c in ("pending", "as_planned", "below_budget", "above_budget", "differs"):
        hit = c == ("as_planned" if done else "pending")
        t.sample("loadwatch_kv_cache_vs_plan", 1 if hit else 0, {"comparison": c})
    for name, help_text, value in (
        ("loadwatch_kv_cache_available_bytes", "vLLM's KV memory.", 20 * GIB),
        ("loadwatch_kv_cache_tokens", "vLLM's KV tokens.", 20 * GIB // (61 * 1152)),
        ("loadwatch_kv_cache_expected_tokens", "Expected tokens.", 20 * GIB // (61 * 1152)),
    ):
        t.family(name, "gauge", help_text)  # as at the end of a load: vLLM sized its cache
        t.sample(name, value)


def _node(t: _Text, scene: Scene, loading: bool, total_bytes: int) -> None:
    """The node's series (exporters/prometheus_node.py): a head of a 2-node TP/PP deployment,
    or a headless node of it."""
    bar = scene.shards_done / scene.shards_total if scene.shards_total else 0.0
    ratio = scene.node_progress if scene.node_progress is not None else bar
    ready = scene.ready if scene.node_ready is None else scene.node_ready
    labels = {
        "role": scene.node_role,
        "node_rank": str(scene.node_rank),
        "nnodes": "2",
        "head_address": "10.0.0.1:29501",
        "ranks": "0-7" if scene.node_rank == 0 else "8-15",
        "world_size": "16",
        "backend": "nccl",
    }
    expected = total_bytes // 2
    for name, value in (
        ("loadwatch_node_info", 1.0),
        ("loadwatch_node_ready", 1.0 if ready else 0.0),
        ("loadwatch_node_loading", 1.0 if loading else 0.0),
        ("loadwatch_node_stalled", 1.0 if scene.node_stalled else 0.0),
        ("loadwatch_node_bar_unbacked", 0.0),
        ("loadwatch_node_progress_ratio", ratio),
        ("loadwatch_node_read_bytes", expected * ratio),
        ("loadwatch_node_expected_read_bytes", expected),
        ("loadwatch_node_read_share_ratio", 0.5),
        ("loadwatch_node_gpu_gained_bytes", expected * ratio),
    ):
        t.family(name, "gauge", "The node's.")
        t.sample(name, value, labels if name == "loadwatch_node_info" else None)
    t.family("loadwatch_node_signal_progress_ratio", "gauge", "Progress by one signal.")
    for signal in ("io", "gpu"):
        t.sample("loadwatch_node_signal_progress_ratio", ratio, {"signal": signal})
    t.family("loadwatch_node_eta_seconds", "gauge", "The node's ETA.")
    if scene.eta_s is not None:
        for bound, k in (("expected", 1.0), ("low", 0.8), ("high", 1.3)):
            t.sample("loadwatch_node_eta_seconds", scene.eta_s * k, {"bound": bound})


class ExpositionServer:
    """Serves `/metrics` with whatever text was last set, on 127.0.0.1 (a free port)."""

    def __init__(self, text: str = "") -> None:
        self._text = text.encode()
        self._lock = threading.Lock()
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                with owner._lock:
                    body = owner._text
                    owner.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test output stays readable

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def set(self, text: str) -> None:
        with self._lock:
            self._text = text.encode()

    def start(self) -> ExpositionServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ExpositionServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
