"""The Prometheus collector: reads the latest published bundle at scrape time.

Registered on its own `CollectorRegistry` (no global metrics). Every metric is listed in
docs/metrics.md; a value that is not known is left out, never exported as 0.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from typing import Any, get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from loadwatch.daemon.state.published import Published
from loadwatch.daemon.state.snapshot import GpuView, SessionView, Snapshot
from loadwatch.exporters.prometheus_memplan import memory_plan_metrics
from loadwatch.exporters.prometheus_node import node_metrics
from loadwatch.exporters.prometheus_timeline import timeline_metrics
from loadwatch.parsers.events import FailureKind

PHASES = ("starting", "loading_weights", "post_load", "ready", "failed", "stalled", "stopped")
SUPERVISOR_STATES = ("idle", "starting", "running", "backoff", "stopping", "exited", "fatal")
# Every kind is exported from 0, so an alert's increase() sees the first failure of a kind;
# "exited" is a bad exit with no failure in the log.
FAILURE_KINDS = (*get_args(FailureKind), "exited")
EXIT_OUTCOMES = ("clean", "failed", "signal")
LOG_STATES = ("ok", "missing", "unreadable")

Metric = GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily


class LoadwatchCollector(Collector):
    def __init__(
        self, published: Callable[[], Published | None], clock: Callable[[], float]
    ) -> None:
        self._published = published
        self._clock = clock

    def describe(self) -> list[Any]:
        return []  # families are built at scrape time; nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        pub = self._published()
        if pub is None:
            return
        now = self._clock()
        snap = pub.snapshot(now)
        yield from _build(pub, snap)
        yield from _load(pub, snap)
        yield from _sessions(pub, snap)
        yield from _gpus(pub, snap)
        yield from _sources(pub)
        yield from _supervisor(pub)
        yield from _health(snap)
        yield from memory_plan_metrics(snap)
        yield from node_metrics(snap)
        yield from timeline_metrics(snap)


def registry_for(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


class Renderer:
    """`render` for a registry rendered again and again: a family whose samples did not change
    since the last time is not formatted again. Between two publishes of a serving daemon only
    a few counters move; formatting every sample was most of a publish."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._last: dict[str, tuple[tuple[Any, ...], bytes]] = {}

    def __call__(self) -> bytes:
        out: list[bytes] = []
        seen: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        for family in self._registry.collect():
            key = (family.type, family.documentation, family.unit, family.samples)
            last = self._last.get(family.name)
            if last is None or last[0] != key:
                last = (key, generate_latest(_One(family)))  # type: ignore[arg-type]
            seen[family.name] = last
            out.append(last[1])
        self._last = seen
        return b"".join(out)


