"""A load's progress as one node sees it, with or without the weights bar.

Only global rank 0 prints the bar, so every other node of a multi-node deployment sees none.
Two signals stand in for it, and check it where it is printed:
- the bytes the vLLM process tree has read (`/proc/<pid>/io` `read_bytes`: what the kernel
  fetched from storage, mmap faults included; `rchar` when the page cache serves the reads and
  `read_bytes` stays flat), against what this node must read: the checkpoint's size (model
  directory, else the `Checkpoint size: N GiB` line) times the node's share (node.py);
- the memory each local GPU has gained since the load began, against its part of the weights.
The node's progress is the further of the two (each misses what the other sees: a warm cache
reads nothing, a CPU-staged load fills the GPU late). From its history: an ETA with a range
(the rates of the last `RECENT_S` and of the whole history bound it), and a stall when neither
signal moved for the stall window. On the head the same signals run beside the bar; a bar that
moves while nothing is read or placed is `bar_unbacked`.

The record is per vLLM session (it restarts with the session) and is folded by the state
(loadstate.py) from the inputs it already takes: IoSample, GpuReading, Milestone, ModelInfo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

GIB = 1 << 30
HISTORY = 96  # progress points kept (at least MIN_STEP_S apart)
MIN_STEP_S = 0.5
RECENT_S = 15.0
GPU_MOVE_BYTES = 64 << 20  # a GPU gaining this much has moved
BAR_AHEAD = 0.25  # the bar this far ahead of both signals: unbacked


@dataclass(frozen=True, slots=True)
class NodeLoad:
    session: int | None = None
    started_at: float | None = None
    io_first: int | None = None
    io_last: int | None = None
    rchar_first: int | None = None
    rchar_last: int | None = None
    io_moved_at: float | None = None
    io_mark: int = 0  # bytes (read or rchar, the larger) at the last move
    gpu_base: Mapping[int, int] = field(default_factory=dict)  # used bytes when the load began
    gpu_used: Mapping[int, int] = field(default_factory=dict)
    gpu_moved_at: float | None = None
    gpu_mark: int = 0  # summed gain at the last move
    weights_done: bool = False  # `Loading weights took` was logged (once per node)
    checkpoint_gib: float | None = None  # the `Checkpoint size:` line
    history: tuple[tuple[float, float], ...] = ()  # (t, progress)

    def restart(self, session: int | None, at: float) -> NodeLoad:
        return NodeLoad(session=session, started_at=at)

    def with_io(self, at: float, read_bytes: int, rchar: int | None, move_bytes: int) -> NodeLoad:
        first = self.io_first if self.io_first is not None else read_bytes
        rfirst = self.rchar_first if self.rchar_first is not None or rchar is None else rchar
        if self.io_last is not None and read_bytes < self.io_last:  # the tree changed
            first = read_bytes - (self.io_last - first)
        new = replace(
            self,
            io_first=first,
            io_last=read_bytes,
            rchar_first=rfirst,
            rchar_last=rchar if rchar is not None else self.rchar_last,
            started_at=self.started_at if self.started_at is not None else at,
        )
        moved = new.io_gained()
        if self.io_moved_at is None or moved - self.io_mark >= move_bytes:
            new = replace(new, io_moved_at=at, io_mark=moved)
        return new

    def io_gained(self) -> int:
        read = (
            (self.io_last - self.io_first)
            if self.io_last is not None and self.io_first is not None
            else 0
        )
        rchar = 0
        if self.rchar_last is not None and self.rchar_first is not None:
            rchar = self.rchar_last - self.rchar_first
        # the cache serves what storage does not: the larger of the two (rchar misses mmap
        # faults, read_bytes misses cache hits)
        return max(read, rchar, 0)

    def with_gpus(self, at: float, used: Mapping[int, int]) -> NodeLoad:
        base = dict(self.gpu_base)
        for i, b in used.items():
            base.setdefault(i, b)
        new = replace(
            self,
            gpu_base=base,
            gpu_used=dict(used),
            started_at=self.started_at if self.started_at is not None else at,
        )
        gain = new.gpu_gained()
        if self.gpu_moved_at is None or abs(gain - self.gpu_mark) >= GPU_MOVE_BYTES:
            new = replace(new, gpu_moved_at=at, gpu_mark=gain)
        return new

    def gpu_gained(self) -> int:
        return sum(max(u - self.gpu_base.get(i, u), 0) for i, u in self.gpu_used.items())

    def with_point(self, at: float, progress: float | None) -> NodeLoad:
        if progress is None:
            return self
        h = self.history
        if h and at - h[-1][0] < MIN_STEP_S:
            return self
        return replace(self, history=(*h, (at, progress))[-HISTORY:])


@dataclass(frozen=True, slots=True)
class NodeProgressView:
    """This node's load, from its own signals (None: not known)."""

    loading: bool  # a load is under way on this node
    expected_bytes: int | None  # what this node must read
    read_bytes: int | None  # read since the load began (read_bytes, or rchar from the cache)
    io_ratio: float | None
    gpu_gained_bytes: int | None
    gpu_ratio: float | None
    bar_ratio: float | None  # the weights bar, where this node prints it
    ratio: float | None  # the node's progress: the bar where printed, else the signals'
    signal_ratio: float | None  # the further of io_ratio and gpu_ratio (1 once weights are done)
    eta_s: float | None
    eta_low_s: float | None
    eta_high_s: float | None
    stalled: bool  # loading, and neither signal moved for the stall window
    stalled_for_s: float | None
    bar_unbacked: bool  # the bar runs far ahead of what was read and placed
    weights_done: bool


