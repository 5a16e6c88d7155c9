"""Every rank: each process's first and last line, and the rank that went silent while its peers
moved on, named by a stall within the threshold (an 8-worker Kimi-K2.5-shaped load from the
simulated vLLM, daemon/sim/kimilog.py, read live on an injected clock)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path

from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.inputs import Tick
from loadwatch.daemon.state.loadstate import Input, LoadState
from loadwatch.daemon.state.ranks import ProcessTrack, silent_ranks
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import Event

DAEMON_T0 = 1_900_000_000.0  # the daemon's clock: no relation to the log's local stamps
LOG_T0 = 1_795_000_000.0


def kimi_events(seed: int, shape: Shape, silent: tuple[int, int] | None = None) -> list[Event]:
    text = "".join(
        startup(random.Random(seed), SyntheticClock(LOG_T0), shape, silent_worker=silent)
    )
    return EventStream(ref_ts=LOG_T0 + 3600).feed_all(split_records(text.encode()))


def read_live(
    events: Sequence[Event], state: LoadState | None = None, after_s: float = 0.0
) -> tuple[LoadState, list[Transition], dict[int, float]]:
    """The daemon reading the log as it is written: each event read when its stamp (relative to
    the log's first) has come on the daemon's clock, a Tick each second between; `after_s` more
    seconds of ticks at the end. Returns the state, every transition and when each event's
    offset was read."""
    st = state if state is not None else LoadState()
    out: list[Transition] = []
    read_at: dict[int, float] = {}
    first = next(e.ts for e in events if e.ts is not None)
    clock = DAEMON_T0
    run: list[Input] = []
    ts = first

    def apply(items: Sequence[Input], now: float) -> None:
        nonlocal st
        st = st.apply_run(items, now)
        out.extend(st.transitions)

    for ev in events:
        ts = ev.ts if ev.ts is not None else ts
        now = DAEMON_T0 + (ts - first)
        if now > clock:
            apply(run, clock)
            run = []
            while clock + 1 < now:
                clock += 1
                apply([Tick()], clock)
            clock = now
        run.append(ev)
        read_at[ev.offset] = clock
    apply(run, clock)
    end = clock + after_s
    while clock < end:
        clock += 1
        apply([Tick()], clock)
    return st, out, read_at


def worker(events: Sequence[Event], name: str) -> list[Event]:
    return [e for e in events if e.process == name]


def test_a_worker_silent_after_its_60th_shard_is_named_within_the_threshold() -> None:
    events = kimi_events(7, Shape(), silent=(5, 60))
    five = worker(events, "Worker_TP5")
    st, out, read_at = read_live(events)
    raised = [t for t in out if t.kind == "stall_raised"]
    assert len(raised) == 1, [t.reason for t in raised]
    stall = raised[0]
    pid = five[0].pid
    assert stall.reason is not None and stall.reason.startswith(f"Worker_TP5 pid={pid} silent for")
    assert "while 7 peers read on" in stall.reason
    last = read_at[five[-1].offset]
    assert stall.threshold_s is not None
    # named once its silence passed the threshold, within a tick of it
    assert stall.threshold_s < stall.at - last <= stall.threshold_s + 1.0
    # the shard it went silent at: the bar's count when its last line came
    bars = [e for e in events if e.type == "shard_progress" and e.offset < five[-1].offset]
    assert f"since shard {bars[-1].done} " in stall.reason  # type: ignore[attr-defined]
    s = st.session
    assert s is not None and s.phase == "stalled" and s.stall is not None
    assert s.stall.kind == "rank" and s.stall.process == f"Worker_TP5 pid={pid}"
    # the other workers read on to the end of the weights: the bar moving does not clear it
    assert not [t for t in out if t.kind == "stall_cleared"]
    view = st.snapshot(st.session.last_event_at + 1).session  # type: ignore[union-attr]
    assert view is not None
    flagged = [p.name for p in view.processes if p.silent_while_peers_moved_on]
    assert flagged == ["Worker_TP5"]
    p5 = next(p for p in view.processes if p.name == "Worker_TP5")
    assert (p5.first_offset, p5.last_offset) == (five[0].offset, five[-1].offset)
    assert p5.pid == pid and p5.phase == "loading_weights" and p5.step == "weights"
    # /status: the processes list and the stall that names the worker
    doc = st.snapshot(st.session.last_event_at + 1).to_dict()["session"]  # type: ignore[union-attr]
    assert doc["stall"]["kind"] == "rank" and doc["stall"]["reason"] == stall.reason
    listed = {p["name"]: p for p in doc["processes"]}
    assert len(listed) == 10 and listed["Worker_TP5"]["silent_while_peers_moved_on"] is True
    assert listed["Worker_TP5"]["last_offset"] == five[-1].offset
    assert listed["Worker_TP5"]["silent_s"] > stall.threshold_s
    # its own line again (its last one, read anew) clears the stall: it is not silent
    again = dataclasses.replace(five[-1], offset=events[-1].offset + 1)
    st2 = st.apply(again, DAEMON_T0 + 10_000)
    assert st2.session is not None and st2.session.stall is None
    assert [t.reason for t in st2.transitions if t.kind == "stall_cleared"] == [
        f"Worker_TP5 pid={pid} logged again"
    ]


def test_interleaved_workers_name_the_silent_one_too() -> None:
    events = kimi_events(11, Shape(warnings="interleaved", bar="same_record"), silent=(5, 60))
    _, out, _ = read_live(events)
    raised = [t.reason or "" for t in out if t.kind == "stall_raised"]
    assert len(raised) == 1 and raised[0].startswith("Worker_TP5 pid="), raised


def test_a_normal_load_names_nobody() -> None:
    for shape in (Shape(), Shape(warnings="interleaved", bar="same_record")):
        events = kimi_events(7, shape)
        st, out, _ = read_live(events, after_s=300)
        assert not [t.reason for t in out if t.kind == "stall_raised"]
        s = st.session
        assert s is not None and s.phase == "ready"
        view = st.snapshot(s.last_event_at + 300).session
        assert view is not None
        names = [p.name for p in view.processes]
        assert names[:2] == ["APIServer", "EngineCore_DP0"]
        assert sorted(names[2:]) == [f"Worker_TP{i}" for i in range(8)]
        assert not [p.name for p in view.processes if p.silent_while_peers_moved_on]
        # rank 0 prints the bar under its prefix: its progress is its own
        w0 = next(p for p in view.processes if p.name == "Worker_TP0")
        assert (w0.bar_done, w0.bar_total) == (119, 119)
        assert (w0.phase, w0.step) == ("ready", "api_server") or w0.phase == "post_load"
        api = next(p for p in view.processes if p.name == "APIServer")
        assert api.last_offset > w0.last_offset and api.step in ("api_server", "first_completion")


def _track(name: str, last_at: float, mark: int, phase: str = "loading_weights") -> ProcessTrack:
    return ProcessTrack(name, "Worker_TP", 1, 0, 0.0, 0, last_at, phase, mark, mark)


def test_peers_that_stopped_together_or_two_ranks_name_nobody() -> None:
    # all stopped at once: the session's own stall, not a rank's
    together = {f"Worker_TP{i}": _track(f"Worker_TP{i}", 100.0, 5) for i in range(8)}
    assert silent_ranks(together, 500.0, 60.0) == []
    # only rank 0 goes on (it prints the bar and the steps after the weights)
    alone = dict(together, Worker_TP0=_track("Worker_TP0", 490.0, 9, "post_load"))
    assert silent_ranks(alone, 500.0, 60.0) == []
    # two ranks: one peer moving on is no majority of at least two
    pair = {n: together[n] for n in ("Worker_TP0", "Worker_TP1")}
    pair["Worker_TP0"] = _track("Worker_TP0", 490.0, 9)
    assert silent_ranks(pair, 500.0, 60.0) == []
    # the last lines of a shard on either side of rank 0's bar update: no rank is behind
    straddle = {n: _track(n, 100.0, 6) for n in together}
    straddle["Worker_TP5"] = _track("Worker_TP5", 99.0, 5)
    assert silent_ranks(straddle, 500.0, 60.0) == []
    # one of eight behind while the others moved on: named, once past the threshold only
    one = {n: _track(n, 490.0, 9) for n in together}
    one["Worker_TP5"] = _track("Worker_TP5", 450.0, 5)
    assert silent_ranks(one, 500.0, 60.0) == []
    assert [(p.name, on) for p, on in silent_ranks(one, 511.0, 60.0)] == [("Worker_TP5", 7)]


def test_ray_actors_that_share_a_name_are_told_apart_by_pid() -> None:
    """tests/fixtures/ray.log: two `(RayWorkerWrapper pid=N, ip=A)` actors."""
    data = (Path(__file__).resolve().parents[1] / "fixtures" / "ray.log").read_bytes()
    events = EventStream(ref_ts=LOG_T0).feed_all(split_records(data))
    st, _, _ = read_live(events)
    assert st.session is not None
    ray = {k: p for k, p in st.session.processes.items() if p.name == "RayWorkerWrapper"}
    assert sorted(ray) == ["RayWorkerWrapper pid=2211", "RayWorkerWrapper pid=2890"]
    assert all(p.first_offset <= p.last_offset for p in ray.values())
