"""`LoadState.apply_run` (a run of inputs in one call, changing its own copies in place) gives
exactly the state and the transitions of folding the same inputs one `apply` at a time:
replayed and live, across stalls, restarts, new processes and scales, in runs of any size. And
`apply_runs` (several runs, each at its own time, in one call) gives exactly what those runs
give one `apply_run` after another. The state a call starts from is never changed by it."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.inputs import HealthProbe, ProcessEvent, Tick
from loadwatch.daemon.state.loadstate import Input, LoadState
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.parsers import (
    ChunkScanner,
    Event,
    EventStream,
    KvScaleWarning,
    LogError,
    LogWarning,
    ShardProgress,
)
from loadwatch.parsers.events import ClientText
from tests.parsers.golden import REF_TS
from tests.perf.logs import load_log, serving_log


def events(data: bytes) -> list[Event]:
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS))
    return scanner.feed(data) + scanner.stream.flush()


def runs_of(items: list[tuple[float, Input]], size: int) -> list[tuple[float, list[Input]]]:
    """The inputs as runs of up to `size` log events seen at one time; any other input (a tick,
    a process event) a run of its own, as the daemon's loop hands them over."""
    out: list[tuple[float, list[Input]]] = []
    for now, item in items:
        if (
            isinstance(item, Event)
            and out
            and out[-1][0] == now
            and len(out[-1][1]) < size
            and isinstance(out[-1][1][-1], Event)
        ):
            out[-1][1].append(item)
            continue
        out.append((now, [item]))
    return out


RUNS_PER_CALL = 5  # `apply_runs`: the runs of each call


def fold_both(
    items: list[tuple[float, Input]], replay: bool = False, size: int = 64
) -> tuple[LoadState, int]:
    """Fold `items` as runs and one at a time; assert both give the same, run by run. Then
    fold the runs a few in each `apply_runs` call; assert that gives the same, call by call."""
    batched = single = LoadState()
    runs = runs_of(items, size)
    each: list[LoadState] = []  # the state after each run, one `apply_run` at a time
    for now, run in runs:
        before = copy.deepcopy(batched)
        got = batched.apply_run(run, now, replay=replay)
        assert batched == before, "apply_run changed the state it started from"
        out: list[Transition] = []
        for item in run:
            single = single.apply(item, now, replay=replay)
            out.extend(single.transitions)
        assert list(got.transitions) == out, (now, run[:3])
        assert evolve(got, transitions=()) == evolve(single, transitions=()), (now, run[:3])
        batched = got
        each.append(got)
    grouped = LoadState()
    for k in range(0, len(runs), RUNS_PER_CALL):
        calls = runs[k : k + RUNS_PER_CALL]
        before = copy.deepcopy(grouped)
        got = grouped.apply_runs(calls, replay=replay)
        assert grouped == before, "apply_runs changed the state it started from"
        want = each[k : k + RUNS_PER_CALL]
        assert list(got.transitions) == [t for st in want for t in st.transitions], calls[0][0]
        assert evolve(got, transitions=()) == evolve(want[-1], transitions=()), calls[0][0]
        grouped = got
    return batched, len(runs)


def test_replayed_load_log() -> None:
    evs = events(load_log()[0])
    items: list[tuple[float, Input]] = [(REF_TS + 60.0, e) for e in evs]
    st, runs = fold_both(items, replay=True)
    warnings = sum(isinstance(e, KvScaleWarning) for e in evs)
    assert runs < 0.1 * warnings  # most inputs came in runs
    assert st.sessions_total == 6


