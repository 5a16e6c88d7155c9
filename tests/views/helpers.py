"""Builders for the views' tests: fixture logs folded into real snapshots, with simulated GPUs."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from loadwatch.daemon.sim.gpus import GIB, SimulatedGpuSource
from loadwatch.daemon.sources.inputs import ModelInfo, ShardInfo
from loadwatch.daemon.state.loadstate import Input, LoadState
from loadwatch.daemon.state.published import Published
from loadwatch.exporters.http.board import board_routes
from loadwatch.exporters.http.routes import BoardMaker
from loadwatch.exporters.http.server import Handler
from loadwatch.parsers import ChunkScanner, EventStream

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
# 2026-12-01 00:00 UTC (conftest sets TZ=UTC): yearless fixture times resolve before it.
REF_TS = 1796083200.0


def routes(
    published: Callable[[], Published | None],
    alive: Callable[[], bool],
    clock: Callable[[], float],
) -> dict[str, Handler]:
    """The daemon's routes served in-process, from a board rendered for each request."""
    maker = BoardMaker(clock)
    return board_routes(lambda: maker.make(published()), alive)


def events_of(data: bytes, ref_ts: float = REF_TS) -> list[object]:
    scanner = ChunkScanner(EventStream(ref_ts=ref_ts))
    out: list[object] = list(scanner.feed(data, 0))
    out.extend(scanner.stream.flush())
    return out


def cut_after(name: str, needle: bytes) -> bytes:
    """The fixture up to the end of the first line holding `needle`: a load seen mid-way."""
    data = (FIXTURES / name).read_bytes()
    i = data.index(needle)
    return data[: data.index(b"\n", i) + 1]


def model_of(shards: int, shard_bytes: int = 5 * GIB, kv: str | None = None) -> ModelInfo:
    infos = tuple(
        ShardInfo(f"model-{i + 1:05d}-of-{shards:05d}.safetensors", shard_bytes)
        for i in range(shards)
    )
    return ModelInfo(
        path="/models/test", shards=infos, total_bytes=shards * shard_bytes, checkpoint_kv_dtype=kv
    )


def fold_log(
    data: bytes,
    *,
    model: ModelInfo | None = None,
    gpus: SimulatedGpuSource | None = None,
    clock: list[float] | None = None,
    poll_every_s: float = 2.0,
    extra: list[tuple[float, Input]] | None = None,
) -> tuple[LoadState, float]:
    """Fold the log at its own times; between events, poll `gpus` every `poll_every_s` with
    the simulated clock (`clock[0]`) set to the poll time. Returns the state and the last time."""
    st = LoadState()
    events = events_of(data)
    first = next(e.ts for e in events if getattr(e, "ts", None) is not None)  # type: ignore[attr-defined]
    if model is not None:
        st = st.apply(model, first)
    now = first
    next_poll = first
    for ev in events:
        t = ev.ts if ev.ts is not None else now  # type: ignore[attr-defined]
        while gpus is not None and clock is not None and next_poll <= t:
            clock[0] = next_poll
            st = st.apply(gpus.poll(), next_poll)
            next_poll += poll_every_s
        now = max(now, t)
        st = st.apply(ev, t)  # type: ignore[arg-type]
    for at, item in extra or []:
        st = st.apply(item, at)
        now = max(now, at)
    if gpus is not None and clock is not None:
        clock[0] = now
        st = st.apply(gpus.poll(), now)
    return st, now


def linear_progress(
    start: float, seconds: float, clock: list[float], scale: float = 1.0
) -> Callable[[], float]:
    """The simulated GPUs' load progress: linear in time from `start`, times `scale`."""
    return lambda: min(max((clock[0] - start) / seconds * scale, 0.0), 1.0)


