"""The start-up timeline's metrics (docs/metrics.md): which step the current start is in, and
the seconds each phase took, in the current start and in the last one that got ready; the time
left to ready and how far past its learned range the start has run, where earlier comparable
starts are in the history (daemon/state/learned.py).

A phase the start has not reached is left out (not known is no sample, never 0); a phase seen
twice (a drafter's second weights) counts its steps together.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily

from loadwatch.daemon.state.snapshot import (
    STARTUP_PHASES,
    STARTUP_UNKNOWN,
    Snapshot,
    StartupStepView,
)

PHASE_LABELS = (*STARTUP_PHASES, STARTUP_UNKNOWN)


def phase_seconds(steps: Sequence[StartupStepView]) -> dict[str, float]:
    """Seconds per phase, a repeated phase's steps added up."""
    out: dict[str, float] = {}
    for s in steps:
        out[s.phase] = out.get(s.phase, 0.0) + s.duration_s
    return out


def last_finished(snap: Snapshot) -> Sequence[StartupStepView] | None:
    """The timeline of the latest earlier session whose start got to ready."""
    for past in reversed(snap.sessions):
        if past.time_to_ready_s is not None and past.timeline:
            return past.timeline
    return None


def timeline_metrics(snap: Snapshot) -> Iterator[GaugeMetricFamily]:
    s = snap.session
    if s is None:
        return
    under_way = next((x.phase for x in reversed(s.timeline) if x.ended_at is None), None)
    current = GaugeMetricFamily(
        "loadwatch_startup_phase",
        "1 for the start-up step the current session is in; all 0 once it is over.",
        labels=["phase"],
    )
    for name in PHASE_LABELS:
        current.add_metric([name], 1.0 if name == under_way else 0.0)
    yield current
    seconds = GaugeMetricFamily(
        "loadwatch_startup_phase_seconds",
        "Seconds each start-up phase took: the current start, and the last that got ready.",
        labels=["phase", "start"],
    )
    last = last_finished(snap)
    for start, steps in (("current", s.timeline), ("last", last or ())):
        took = phase_seconds(steps)
        for name in PHASE_LABELS:
            if name in took:
                seconds.add_metric([name, start], took[name])
    yield seconds
    eta = s.startup_eta
    if eta is None:
        return  # no comparable earlier start (or the start-up is over): no sample, never 0
    left = GaugeMetricFamily(
        "loadwatch_startup_eta_seconds",
        "Seconds left to ready as the comparable earlier starts say: low, mid (median), high.",
        labels=["bound"],
    )
    for bound, value in (
        ("low", eta.remaining_low_s),
        ("mid", eta.remaining_s),
        ("high", eta.remaining_high_s),
    ):
        left.add_metric([bound], value)
    yield left
    if eta.overdue_s is not None:
        yield GaugeMetricFamily(
            "loadwatch_startup_overdue_seconds",
            "Seconds this start-up has run past the slowest comparable earlier start (0: not).",
            value=eta.overdue_s,
        )
    if eta.phase_overdue_s is not None:
        step = GaugeMetricFamily(
            "loadwatch_startup_phase_overdue_seconds",
            "Seconds the step under way has run past the slowest comparable earlier start's time"
            " in its phase (0: not).",
            labels=["phase"],
        )
        step.add_metric([eta.step], eta.phase_overdue_s)
        yield step


__all__ = ["PHASE_LABELS", "last_finished", "phase_seconds", "timeline_metrics"]
