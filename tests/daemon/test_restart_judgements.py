"""A judgement of the live world made before a restart is not made again as new by the next daemon.

The real daemon on an injected clock (test_clock_skew.py's `Run`), the simulated Kimi-K2.5
start-up whose process hangs after its 8th shard: the stall is raised once. The daemon then
stops (cleanly, or killed) and another starts on the same state directory while the load is
still stalled: it rebuilds the session from the log and judges the stall again, which is the
same stall (the same session, the same last progress), so its lines are marked as replays:
an alert rule or a pager reading the event log sees one stall, not one per daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.judgements import Judgements
from loadwatch.daemon.state.snapshot import Transition
from tests.daemon.test_clock_skew import STALL_FLOOR_S, Run, _feed, _script


def _live(transitions: list[dict[str, Any]], event: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in transitions
        if e["event"] == event
        and not e.get("replay")
        and all(e.get(k) == v for k, v in fields.items())
    ]


@pytest.mark.parametrize("kill", [False, True], ids=["stop", "kill"])
def test_a_stall_still_in_force_after_a_restart_is_raised_once(tmp_path: Path, kill: bool) -> None:
    run = Run(tmp_path)
    run.start()
    _feed(run, _script(0.0, stall_at=8))
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    assert run.session().phase == "stalled"
    run.read()  # the loop's next look at the log: the stall is in the checkpoint now
    run.stop(kill=kill)
    run.start()
    run.read()
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    assert run.session().phase == "stalled"
    run.stop(kill=False)
    assert len(_live(run.transitions, "transition.stall_raised")) == 1, run.transitions
    assert len(_live(run.transitions, "transition.phase", phase_to="stalled")) == 1


def test_a_stall_after_the_load_moved_on_since_the_restart_is_a_new_one(tmp_path: Path) -> None:
    """The load stalled after its 8th shard, the daemon restarted, vLLM went on to its 12th
    shard and stalled again: the second stall is new, not the first one again."""
    run = Run(tmp_path)
    run.start()
    _feed(run, _script(0.0, stall_at=8))
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    run.read()
    run.stop(kill=False)
    run.start()
    run.read()
    written = len(list(_script(0.0, stall_at=8)))
    later = list(_script(0.0, stall_at=12))[written:]
    assert later, "the second script goes on past the first"
    shift = run.clock.now - later[0][0] + 1.0  # vLLM went on after the restart
    _feed(run, ((t + shift, line) for t, line in later))
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    run.stop(kill=False)
    assert len(_live(run.transitions, "transition.stall_raised")) == 2, run.transitions


def test_each_live_judgement_is_held_until_raised_again_or_cleared() -> None:
    """The OOM forecast per GPU and the vanished vLLM, as the stall: the first raise after the
    restart is the one made before; a second raise, or one after its clear, is new."""
    t = Transition
    before = Judgements(["forecast:3", "vanished"])
    forecast = t(kind="forecast_raised", at=1.0, session=1, gpu_index=3, forecast="oom_predicted")
    assert before.again([forecast])
    assert not before.again([forecast])
    assert before.again([t(kind="failure", at=1.0, session=1, failure_kind="vanished")])
    cleared = Judgements(["forecast:3"])
    cleared.note([t(kind="forecast_cleared", at=1.0, session=1, gpu_index=3)], replay=False)
    assert not cleared.again([forecast])
    assert cleared.keys() == ["forecast:3"]  # in force again, as raised now
    other = Judgements(["forecast:3"])
    other.note([t(kind="session_started", at=1.0, session=2)], replay=False)
    assert other.keys() == [] and not other.again([forecast])