def _clip(x: float) -> float:
    return min(max(x, 0.0), 1.0)


def _rate(history: tuple[tuple[float, float], ...], since: float) -> float | None:
    pts = [p for p in history if p[0] >= since]
    if len(pts) < 2 or pts[-1][0] - pts[0][0] <= 0:
        return None
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def progress_view(
    load: NodeLoad,
    *,
    now: float,
    loading: bool,
    checkpoint_bytes: int | None,
    share: float,
    local_gpus: int,
    bar_ratio: float | None,
    stall_window_s: float,
) -> NodeProgressView:
    total = checkpoint_bytes
    if total is None and load.checkpoint_gib is not None:
        total = int(load.checkpoint_gib * GIB)
    expected = int(total * share) if total else None
    read = load.io_gained() if load.io_last is not None else None
    io_ratio = _clip(read / expected) if expected and read is not None else None
    gained = load.gpu_gained() if load.gpu_used else None
    gpu_ratio = None
    if expected and gained is not None and local_gpus > 0 and load.gpu_used:
        per_gpu = expected / local_gpus
        gpu_ratio = _clip(
            sum(
                min(max(u - load.gpu_base.get(i, u), 0) / per_gpu, 1.0)
                for i, u in load.gpu_used.items()
            )
            / max(len(load.gpu_used), 1)
        )
    signals = [r for r in (io_ratio, gpu_ratio) if r is not None]
    # A signal at its end while another still moves says nothing more (GPU memory past the
    # weights' share: buffers, a CUDA context bigger than thought): the moving one tells.
    moving = [r for r in signals if r < 1.0]
    own = max(moving) if moving else (1.0 if signals else None)
    if load.weights_done:
        own = 1.0
    ratio = bar_ratio if bar_ratio is not None else own
    eta = low = high = None
    if loading and own is not None and own < 1.0:
        long = _rate(load.history, now - 1e9)
        recent = _rate(load.history, now - RECENT_S)
        rates = [r for r in (long, recent) if r is not None and r > 0]
        if rates:
            left = 1.0 - own
            eta = left / (sum(rates) / len(rates))
            low = left / max(rates)
            high = left / min(rates)
    moved = [t for t in (load.io_moved_at, load.gpu_moved_at, load.started_at) if t is not None]
    last = max(moved) if moved else None
    quiet = now - last if last is not None else None
    stalled = bool(
        loading and quiet is not None and quiet >= stall_window_s and own is not None and own < 1.0
    )
    unbacked = bool(
        bar_ratio is not None
        and own is not None
        and not load.weights_done
        and bar_ratio - own > BAR_AHEAD
    )
    return NodeProgressView(
        loading=loading,
        expected_bytes=expected,
        read_bytes=read,
        io_ratio=io_ratio,
        gpu_gained_bytes=gained,
        gpu_ratio=gpu_ratio,
        bar_ratio=bar_ratio,
        ratio=ratio,
        signal_ratio=own,
        eta_s=eta,
        eta_low_s=low,
        eta_high_s=high,
        stalled=stalled,
        stalled_for_s=quiet if stalled else None,
        bar_unbacked=unbacked,
        weights_done=load.weights_done,
    )


__all__ = ["NodeLoad", "NodeProgressView", "progress_view"]
