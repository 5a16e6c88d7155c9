"""`LoadState.apply`'s shortcut for repeated warnings gives exactly the state of the general
fold, step by step: replayed and live, across stalls, restarts, new processes and scales."""

from __future__ import annotations

from dataclasses import replace

from loadwatch.daemon.sources.inputs import ProcessEvent, Tick
from loadwatch.daemon.state.fold import tally_fast
from loadwatch.daemon.state.loadstate import Input, LoadState, apply_general
from loadwatch.parsers import (
    ChunkScanner,
    Event,
    EventStream,
    KvScaleWarning,
    LogError,
    LogWarning,
)
from tests.parsers.golden import REF_TS
from tests.perf.logs import load_log, serving_log


def events(data: bytes) -> list[Event]:
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS))
    return scanner.feed(data) + scanner.stream.flush()


def fold_both(items: list[tuple[float, Input]]) -> tuple[LoadState, int]:
    st = LoadState()
    shortcuts = 0
    for now, item in items:
        got = st.apply(item, now)
        assert got == apply_general(st, item, now), (now, item)
        if isinstance(item, Event) and tally_fast(st, item, now) is not None:
            shortcuts += 1
        st = got
    return st, shortcuts


def test_replayed_load_log() -> None:
    evs = events(load_log()[0])
    st, shortcuts = fold_both([(REF_TS + 60.0, e) for e in evs])
    warnings = sum(isinstance(e, KvScaleWarning) for e in evs)
    assert shortcuts > 0.9 * warnings
    assert st.sessions_total == 6


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
    st, shortcuts = fold_both(items)
    assert shortcuts > 0
    assert st.sessions_total > 3


def test_warnings_of_many_processes_layers_and_scales() -> None:
    now = REF_TS
    items: list[tuple[float, Input]] = [(now, ProcessEvent(kind="started", ts=now, pid=1))]
    for i in range(600):
        items.append(
            (
                now + i,
                KvScaleWarning(
                    scale=("k", "v", "q", "zero_point")[i % 4],
                    layer=(i * 37) % 5000,  # some beyond the kept layer bits
                    process=f"Worker_TP{i % 20}",  # more than the processes kept per code
                    ts=now + i - (15 if i % 50 == 0 else 0),  # now and then a replayed one
                ),
            )
        )
        items.append((now + i, LogWarning(source=None, message="w", ts=None, process=None)))
        # more source lines than warning codes kept: the rest count as "other"
        items.append((now + i, LogError(source=f"mod_{i % 90}.py:1", message="e", ts=now + i)))
        if i % 150 == 149:
            items.append((now + i + 5000, Tick()))  # a quiet stall, then more warnings
    st, shortcuts = fold_both(items)
    assert shortcuts > 900
    assert st.session is not None and st.session.warnings["other"].count > 100
