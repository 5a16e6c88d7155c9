"""What the loop publishes for the exporters: an immutable bundle, swapped in one assignment.

The HTTP threads (/metrics, /status, /readyz) read `Daemon.published` and never touch the live
loop. `LoadState` is itself immutable, so a snapshot can be built on any thread; the bundle keeps
the last one for a moment so a burst of scrapes builds it once.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loadwatch.daemon.sources.gpu.guard import GpuSourceHealth
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.snapshot import Snapshot

SNAPSHOT_REUSE_S = 0.1


@dataclass(frozen=True)
class Totals:
    """Counts over the daemon's life (a session's own counts are in the snapshot)."""

    warnings: Mapping[str, int] = field(default_factory=dict)  # by warning code
    failures: Mapping[str, int] = field(default_factory=dict)  # by kind; one crash counts once
    stalls: int = 0
    events: Mapping[str, int] = field(default_factory=dict)  # parsed events by type
    xids: Mapping[tuple[int, str | None, int], int] = field(default_factory=dict)
    gpu_errors: int = 0

    @classmethod
    def of(cls, state: LoadState, snap: Snapshot) -> Totals:
        """The state's lifetime counts: the sessions before the current one (its `lifetime`,
        kept as each session ended) plus the current one (`snap`'s), and its own counts."""
        life = state.lifetime
        warnings = Counter(life.warnings)
        failures = Counter(life.failures)
        stalls = life.stalls
        view = snap.session
        if view is not None:
            for w in view.warnings:
                warnings[w.code] += w.count
            if view.failure_kind is not None:
                failures[view.failure_kind] += 1
            stalls += view.stall.stalls_total
        return cls(
            warnings=dict(warnings),
            failures=dict(failures),
            stalls=stalls,
            events=state.events,
            xids=state.xids,
        )


@dataclass(frozen=True)
class LogHealth:
    up: bool
    file_exists: bool
    lines_total: int
    bytes_total: int
    cuts_total: int
    rotations_total: int
    truncations_total: int
    errors_total: int
    last_error: str | None
    last_success_ts: float | None
    mode: str | None
    state_error: bool = False  # last_error is the state directory's (a checkpoint not saved)

    @property
    def state(self) -> str:
        """`ok`; `missing` (no file at the path, no error: vLLM has not written it yet, or the path
        is wrong); `unreadable` (it cannot be read: permissions, a directory, an I/O error)."""
        if self.up:
            return "ok"
        return "missing" if not self.file_exists and self.last_error is None else "unreadable"


@dataclass(frozen=True)
class SupervisorStats:
    state: str
    starts_total: int
    exits: Mapping[str, int]  # by outcome: clean, failed, signal
    errors_total: int
    last_success_ts: float | None
    orphans: int | None  # processes of the last tree still holding GPU memory; None: not checked


@dataclass(frozen=True)
class Published:
    state: LoadState
    at: float
    started_at: float
    version: str
    totals: Totals
    log: LogHealth | None
    gpu: GpuSourceHealth | None
    supervisor: SupervisorStats | None
    load_budget_s: float | None
    _cache: list[Any] = field(default_factory=lambda: [None, 0.0], compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @property
    def gpu_ccs(self) -> Mapping[int, tuple[int, int]]:
        """Each GPU's compute capability, where known."""
        return {
            i: g.compute_capability
            for i, g in self.state.gpus.items()
            if g.compute_capability is not None
        }

    def snapshot(self, now: float) -> Snapshot:
        with self._lock:
            snap, at = self._cache
            if snap is None or abs(now - at) > SNAPSHOT_REUSE_S:
                snap = self.state.snapshot(now)
                self._cache[0], self._cache[1] = snap, now
            assert isinstance(snap, Snapshot)
            return snap
