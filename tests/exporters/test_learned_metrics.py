"""The ETA to ready learned from earlier starts on /metrics: a repeat start of the simulated
vLLM (tests/state/test_learned.py folds its real-shaped logs) exports its range; a start with
no history exports none; promtool has nothing to say."""

from __future__ import annotations

import pytest

from loadwatch.daemon.sim.kimilog import SyntheticClock
from loadwatch.daemon.state.loadstate import LoadState
from tests.exporters.test_timeline_metrics import exposition, samples
from tests.ops.common import promtool_says
from tests.state.test_learned import first_start, fold, timed_lines, with_history

ETA = "loadwatch_startup_eta_seconds"
OVERDUE = "loadwatch_startup_overdue_seconds"
PHASE_OVERDUE = "loadwatch_startup_phase_overdue_seconds"


def repeat_start_at_first_line(history: bool) -> tuple[LoadState, float]:
    state, entry = first_start()
    lines = timed_lines(2, SyntheticClock(1_795_003_600.0))
    at, line = next(lines)
    base = with_history(state, entry) if history else LoadState()
    second, _, _ = fold(base, iter([(at, line)]))
    return second, at


def test_the_range_of_a_repeat_start_and_none_without_history() -> None:
    state, at = repeat_start_at_first_line(history=True)
    text = exposition(state, at + 30)
    got = {dict(k)["bound"]: v for k, v in samples(text, ETA).items()}
    assert set(got) == {"low", "mid", "high"}
    assert got["low"] < got["mid"] < got["high"]
    eta = state.snapshot(at + 30).session.startup_eta  # type: ignore[union-attr]
    assert eta is not None and got["mid"] == eta.remaining_s
    assert f"{OVERDUE} 0.0" in text
    bare, at = repeat_start_at_first_line(history=False)
    text = exposition(bare, at)
    assert ETA not in text and OVERDUE not in text  # not known is no sample, never 0
    assert PHASE_OVERDUE not in text


def test_overdue_once_past_the_slowest_earlier_start() -> None:
    _, entry = first_start()
    state, at = repeat_start_at_first_line(history=True)
    later = at + entry.ready_s + 100
    assert f"{OVERDUE} 100.0" in exposition(state, later)


def test_the_step_under_way_past_the_slowest_earlier_starts_time_in_its_phase() -> None:
    _, entry = first_start()
    took = dict(entry.steps)["config"]  # the step a start's first line opens
    state, at = repeat_start_at_first_line(history=True)
    step = state.snapshot(at).session.timeline[-1]  # type: ignore[union-attr]
    assert step.phase == "config"
    within = exposition(state, step.started_at + took / 2)
    assert samples(within, PHASE_OVERDUE) == {(("phase", "config"),): 0.0}
    past = exposition(state, step.started_at + took + 42)
    assert samples(past, PHASE_OVERDUE) == {(("phase", "config"),): pytest.approx(42.0)}


def test_promtool_has_nothing_to_say() -> None:
    state, at = repeat_start_at_first_line(history=True)
    text = exposition(state, at + 30)
    assert ETA + "{" in text
    assert promtool_says(text) == ""
