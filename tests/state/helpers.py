"""Small builders for the fold's inputs, so tests read as event lists."""

from __future__ import annotations

from typing import Any

from loadwatch.daemon.sources.inputs import (
    GpuReading,
    GpuSample,
    IoSample,
    ModelInfo,
    ProcessEvent,
    ShardInfo,
)
from loadwatch.daemon.state.loadstate import Input, LoadState, StateConfig, run
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.parsers.events import Failure, Milestone, ShardProgress
from loadwatch.parsers.vllm.catalog import failure

T0 = 1_763_000_000.0
GIB = 1024**3
DESC = "Loading safetensors checkpoint shards"


def bar(
    done: int,
    total: int,
    process: str | None = "Worker_TP0",
    kind: str = "weights",
    desc: str = DESC,
    remaining_s: float | None = None,
    elapsed_s: float | None = None,
    rate_per_s: float | None = None,
) -> ShardProgress:
    return ShardProgress(
        desc=desc,
        bar=kind,  # type: ignore[arg-type]
        done=done,
        total=total,
        remaining_s=remaining_s,
        elapsed_s=elapsed_s,
        rate_per_s=rate_per_s,
        process=process,
    )


def ms(kind: str, **kw: Any) -> Milestone:
    return Milestone(kind=kind, **kw)  # type: ignore[arg-type]


def fail(kind: str, message: str, process: str | None = "EngineCore_0", **kw: Any) -> Failure:
    """A failure as the grammar makes it (it says which are consequences, what wrappers carry)."""
    return failure(kind=kind, message=message, process=process, **kw)


def started(
    t: float, pid: int = 100, argv: tuple[str, ...] = ("vllm", "serve", "m")
) -> ProcessEvent:
    return ProcessEvent(kind="started", ts=t, pid=pid, argv=argv)


def exited(
    t: float, pid: int = 100, code: int | None = 0, signal: int | None = None
) -> ProcessEvent:
    return ProcessEvent(kind="exited", ts=t, pid=pid, exit_code=code, signal=signal)


def model(sizes: list[int], kv: str | None = None) -> ModelInfo:
    shards = tuple(ShardInfo(f"model-{i:05d}.safetensors", s) for i, s in enumerate(sizes))
    return ModelInfo(path="/m", shards=shards, total_bytes=sum(sizes), checkpoint_kv_dtype=kv)


def gpu(t: float, used: float, total: float = 80 * GIB, n: int = 1) -> GpuReading:
    return GpuReading(
        ts=t,
        samples=tuple(
            GpuSample(
                index=i,
                health="ok",
                memory_used_bytes=int(used),
                memory_total_bytes=int(total),
                sampled_at=t,
            )
            for i in range(n)
        ),
    )


def io(t: float, read_bytes: int) -> IoSample:
    return IoSample(ts=t, read_bytes=read_bytes, pids=2)


def fold(
    items: list[tuple[float, Input]],
    state: LoadState | None = None,
    *,
    replay: bool = False,
    **cfg: Any,
) -> tuple[LoadState, list[Transition]]:
    st = state if state is not None else LoadState(config=StateConfig(**cfg))
    return run(items, st, replay=replay)


def kinds(transitions: list[Transition]) -> list[str]:
    return [t.kind for t in transitions]


def phases(transitions: list[Transition]) -> list[str | None]:
    return [t.phase_to for t in transitions if t.kind == "phase"]
