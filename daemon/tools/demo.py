"""`loadwatch demo`: the main job on an embedded default, in about two minutes.

It builds, in a temporary directory, a Kimi-K2.5-NVFP4-shaped checkpoint (119 shards adding up
to 540 GB, as sparse files that take no disk), then runs the real daemon supervising the
simulated vLLM of simvllm.py over eight simulated Blackwell GPUs (SM120, 96 GiB) whose memory
grows with the load. The status screen updates live (on a pipe: a plain status line per
update); /metrics and /status are served on localhost meanwhile. At the end it prints the post-mortem (`loadwatch analyze`) of the log.

Scenarios: success (two starts of the model: the first is learned, then the demo has the
supervisor start vLLM again, and the second start shows from its first line the ETA to ready the
first one taught; demo_starts.py), stall, oom, crash-loop, fp8-kv-on-sm120 (preflight flags the
FP8 KV cache, the start fails as vLLM does on SM120, the supervisor's `fp8_kv_unsupported` remedy
keeps the KV cache in the model dtype, showing what that costs in KV tokens, and the restart
loads; with `--remedy-fp8 patch`, the default, it drops the checkpoint's FP8 KV declaration and
the demo puts the files back afterwards with `patch-model --revert`, byte for byte; `flag` starts
with `--kv-cache-dtype bfloat16` instead). `--real` supervises real vLLM on the CPU with a tiny
model instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    LogConfig,
    VllmConfig,
    parse_listen,
)
from loadwatch.daemon.config import HttpConfig as _Http
from loadwatch.daemon.tools.demo_fp8 import config_files, revert_patch, show_remedies
from loadwatch.daemon.tools.demo_starts import TwoStarts
from loadwatch.daemon.tools.ports import free_port

GIB = 1 << 30
EX_SOFTWARE = 70  # the demo itself went wrong, not the load it plays
KIMI_SHARDS = 119
KIMI_TOTAL_BYTES = 540 * 10**9
SIM_GPU_BYTES = 96 * GIB
FP8_SCENARIO = "fp8-kv-on-sm120"

KIMI_CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "first_k_dense_replace": 1,
    "num_key_value_heads": 64,
    "vocab_size": 163840,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}


def make_model_dir(
    root: Path, *, fp8_kv: bool, shards: int = KIMI_SHARDS, total_bytes: int = KIMI_TOTAL_BYTES
) -> Path:
    """A checkpoint directory vLLM's loader would take for Kimi-K2.5-NVFP4 (sparse shards)."""
    model = root / "Kimi-K2.5-NVFP4"
    model.mkdir(parents=True, exist_ok=True)
    quant: dict[str, Any] = {
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    }
    if fp8_kv:
        quant["kv_cache_quant_algo"] = "FP8"
    (model / "hf_quant_config.json").write_text(
        json.dumps(
            {"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": quant}, indent=4
        )
        + "\n"
    )
    (model / "config.json").write_text(json.dumps(KIMI_CONFIG, indent=2) + "\n")
    # The first shard holds the embeddings and is larger, the rest are even.
    first = total_bytes // shards * 3 // 2
    rest = (total_bytes - first) // (shards - 1)
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for i, name in enumerate(names):
        with open(model / name, "wb") as f:
            f.truncate(first if i == 0 else rest)
    # The tensor names the memory plan tells apart (embeddings, lm_head, MLA's latent
    # projections, the router, the experts), layer by layer across the shards.
    layers = int(KIMI_CONFIG["num_hidden_layers"])
    weight_map = {"language_model.model.embed_tokens.weight": names[0]}
    for layer in range(layers):
        pre = f"language_model.model.layers.{layer}"
        for part in ("self_attn.kv_a_proj_with_mqa", "self_attn.q_a_proj", "mlp.gate"):
            weight_map[f"{pre}.{part}.weight"] = names[layer * shards // layers]
    for j, name in enumerate(names):  # every shard holds experts of the layer it falls in
        weight_map[f"language_model.model.layers.{j * layers // shards}.mlp.experts.{j}.w1"] = name
    weight_map["language_model.lm_head.weight"] = names[-1]
    index = {"metadata": {"total_size": first + rest * (shards - 1)}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return model


def demo_config(
    root: Path, model: Path, scenario: str, speed: float, listen: str, remedy_fp8: str = "patch"
) -> Config:
    host, port = parse_listen(listen)
    vllm_port = free_port()
    argv = (
        sys.executable,
        "-m",
        "loadwatch.daemon.sim.vllm_server",
        "--model",
        str(model),
        "--tensor-parallel-size",
        "8",
        "--port",
        str(vllm_port),
        "--scenario",
        scenario,
        "--speed",
        str(speed),
    )
    return Config(
        log=LogConfig(path=root / "vllm.log", poll_interval_s=0.1),
        http=_Http(host=host, port=port),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.5),
        forecast=ForecastConfig(stall_factor=4.0, stall_floor_s=max(3.0, 60.0 / speed)),
        vllm=VllmConfig(
            argv=argv,
            env={"PYTHONUNBUFFERED": "1"},
            # an OOM comes back the same way: the demo shows the failure, not a futile restart
            restart="never" if scenario == "oom" else "on-failure",
            backoff_initial_s=2.0,
            backoff_max_s=8.0,
            crash_loop_starts=3,
            crash_loop_window_s=120.0,
            stop_grace_s=5.0,
            preflight="warn",
            health_url=f"http://127.0.0.1:{vllm_port}/health",
            remedies=("fp8_kv_unsupported",) if scenario == FP8_SCENARIO else (),
            remedy_fp8=remedy_fp8,
        ),
        state_dir=root / "state",
        events_file=root / "events.jsonl",
    )


def demo_command(args: argparse.Namespace) -> int:
    if args.real:
        return _real(args)
    root = Path(tempfile.mkdtemp(prefix="loadwatch-demo-"))
    keep = bool(getattr(args, "keep", False))
    try:
        model = make_model_dir(root, fp8_kv=args.scenario == FP8_SCENARIO)
        remedy_fp8 = str(getattr(args, "remedy_fp8", None) or "patch")
        cfg = demo_config(root, model, args.scenario, args.speed, args.listen, remedy_fp8)
        return run_demo(cfg, model, args.scenario, screen=not args.no_screen, keep=keep)
    finally:
        _leave(root, keep)


def _leave(root: Path, keep: bool) -> None:
    if keep:
        print(f"kept: {root} (vllm.log, events.jsonl, the model directory)")
    else:
        shutil.rmtree(root, ignore_errors=True)


def run_demo(
    cfg: Config,
    model: Path,
    scenario: str,
    *,
    screen: bool = True,
    simulated_gpus: bool = True,
    keep: bool = False,
) -> int:
    """Play the scenario; the exit code is the post-mortem's verdict (0 ready, 1 failed,
    2 incomplete), as `loadwatch analyze` gives it, or 70 when the scenario did not play out."""
    from loadwatch.daemon.app import run_daemon
    from loadwatch.daemon.sim.gpus import SimulatedGpuSource
    from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
    from loadwatch.exporters.terminal.console import CleanConsole

    # whatever the log or the daemon says is shown on the terminal, never obeyed
    console = CleanConsole()
    originals = config_files(model) if scenario == FP8_SCENARIO else {}
    final = int(SIM_GPU_BYTES * (1.12 if scenario == "oom" else 0.86))
    end = _Ending(scenario)
    result: dict[str, Any] = {}

    def gpu_factory(progress: Callable[[], float]) -> GuardedGpuSource:
        return GuardedGpuSource(
            SimulatedGpuSource(8, progress=progress, final_used_bytes=final), deadline_s=1.0
        )

    def on_started(daemon: Any, server: Any) -> None:
        result["url"] = server.url
        watcher = threading.Thread(
            target=_watch, args=(daemon, server, model, end, console, screen), daemon=True
        )
        watcher.start()

    # The event log goes to its file; the screen is the output, or without a screen a digest of
    # the transitions.
    with open(os.devnull, "w") as devnull:
        code = run_daemon(
            cfg,
            on_started=on_started,
            stdout=devnull if screen else Digest(console),
            gpu_factory=gpu_factory if simulated_gpus else None,
        )
    if code != 0:
        return code
    console.print()
    if end.starts is not None and (said := end.starts.summary()) is not None:
        console.print(said, highlight=False, soft_wrap=True)
    console.rule("post-mortem: loadwatch analyze")
    from loadwatch.daemon.tools.analyze import analyze_command

    verdict = analyze_command(
        Path(str(cfg.log.path)), model_dir=model, as_json=False, max_record_bytes=65536
    )
    gone = "kept with --keep" if keep else "removed with the demo directory; --keep keeps it"
    console.print(f"\nevent log: {cfg.events_file}  ({gone})")
    if scenario == FP8_SCENARIO and cfg.vllm is not None and cfg.vllm.remedy_fp8 == "patch":
        end.outcome_ok &= revert_patch(model, originals, console)
    if not end.outcome_ok:
        console.print(f"the {scenario} scenario did not play out as it should", style="bold red")
        return EX_SOFTWARE
    return verdict


class Digest:
    """A stdout for the event log that prints one line per transition and supervisor event."""

    KEEP = ("transition.", "vllm.", "preflight", "gpu.xid", "gpu.orphans", "daemon.problem")

    def __init__(self, console: Any) -> None:
        self.console = console

    def write(self, text: str) -> int:
        for line in text.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            event = str(doc.pop("event", ""))
            if not event.startswith(self.KEEP):
                continue
            for noise in ("time", "at", "session", "argv", "report"):
                doc.pop(noise, None)
            detail = " ".join(f"{k}={v}" for k, v in doc.items() if v is not None)
            self.console.print(
                f"{time.strftime('%H:%M:%S')} {event} {detail}", highlight=False, soft_wrap=True
            )
        return len(text)

    def flush(self) -> None:
        pass


class _Ending:
    """When the demo has shown what its scenario is about."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.since: float | None = None
        self.remedies_shown = 0
        self.outcome_ok = False
        # success plays two starts of the model: the second's ETA to ready is learned
        self.starts = TwoStarts() if scenario == "success" else None

    def done(self, snap: Any, sup_state: str) -> bool:
        s = snap.session
        phase = s.phase if s is not None else None
        hit = False
        if self.starts is not None:
            hit = self.starts.done
        elif self.scenario == FP8_SCENARIO:
            hit = phase == "ready"
        elif self.scenario == "stall":
            hit = phase == "stalled"
        elif self.scenario == "oom":
            hit = phase == "failed"
        elif self.scenario == "crash-loop":
            hit = sup_state == "fatal"
        if hit and self.since is None:
            self.since = time.monotonic()
            self.outcome_ok = True
        return self.since is not None and time.monotonic() - self.since > 4.0


def _watch(daemon: Any, server: Any, model: Path, end: _Ending, console: Any, screen: bool) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from loadwatch.exporters.terminal.watch import render_status

    header = Text.from_markup(
        f"[bold]loadwatch demo[/] ({end.scenario})  metrics: {server.url}/metrics  "
        f"status: {server.url}/status  ready: {server.url}/readyz"
    )
    deadline = time.monotonic() + 600
    # Not a terminal (`loadwatch demo | tee f`): rich's live screen would show only its last
    # frame, at the end; a plain line per update instead, as the load goes.
    plain = screen and not console.is_terminal
    if plain:
        console.print(header.plain, highlight=False, soft_wrap=True)
    last, printed_at = "", 0.0
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        if not screen or plain:
            live.stop()
        while time.monotonic() < deadline:
            daemon.loop_call(daemon.publisher.want)  # (counters are published when read)
            time.sleep(0.25)
            pub = daemon.published
            if pub is None:
                continue
            snap = pub.snapshot(time.time())
            if plain:  # a line when the phase moves, else at most one a second
                line, now = status_line(snap), time.monotonic()
                moved = line.split("  ")[0] != last.split("  ")[0]
                if line != last and (moved or now - printed_at >= 1.0):
                    console.print(
                        f"{time.strftime('%H:%M:%S')} {line}", highlight=False, soft_wrap=True
                    )
                    last, printed_at = line, now
            elif screen:
                live.update(Group(header, render_status(snap.to_dict(), width=console.width)))
            sup = daemon.supervisor
            state = str(sup.state) if sup is not None else ""
            if end.starts is not None and sup is not None:
                end.starts.see(snap, partial(_start_again, daemon, sup))
            end.remedies_shown = show_remedies(snap, end.remedies_shown, console)
            if end.done(snap, state):
                break
    daemon.loop_call(daemon.stop_event.set)


def _start_again(daemon: Any, sup: Any, why: str) -> None:
    """Have the supervisor end vLLM and start it again (on the daemon's loop)."""
    daemon.loop_call(lambda: sup.request_restart(why))


def status_line(snap: Any) -> str:
    """The load in one plain line: phase, weights, ETA, stall, the fullest GPU's memory."""
    s = snap.session
    parts = [snap.phase or "waiting for vLLM"]
    if s is not None:
        p = s.progress
        if p.shards_total:
            ratio = p.ratio if p.ratio is not None else (p.shards_done or 0) / p.shards_total
            parts.append(f"{100 * ratio:.1f}% {p.shards_done or 0}/{p.shards_total} shards")
        if p.eta is not None and s.phase in ("starting", "loading_weights", "stalled"):
            parts.append(f"ETA {p.eta.remaining_s:.0f}s")
        e = s.startup_eta
        if e is not None:
            parts.append(
                f"ready in {e.remaining_s:.0f}s ({e.remaining_low_s:.0f}-{e.remaining_high_s:.0f}s)"
            )
        if s.stall.active:
            parts.append(f"STALLED: {s.stall.reason or 'no progress'}")
    used = [g for g in snap.gpus if g.memory_used_bytes is not None and g.memory_total_bytes]
    if used:
        top = max(used, key=lambda g: g.memory_used_bytes)
        parts.append(
            f"GPU memory {top.memory_used_bytes / GIB:.1f}/{top.memory_total_bytes / GIB:.1f} GiB"
        )
    return "  ".join(parts)


def _real(args: argparse.Namespace) -> int:
    """Real vLLM on the CPU with the tiny DeepSeek-style model of tests/realvllm (from a clone)."""
    import subprocess

    vllm_python = (
        Path(
            os.environ.get("LOADWATCH_VLLM_VENV", str(Path.home() / ".cache/loadwatch/vllm-0.32.0"))
        )
        / "bin"
        / "python"
    )
    builder = Path.cwd() / "tests" / "realvllm" / "tinymodel.py"
    if not vllm_python.exists():
        print(
            f"loadwatch: no vLLM environment at {vllm_python.parent.parent}: run `make vllm` first",
            file=sys.stderr,
        )
        return 69
    if not builder.exists():
        print(
            "loadwatch: --real needs a loadwatch clone (tests/realvllm/tinymodel.py); run it from there",
            file=sys.stderr,
        )
        return 66
    root = Path(tempfile.mkdtemp(prefix="loadwatch-demo-real-"))
    try:
        model = root / "tiny-deepseek"
        subprocess.run(
            [
                str(vllm_python),
                str(builder),
                str(model),
                "--shards",
                "12",
                "--shard-mb",
                "100",
                "--kv-scales",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        host, port = parse_listen(args.listen)
        vllm_port = free_port()
        work = root / "work"
        work.mkdir()
        argv = (
            str(vllm_python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--enforce-eager",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "4",
            "--host",
            "127.0.0.1",
            "--port",
            str(vllm_port),
        )
        env = {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(work),
            "TORCHINDUCTOR_CACHE_DIR": str(work),
            "TMPDIR": str(work),
        }
        cfg = Config(
            log=LogConfig(path=root / "vllm.log", poll_interval_s=0.1),
            http=_Http(host=host, port=port),
            gpu=GpuConfig(source="none"),
            vllm=VllmConfig(
                argv=argv,
                env=env,
                crash_loop_starts=2,
                stop_grace_s=20.0,
                preflight="warn",
                health_url=f"http://127.0.0.1:{vllm_port}/health",
            ),
            state_dir=root / "state",
            events_file=root / "events.jsonl",
        )
        return run_demo(
            cfg,
            model,
            "success",
            screen=not args.no_screen,
            simulated_gpus=False,
            keep=bool(getattr(args, "keep", False)),
        )
    finally:
        _leave(root, bool(getattr(args, "keep", False)))