def _stamp(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


def _mmss(s: float) -> str:
    m, sec = divmod(int(s), 60)
    return f"{m:02d}:{sec:02d}"


def synth_load_log(
    t0: float,
    *,
    shards: int = 119,
    every_s: float = 8.0,
    upto: int = 60,
    kv_fp8: bool = False,
    scale_layers: int = 0,
    after: tuple[str, ...] = (),
) -> bytes:
    """A vLLM 0.15-style start-up log up to `upto` of `shards` shards, one every `every_s`
    seconds: the weights bar as vLLM writes it (`\\r` after the prefix, one line per update).
    `after` adds post-load lines once the bar is done: "weights_loaded", "model_memory"."""
    api, worker = "(APIServer pid=51001) ", "(Worker_TP0 pid=51300) "
    lines = [f"{api}INFO {_stamp(t0)} [api_server.py:1272] vLLM API server version 0.15.1\n"]
    if kv_fp8:
        lines.append(
            f"{api}INFO {_stamp(t0 + 2)} [cache.py:190] Using fp8 data type to store kv cache. "
            "It reduces the GPU memory footprint and boosts the performance. Meanwhile, it may "
            "cause accuracy drop without a proper scaling factor\n"
        )
    start = t0 + 40
    lines.append(
        f"{worker}INFO {_stamp(start)} [gpu_model_runner.py:4033] Starting to load model "
        "/models/Kimi-K2.5-NVFP4...\n"
    )
    desc = "Loading safetensors checkpoint shards"
    for n in range(upto + 1):
        el = n * every_s
        if n == 0:
            tail = "[00:00<?, ?it/s]"
        else:
            rem = (shards - n) * every_s
            tail = f"[{_mmss(el)}<{_mmss(rem)}, {every_s:.2f}s/it]"
        pct = 100 * n / shards
        lines.append(f"{worker}\r{desc}: {pct:3.0f}% Completed | {n}/{shards} {tail}\n")
        if n == 1:
            for layer in range(scale_layers):
                for s in ("k", "v"):
                    lines.append(
                        f"{worker}WARNING {_stamp(start + el)} [weight_utils.py:1398] Found "
                        f"{s}_scale in the checkpoint (e.g. model.layers.{layer}.self_attn."
                        f"{s}_scale), but not found the expected name in the model (e.g. "
                        f"model.layers.{layer}.self_attn.attn.{s}_scale). {s}_scale is not "
                        "loaded.\n"
                    )
    end = start + upto * every_s
    if "weights_loaded" in after or "model_memory" in after:
        lines.append(
            f"{worker}INFO {_stamp(end + 1)} [default_loader.py:291] Loading weights took "
            f"{upto * every_s:.2f} seconds\n"
        )
    if "model_memory" in after:
        lines.append(
            f"{worker}INFO {_stamp(end + 2)} [gpu_model_runner.py:4130] Model loading took "
            f"72.05 GiB memory and {upto * every_s + 2:.2f} seconds\n"
        )
    return "".join(lines).encode()


def shutdown_lines(t: float) -> bytes:
    """What vLLM 0.32 logs when it is stopped with SIGTERM."""
    api = "(APIServer pid=51001) "
    return (
        f"{api}INFO {_stamp(t)} [launcher.py:254] [shutdown] API server: shutdown triggered\n"
        f"{api}INFO:     Shutting down\n"
        f"{api}INFO:     Application shutdown complete.\n"
    ).encode()


def synth_crash(t0: float, *, upto: int, shards: int = 119) -> bytes:
    """A start that loads `upto` shards and dies of a CUDA OOM in a worker."""
    t = t0 + 40 + upto * 8.0 + 2
    w = f"(Worker_TP0 pid={51300 + int(t0) % 1000}) ERROR {_stamp(t)} [multiproc_executor.py:772] "
    return (
        synth_load_log(t0, shards=shards, upto=upto)
        + (
            f"{w}WorkerProc hit an exception.\n"
            f"{w}Traceback (most recent call last):\n"
            f'{w}  File "/usr/lib/python3/vllm/model_executor/model_loader.py", line 50, in load\n'
            f"{w}    param.data.copy_(loaded_weight)\n"
            f"{w}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 95.00 GiB of which 1.00 GiB is free.\n"
        ).encode()
    )


def write_log(path: Path, data: bytes, mtime: float = REF_TS) -> Path:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def model_dir_with(path: Path, sizes: list[int], kv_fp8: bool = False) -> Path:
    """A checkpoint directory with sparse shard files of `sizes` bytes (no disk used)."""
    path.mkdir(parents=True)
    n = len(sizes)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for name, size in zip(names, sizes, strict=True):
        with open(path / name, "wb") as fh:
            fh.truncate(size)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    (path / "config.json").write_text(json.dumps(config))
    index = {
        "metadata": {"total_size": sum(sizes)},
        "weight_map": {f"model.layers.{i}.weight": name for i, name in enumerate(names)},
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    if kv_fp8:
        quant = {
            "producer": {"name": "modelopt"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"},
        }
        (path / "hf_quant_config.json").write_text(json.dumps(quant))
    return path