def test_live_load_log_in_runs_of_any_size() -> None:
    evs = events(load_log()[0])
    for size in (1, 7, 500):
        items: list[tuple[float, Input]] = [(REF_TS + 60.0 + i // 50, e) for i, e in enumerate(evs)]
        st, _ = fold_both(items, size=size)
        assert st.sessions_total == 6


def test_live_load_log_read_in_runs_with_stalls_between() -> None:
    """A load's warnings and its bar updates, live, in runs of any size; now and then the log
    goes quiet long enough for a stall, then goes on."""
    evs = events(load_log()[0])
    for size in (1, 3, 40, 500):
        items: list[tuple[float, Input]] = []
        t = REF_TS + 60.0
        for i, e in enumerate(evs):
            if i % 9 == 0:
                t += 1.0
            if i % 311 == 0:
                t += 3000.0
                items.append((t, Tick()))
            items.append((t, e))
        st, _ = fold_both(items, size=size)
        assert st.sessions_total == 6
        assert st.lifetime.stalls + (st.session.stalls_total if st.session else 0) > 0


def test_live_serving_log_with_stalls_and_restarts() -> None:
    items: list[tuple[float, Input]] = []
    t = 0.0
    for i, e in enumerate(events(serving_log()[0])):
        t = max(t, e.ts or t)
        if i % 400 == 0:
            items.append((t, ProcessEvent(kind="started", ts=t, pid=100 + i)))
        if i % 97 == 0:
            t += 2000.0  # silence long enough for a quiet stall, then the log goes on
            items.append((t, Tick()))
        items.append((t + 1.0, e if e.ts is None else replace(e, ts=t)))  # logged live
    st, runs = fold_both(items)
    assert runs < len(items)
    assert st.sessions_total > 3
    assert st.session is not None and st.lifetime.stalls + st.session.stalls_total > 0


def test_warnings_of_many_processes_layers_and_scales() -> None:
    now = REF_TS
    items: list[tuple[float, Input]] = [(now, ProcessEvent(kind="started", ts=now, pid=1))]
    for i in range(600):
        at = now + i // 3
        items.append(
            (
                at,
                KvScaleWarning(
                    scale=("k", "v", "q", "zero_point")[i % 4],
                    layer=(i * 37) % 5000,  # some beyond the kept layer bits
                    process=f"Worker_TP{i % 20}",  # more than the processes kept per code
                    ts=now + i - (15 if i % 50 == 0 else 0),
                ),
            )
        )
        items.append((at, LogWarning(source=None, message="w", ts=None, process=None)))
        # more messages than warning codes kept: the rest count as "other"
        word = "".join(chr(97 + int(c)) for c in f"{i % 90:02d}")  # 90 messages, 90 codes
        items.append((at, LogError(source="mod.py:1", message=f"failed {word}", ts=now + i)))
        if i % 150 == 149:
            items.append((at + 5000, Tick()))  # a quiet stall, then more warnings
    for replay in (False, True):
        st, runs = fold_both(items, replay=replay)
        assert runs < len(items) / 3
        assert st.session is not None and st.session.warnings["other"].count > 100
        w = st.session.warnings["kv_scale_missing"]
        assert w.count == 600 and len(w.processes) == 16 and w.layers_over > 0


def test_client_text_of_many_processes_kinds_and_times() -> None:
    """A serving log's echoed prompts come in runs (`fold_log.on_client_text_run`): counted by
    kind, each process's last line noted at its own time, which the run does not move (client
    text is no activity), even when stamps go back; among warnings, ticks and new processes."""
    now = REF_TS
    kinds = ("request_received", "request_added", "response_generated", "model_error")
    items: list[tuple[float, Input]] = [(now, ProcessEvent(kind="started", ts=now, pid=1))]
    items.append((now, LogWarning(source=None, message="w", ts=now, process="APIServer", pid=1)))
    for i in range(900):
        at = now + i // 7
        stamp = None if i % 41 == 0 else now + i // 3 - (40 if i % 13 == 0 else 0)
        process = ("APIServer", "EngineCore_DP0", None)[i % 3 if i % 5 else 0]
        items.append(
            (at, ClientText(kind=kinds[i % 4], offset=i, ts=stamp, process=process, pid=10 + i % 4))
        )
        if i % 60 == 59:
            items.append((at, LogWarning(source=None, message="w", ts=stamp, process="APIServer")))
        if i % 300 == 299:
            items.append((at + 5000, Tick()))  # a quiet stall between runs
    for replay in (False, True):
        st, runs = fold_both(items, replay=replay)
        assert runs < len(items) / 5
        assert st.events["client_text"] == 900 and sum(st.client_text.values()) == 900
        assert len(st.client_text) == 4 and st.session is not None
        assert {10, 11, 12, 13} <= set(st.node_pids)  # the node saw the processes' pids
        assert len(st.session.processes) >= 6  # (name, pid) pairs noted


def test_bar_updates_back_to_back_read_in_bursts() -> None:
    """A load that prints no warnings: its bar updates come back to back, and a run read at
    one instant holds several of them (`fold_bars.py`'s bursts, where the last decides)."""
    rng = random.Random(3)
    clock = SyntheticClock()
    shape = Shape(shards=40, workers=2, layers=4, kv_scales=False)
    data = "".join(line for _ in range(2) for line in startup(rng, clock, shape)).encode()
    evs = events(data)
    bars = [e for e in evs if isinstance(e, ShardProgress)]
    assert len(bars) > 80
    for size in (2, 5, 64):
        for replay in (False, True):
            items: list[tuple[float, Input]] = [
                (REF_TS + 60.0 + i // 7, e) for i, e in enumerate(evs)
            ]
            st, _ = fold_both(items, replay=replay, size=size)
            s = st.session
            assert s is not None
            (bar,) = [b for b in s.bars.values() if b.kind == "weights"]
            assert (bar.done, bar.updates) == (40, 42)


def test_failed_health_probes_in_one_run_each_count() -> None:
    """Two failed probes folded in one call count two, as one at a time."""
    probes: list[Input] = [HealthProbe(ok=False, ts=REF_TS + i, error="refused") for i in (1, 2)]
    items = [(REF_TS + 5.0, p) for p in probes]
    st, _runs = fold_both(items)
    assert st.health_failures == 2
    assert LoadState().apply_run(probes, REF_TS + 5.0).health_failures == 2
