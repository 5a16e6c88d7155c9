"""The demo's two starts of one model: the first gets ready and is learned (the start history in
the demo's state directory), the demo then has the supervisor start vLLM again, and the second
start's ETA to ready, as the daemon gave it at its first line, is set against the time it took."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loadwatch.daemon.state.durations import duration
from loadwatch.daemon.state.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class FirstLineEta:
    """The ETA to ready of the second start, the first time the daemon gave one."""

    started_at: float  # the start's first step (the process start, under the supervisor)
    seen_at: float  # the snapshot that first held it
    ready_at: float  # the median's time of ready
    low_s: float  # the range, from `started_at`
    high_s: float
    step: str
    basis: str

    @property
    def predicted_s(self) -> float:
        return self.ready_at - self.started_at


class TwoStarts:
    """Follows the snapshots: asks for the second start once the first is ready, notes the
    second start's first ETA, and its real time to ready."""

    def __init__(self) -> None:
        self.first: int | None = None  # the session that got ready first
        self.eta: FirstLineEta | None = None
        self.took_s: float | None = None  # the second start's time to ready

    @property
    def done(self) -> bool:
        return self.took_s is not None

    def see(self, snap: Snapshot, start_again: Callable[[str], None]) -> None:
        s = snap.session
        if s is None:
            return
        if self.first is None:
            if s.phase == "ready":
                self.first = s.id
                start_again("the demo starts the same model again")
            return
        if s.id == self.first or not s.timeline:
            return
        began = s.timeline[0].started_at
        e = s.startup_eta
        if self.eta is None and e is not None:
            self.eta = FirstLineEta(
                began,
                snap.at,
                e.ready_at,
                e.ready_at - e.remaining_s + e.remaining_low_s - began,
                e.ready_at - e.remaining_s + e.remaining_high_s - began,
                e.step,
                e.basis,
            )
        if s.phase == "ready" and s.ready_at is not None and self.took_s is None:
            self.took_s = s.ready_at - began

    def summary(self) -> str | None:
        """One line: what the second start's first ETA said, and what it took."""
        eta = self.eta
        if eta is None or self.took_s is None:
            return None
        off = (eta.predicted_s - self.took_s) / self.took_s if self.took_s > 0 else 0.0
        return (
            f"second start: {eta.seen_at - eta.started_at:.1f}s after it began ({eta.step}), the "
            f"ETA to ready said {duration(eta.predicted_s)} ({duration(eta.low_s)} – "
            f"{duration(eta.high_s)}, {eta.basis}); it took {duration(self.took_s)} ({off:+.1%})"
        )


__all__ = ["FirstLineEta", "TwoStarts"]
