"""A simulated `/proc/PID/io` for the nodes of a multi-node test: the bytes the vLLM processes
have read follow a progress function (0..1) times the bytes this node must read. It stands
behind the same interface as ProcIoReader (`read_many(roots) -> IoSample`), so the daemon's
sampling loop, the state and the exporters run unchanged."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from loadwatch.daemon.sources.inputs import IoSample


class SimulatedProcIo:
    def __init__(
        self,
        progress: Callable[[], float],
        node_bytes: int,
        *,
        base_bytes: int = 64 << 20,  # what the processes read before the weights (Python, CUDA)
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._progress = progress
        self._node_bytes = node_bytes
        self._base = base_bytes
        self._clock = clock
        self.reads = 0

    def read_many(self, roots: Sequence[int]) -> IoSample:
        self.reads += 1
        frac = min(max(self._progress(), 0.0), 1.0)
        done = self._base + int(frac * self._node_bytes)
        return IoSample(ts=self._clock(), read_bytes=done, pids=len(roots), rchar=done)


__all__ = ["SimulatedProcIo"]
