"""vLLM stamps its lines in its own local time, without a zone: with vLLM in a container on UTC
and the daemon on UTC+3 (or the other way round), or a clock 90 s off, every stamp is hours or
seconds away from the daemon's clock. Live, that changes nothing: no phase, stall or duration.
(Before, a line three hours "old" was taken for a replayed one: a load progressing one shard
every 2 s was reported stalled.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadwatch.daemon.sources.inputs import Tick
from loadwatch.daemon.state.loadstate import Input, LoadState
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.parsers.events import Event, KvScaleWarning

from .helpers import T0, bar, fold, ms, started

SKEWS = (-3 * 3600.0, 3 * 3600.0, 90.0, -90.0, 0.0)


def _load(skew: float, shards: int = 30, every: float = 2.0) -> list[tuple[float, Input]]:
    """A live load as the daemon sees it: `now` is its clock, the lines' stamps are vLLM's."""

    def stamped(now: float, ev: Event) -> tuple[float, Input]:
        return now, replace(ev, ts=now + skew)  # type: ignore[type-var]

    out: list[tuple[float, Input]] = [(T0, started(T0))]
    out.append(stamped(T0 + 1, ms("version", value="0.15.1")))
    out.append(stamped(T0 + 2, ms("model_load_start")))
    out.append(stamped(T0 + 3, bar(0, shards)))
    t = T0 + 3
    for i in range(1, shards + 1):
        t += every
        out.append(stamped(t, bar(i, shards)))
        out.append(stamped(t, KvScaleWarning(scale="k", layer=i, process="Worker_TP0")))
        out.append((t + 0.5, Tick()))
    out.append(stamped(t + 3, ms("api_server_start", value="http://127.0.0.1:8000")))
    out.append(stamped(t + 4, ms("app_startup_complete")))
    return out


def _facts(tr: list[Transition]) -> list[tuple[object, ...]]:
    return [(t.kind, t.phase_from, t.phase_to, t.at, t.duration_s) for t in tr]


@pytest.mark.parametrize("skew", SKEWS)
def test_a_zone_or_clock_apart_changes_no_phase_stall_or_duration(skew: float) -> None:
    st, tr = fold(_load(skew), stall_floor_s=10.0)
    ref, ref_tr = fold(_load(0.0), stall_floor_s=10.0)
    assert not [t for t in tr if t.kind == "stall_raised"]
    assert _facts(tr) == _facts(ref_tr)
    snap, want = st.snapshot(T0 + 200), ref.snapshot(T0 + 200)
    assert snap.session is not None and want.session is not None
    assert snap.phase == "ready"
    assert snap.session.time_to_ready_s == want.session.time_to_ready_s
    assert snap.session.started_at == T0


@pytest.mark.parametrize("skew", SKEWS)
def test_the_stall_still_fires_within_its_threshold_when_the_load_stops(skew: float) -> None:
    last = T0 + 3 + 2 * 20  # the 20th shard, then nothing more is logged
    items = [it for it in _load(skew) if not (isinstance(it[1], Event) and it[0] > last)]
    items = [it for it in items if it[0] <= last + 1]
    items += [(last + 0.5 + i, Tick()) for i in range(1, 120)]
    st, tr = fold(items, stall_floor_s=10.0, stall_k=5.0)
    raised = [t for t in tr if t.kind == "stall_raised"]
    assert len(raised) == 1
    assert raised[0].since == pytest.approx(last)
    assert raised[0].threshold_s == pytest.approx(10.0)  # 5 x 2 s, the floor
    assert last + raised[0].threshold_s < raised[0].at <= last + raised[0].threshold_s + 1.0
    assert st.session is not None and st.session.phase == "stalled"


def test_a_replay_places_events_at_their_stamps_moved_by_the_offset() -> None:
    # Re-read after a restart, with the log source's offset between stamps and the clock.
    offset = 3 * 3600.0
    now = T0 + 3600
    st = LoadState().apply_run(
        [
            ms("version", value="0.15.1", ts=T0 - offset),
            ms("model_load_start", ts=T0 - offset + 2),
            ms("model_load_start", ts=T0 - offset + 1),  # out of order: kept in order
            ms("app_startup_complete"),  # no stamp: the time of the one before
            ms("kv_cache", ts=T0 + 7200),  # past the clock: clamped to now
        ],
        now,
        replay=True,
        stamp_offset_s=offset,
    )
    s = st.session
    assert s is not None
    assert s.started_at == T0
    assert s.milestones["model_load_start"].first_at == T0 + 2
    assert s.milestones["model_load_start"].last_at == T0 + 2
    assert s.ready_at == T0 + 2
    assert s.milestones["kv_cache"].first_at == now
    assert not [t for t in st.transitions if t.kind == "stall_raised"]
    assert [t.kind for t in st.transitions][:1] == ["session_started"]