class _One:
    """A registry of one family, for `generate_latest`."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterator[Metric]:
        yield self._family


def _gauge(
    name: str, doc: str, value: float | None, labels: dict[str, str] | None = None
) -> Iterator[GaugeMetricFamily]:
    if value is None:
        return
    g = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    g.add_metric(list((labels or {}).values()), float(value))
    yield g


def _build(pub: Published, snap: Snapshot) -> Iterator[Metric]:
    g = GaugeMetricFamily(
        "loadwatch_build_info", "The build that runs; always 1.", labels=["version", "python"]
    )
    g.add_metric([pub.version, platform.python_version()], 1.0)
    yield g
    # What joins vLLM's own vllm:*{model_name=...} series: vLLM labels them with the served
    # model name, which is the model as given when no --served-model-name is set.
    s = snap.session
    served = getattr(s, "served_model_name", None) if s is not None else None
    model = served or (snap.model.path if snap.model is not None else None)
    if s is not None and (s.version or model):
        info = GaugeMetricFamily(
            "loadwatch_vllm_info",
            "The vLLM the current session runs; always 1.",
            labels=["model_name", "served_model_name", "version"],
        )
        info.add_metric([model or "", served or "", s.version or ""], 1.0)
        yield info
    yield from _gauge("loadwatch_start_time_seconds", "When the daemon started.", pub.started_at)


def _load(pub: Published, snap: Snapshot) -> Iterator[Metric]:
    s = snap.session
    phase = GaugeMetricFamily(
        "loadwatch_load_phase", "1 for the current session's phase.", labels=["phase"]
    )
    for name in PHASES:
        phase.add_metric([name], 1.0 if s is not None and s.phase == name else 0.0)
    yield phase
    yield from _gauge("loadwatch_load_ready", "1 while vLLM is ready.", 1.0 if snap.ready else 0.0)
    yield from _gauge(
        "loadwatch_load_budget_seconds", "The configured load budget.", pub.load_budget_s
    )
    if s is None:
        return
    yield from _gauge(
        "loadwatch_load_phase_since_timestamp_seconds",
        "When the current phase was entered.",
        s.phase_entered_at,
    )
    yield from _gauge(
        "loadwatch_session_start_timestamp_seconds",
        "When the current vLLM session started.",
        s.started_at,
    )
    p = s.progress
    yield from _gauge("loadwatch_load_shards_done", "Weight shards loaded so far.", p.shards_done)
    yield from _gauge("loadwatch_load_shards", "Weight shards to load.", p.shards_total)
    yield from _gauge("loadwatch_load_done_bytes", "Checkpoint bytes loaded so far.", p.bytes_done)
    yield from _gauge("loadwatch_load_total_bytes", "Checkpoint bytes to load.", p.bytes_total)
    yield from _gauge("loadwatch_load_progress_ratio", "Weight loading progress, 0..1.", p.ratio)
    # Counters, so the rate is PromQL's: rate(loadwatch_load_bytes_total[1m]). They start again
    # at 0 with each vLLM session, which rate() and increase() read as a counter reset.
    if p.bytes_done is not None:
        c = CounterMetricFamily(
            "loadwatch_load_bytes", "Checkpoint bytes loaded in the current vLLM session."
        )
        c.add_metric([], float(p.bytes_done))
        yield c
    if p.shards_done is not None:
        c = CounterMetricFamily(
            "loadwatch_load_shards_loaded", "Weight shards loaded in the current vLLM session."
        )
        c.add_metric([], float(p.shards_done))
        yield c
    yield from _gauge(
        "loadwatch_load_last_progress_timestamp_seconds",
        "When the load last made progress.",
        p.last_progress_at,
    )
    if p.eta is not None and s.phase in ("loading_weights", "stalled", "starting"):
        yield from _gauge(
            "loadwatch_load_eta_seconds",
            "Estimated seconds until the weights are loaded.",
            p.eta.remaining_s,
        )
        yield from _gauge(
            "loadwatch_load_eta_low_seconds", "Optimistic end of the ETA range.", p.eta.low_s
        )
        yield from _gauge(
            "loadwatch_load_eta_high_seconds", "Pessimistic end of the ETA range.", p.eta.high_s
        )
    yield from _gauge(
        "loadwatch_load_stalled", "1 while the load is stalled.", 1.0 if s.stall.active else 0.0
    )
    # Both while the session loads (starting, loading weights, after them) or is stalled: the
    # silence the stall check counts and the threshold it holds it against, raised or not.
    yield from _gauge(
        "loadwatch_load_stall_threshold_seconds",
        "Silence after which the load counts as stalled.",
        s.stall.threshold_s,
    )
    yield from _gauge(
        "loadwatch_load_silence_seconds",
        "Seconds since the load last showed progress (outside the weights bar: since the log "
        "last showed a step of the load).",
        s.stall.silent_s,
    )
    yield from _gauge(
        "loadwatch_oom_predicted",
        "1 while a GPU is projected to run out of memory.",
        1.0 if any(g.oom_predicted for g in snap.gpus) else 0.0,
    )


def _last(snap: Snapshot, attr: str) -> float | None:
    """The latest session (current first, then the summaries newest first) that has `attr`."""
    if snap.session is not None and getattr(snap.session, attr) is not None:
        value: float | None = getattr(snap.session, attr)
        return value
    for past in reversed(snap.sessions):
        if getattr(past, attr) is not None:
            value = getattr(past, attr)
            return value
    return None


def _sessions(pub: Published, snap: Snapshot) -> Iterator[Metric]:
    yield from _gauge(
        "loadwatch_time_to_ready_seconds",
        "Start-to-ready time of the last ready session.",
        _last(snap, "time_to_ready_s"),
    )
    first = snap.session.first_completion_s if snap.session is not None else None
    yield from _gauge(
        "loadwatch_first_completion_seconds",
        "Time to first token at start-up: the servable check's one-token completion.",
        first,
    )
    yield from _gauge(
        "loadwatch_weights_load_seconds",
        "Weight loading time of the last loaded session.",
        _last(snap, "weights_load_s"),
    )
    c = CounterMetricFamily("loadwatch_sessions", "vLLM sessions seen.")
    c.add_metric([], snap.sessions_total)
    yield c
    c = CounterMetricFamily(
        "loadwatch_log_client_text_records",
        "Log records of text a client of vLLM chose (request ids, prompts, model names, request "
        "paths) that held words of the grammar, set aside unread, by kind.",
        labels=["kind"],
    )
    for kind, n in sorted(snap.client_text.items()):
        c.add_metric([kind], n)
    yield c
    c = CounterMetricFamily("loadwatch_vllm_restarts", "Sessions after the first.")
    c.add_metric([], snap.restarts)
    yield c
    c = CounterMetricFamily("loadwatch_load_stalls", "Stalls raised.")
    c.add_metric([], pub.totals.stalls)
    yield c
    s: SessionView | None = snap.session
    g = GaugeMetricFamily(
        "loadwatch_session_warnings", "Warnings of the current session.", labels=["code", "verdict"]
    )
    if s is not None:
        for w in s.warnings:
            g.add_metric([w.code, w.verdict], w.count)
    yield g
    c = CounterMetricFamily(
        "loadwatch_warnings", "Warnings seen since the daemon started.", labels=["code"]
    )
    for code, n in sorted(pub.totals.warnings.items()):
        c.add_metric([code], n)
    yield c
    g = GaugeMetricFamily(
        "loadwatch_session_failure",
        "1 for the kind the current session failed with.",
        labels=["kind"],
    )
    if s is not None and s.failure_kind is not None:
        g.add_metric([s.failure_kind], 1.0)
    yield g
    c = CounterMetricFamily(
        "loadwatch_failures", "Failures seen; one crash counts once.", labels=["kind"]
    )
    for kind in sorted(set(FAILURE_KINDS) | set(pub.totals.failures)):
        c.add_metric([kind], pub.totals.failures.get(kind, 0))
    yield c
    c = CounterMetricFamily("loadwatch_events", "Events parsed from the log.", labels=["type"])
    for kind, n in sorted(pub.totals.events.items()):
        c.add_metric([kind], n)
    yield c


_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuView], float | None]], ...] = (
    ("loadwatch_gpu_memory_used_bytes", "Device memory in use.", lambda g: g.memory_used_bytes),
    ("loadwatch_gpu_memory_total_bytes", "Device memory capacity.", lambda g: g.memory_total_bytes),
    (
        "loadwatch_gpu_memory_projected_bytes",
        "Memory projected for when all weights are loaded.",
        lambda g: g.projected_final_bytes,
    ),
    (
        "loadwatch_gpu_memory_shortfall_bytes",
        "Bytes the projection exceeds capacity by.",
        lambda g: g.shortfall_bytes if g.oom_predicted else None,
    ),
    ("loadwatch_gpu_utilization_ratio", "GPU busy, 0..1.", lambda g: g.utilization_ratio),
    ("loadwatch_gpu_temperature_celsius", "GPU temperature.", lambda g: g.temperature_celsius),
    ("loadwatch_gpu_power_watts", "Power draw.", lambda g: g.power_watts),
)


def _gpus(pub: Published, snap: Snapshot) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        "loadwatch_gpu_info",
        "One per GPU; always 1.",
        labels=["gpu", "UUID", "name", "compute_capability"],
    )
    up = GaugeMetricFamily(
        "loadwatch_gpu_up", "1 if the GPU answered its last poll.", labels=["gpu", "UUID"]
    )
    families = {
        name: GaugeMetricFamily(name, doc, labels=["gpu", "UUID"]) for name, doc, _ in _GPU_GAUGES
    }
    ccs = pub.gpu_ccs
    for g in snap.gpus:
        labels = [str(g.index), g.uuid or ""]
        cc = ccs.get(g.index)
        info.add_metric([*labels, g.name or "", f"{cc[0]}.{cc[1]}" if cc else ""], 1.0)
        up.add_metric(labels, 1.0 if g.health == "ok" else 0.0)
        for name, _, get in _GPU_GAUGES:
            value = get(g)
            if value is not None:
                families[name].add_metric(labels, float(value))
    yield info
    yield up
    yield from families.values()
    per_gpu = CounterMetricFamily(
        "loadwatch_gpu_xid_events", "NVML Xid critical errors, all codes.", labels=["gpu", "UUID"]
    )
    for g in snap.gpus:
        per_gpu.add_metric([str(g.index), g.uuid or ""], g.xids_total)
    yield per_gpu
    xid = CounterMetricFamily(
        "loadwatch_gpu_xid_errors",
        "NVML Xid critical errors by code.",
        labels=["gpu", "UUID", "xid"],
    )
    for (index, uuid, code), n in sorted(
        pub.totals.xids.items(), key=lambda kv: (kv[0][0], kv[0][2])
    ):
        xid.add_metric([str(index), uuid or "", str(code)], n)
    yield xid


def _sources(pub: Published) -> Iterator[Metric]:
    up = GaugeMetricFamily("loadwatch_source_up", "1 if the source works.", labels=["source"])
    errors = CounterMetricFamily(
        "loadwatch_source_errors", "Errors of the source.", labels=["source"]
    )
    last = GaugeMetricFamily(
        "loadwatch_source_last_success_timestamp_seconds",
        "Last time the source worked.",
        labels=["source"],
    )
    if pub.log is not None:
        up.add_metric(["log"], 1.0 if pub.log.up else 0.0)
        errors.add_metric(["log"], pub.log.errors_total)
        if pub.log.last_success_ts is not None:
            last.add_metric(["log"], pub.log.last_success_ts)
    if pub.gpu is not None:
        up.add_metric(["gpu"], 1.0 if pub.gpu.up else 0.0)
        errors.add_metric(["gpu"], pub.gpu.errors_total)
        if pub.gpu.last_success_ts is not None:
            last.add_metric(["gpu"], pub.gpu.last_success_ts)
    if pub.supervisor is not None:
        up.add_metric(["vllm"], 1.0 if pub.supervisor.state in ("starting", "running") else 0.0)
        errors.add_metric(["vllm"], pub.supervisor.errors_total)
        if pub.supervisor.last_success_ts is not None:
            last.add_metric(["vllm"], pub.supervisor.last_success_ts)
    yield up
    yield errors
    yield last
    if pub.log is not None:
        state = GaugeMetricFamily(
            "loadwatch_log_state", "1 for the log file's state.", labels=["state"]
        )
        for name in LOG_STATES:
            state.add_metric([name], 1.0 if pub.log.state == name else 0.0)
        yield state
        for name, doc, value in (
            ("loadwatch_log_lines", "Log lines (records) read.", pub.log.lines_total),
            ("loadwatch_log_read_bytes", "Log bytes read.", pub.log.bytes_total),
            ("loadwatch_log_records_cut", "Records longer than the cap, cut.", pub.log.cuts_total),
            ("loadwatch_log_rotations", "Log rotations followed.", pub.log.rotations_total),
            ("loadwatch_log_truncations", "Log truncations followed.", pub.log.truncations_total),
        ):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c


def _health(snap: Snapshot) -> Iterator[Metric]:
    """The daemon's last /health probe, supervise or watch mode: the state holds it."""
    if snap.health is not None:
        yield from _gauge(
            "loadwatch_vllm_health_up",
            "1 if vLLM's /health answered 200 last.",
            1.0 if snap.health.ok else 0.0,
        )


def _supervisor(pub: Published) -> Iterator[Metric]:
    sup = pub.supervisor
    if sup is None:
        return
    g = GaugeMetricFamily(
        "loadwatch_vllm_state", "1 for the supervisor's current state.", labels=["state"]
    )
    for st in SUPERVISOR_STATES:
        g.add_metric([st], 1.0 if sup.state == st else 0.0)
    yield g
    c = CounterMetricFamily("loadwatch_vllm_starts", "vLLM processes started.")
    c.add_metric([], sup.starts_total)
    yield c
    c = CounterMetricFamily("loadwatch_vllm_exits", "vLLM process exits.", labels=["outcome"])
    for outcome in EXIT_OUTCOMES:
        c.add_metric([outcome], sup.exits.get(outcome, 0))
    yield c
    yield from _gauge(
        "loadwatch_vllm_orphans",
        "Processes of the last vLLM tree still holding GPU memory.",
        sup.orphans,
    )
