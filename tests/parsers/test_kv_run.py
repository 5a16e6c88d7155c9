"""Runs of plain k/v scale warnings (parsers/vllm/kvrun.py): whatever `kv_run` accepts, the
event stream parses record by record to `KvScaleWarning`s with the same fields, and the chunk
scanner with `runs=True` leaves the state, the stream's counts and every other event as one
event per record does."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.parsers import ChunkScanner, EventStream
from loadwatch.parsers.events import KvScaleRun, KvScaleWarning, ShardProgress
from loadwatch.parsers.scan import split_records
from loadwatch.parsers.vllm.kvrun import kv_run
from tests.perf.logs import load_log

FIXTURES = Path(__file__).parent.parent / "fixtures"
REF_TS = 1.8e9
# Real records: tests/fixtures/real-v0.32-deepseek-kvscales.log (a real vLLM 0.32 run here)
# and tests/fixtures/v1-2026-sm120.log (a Kimi-K2.5 load, from its vllm issue; see its header).
REAL = [
    line
    for name in ("real-v0.32-deepseek-kvscales.log", "v1-2026-sm120.log")
    for line in (FIXTURES / name).read_bytes().splitlines()
    if b"_scale in the checkpoint (e.g." in line
]


# Real bar records after their lone prefix and `\r` (tests/fixtures/v1-2026-sm120.log, and
# tests/fixtures/tp1-enginecore.log, a real vLLM run here)
REAL_BARS = [
    line
    for name in ("v1-2026-sm120.log", "tp1-enginecore.log")
    for line in (FIXTURES / name).read_bytes().split(b"\n")
    if b") \r" in line and b"Completed |" in line
]


def per_record(data: bytes) -> list[object]:
    s = EventStream(ref_ts=REF_TS)
    return [ev for rec in split_records(data) for ev in s.feed(rec)]


def check_accepted(data: bytes) -> None:
    """`kv_run` from the start of `data` against the stream fed record by record."""
    got = kv_run(data, 0)
    events = per_record(data)
    if got is None:
        return
    _end, count, last, first_stamp, last_stamp, ckpt, model, scales, procs, layers = got
    run = [ev for ev in events if ev.offset <= last]
    assert len(run) == count and all(type(ev) is KvScaleWarning for ev in run), run
    ev0 = run[0]
    assert (ev0.checkpoint_name, ev0.model_name) == (ckpt, model)
    assert not any(ev.deprecated for ev in run)
    assert tuple(dict.fromkeys(ev.scale for ev in run)) == scales
    assert tuple(dict.fromkeys((ev.process, ev.pid) for ev in run)) == procs
    want: dict[int, int] = {}
    for ev in run:
        if ev.layer is not None:
            want[ev.layer] = want.get(ev.layer, 0) + 1
    assert tuple(sorted(want.items())) == layers
    years = EventStream(ref_ts=REF_TS).years
    assert (run[0].ts, run[-1].ts) == (years.stamp(first_stamp), years.stamp(last_stamp))


def test_every_real_record_is_accepted_and_parses_alike() -> None:
    assert len(REAL) >= 20
    for line in REAL:
        assert kv_run(line + b"\n", 0) is not None, line
        check_accepted(line + b"\n")
    check_accepted(b"\n".join(REAL) + b"\n")


_PIECES = st.sampled_from(
    [
        b"k",
        b"v",
        b"q",
        b"(",
        b")",
        b" ",
        b"0m",
        b"6m",
        b"\x1b[0m",
        b"layers.",
        b"layer.",
        b"7",
        b"1234567",
        b".",
        b"-",
        b"_",
        b"\xc3\xa9",
        b"\r",
        b"\n",
        b"\r\n",
        b"02-29",
        b"13",
        b"DEPRECATED. ",
        b"WARNING",
        b"INFO",
        b" pid=",
        b"] ",
        b"[",
        b" [repeated 2x across cluster]",
        b"9",
    ]
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """Real records, some cut, spliced or with pieces inserted or replaced."""
    lines = draw(st.lists(st.sampled_from(REAL), min_size=1, max_size=4))
    out = []
    for line in lines:
        for _ in range(draw(st.integers(0, 2))):
            i = draw(st.integers(0, len(line)))
            j = draw(st.integers(i, min(len(line), i + draw(st.integers(0, 6)))))
            line = line[:i] + draw(_PIECES) + line[j:]
        out.append(line)
    return b"\n".join(out) + draw(st.sampled_from([b"\n", b"\r\n", b""]))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_what_kv_run_accepts_parses_to_the_same_warnings(data: bytes) -> None:
    check_accepted(data)


def fold(data: bytes, runs: bool, replay: bool, chunk: int) -> tuple[object, ...]:
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS), runs=runs)
    state = LoadState()
    grouped = 0
    pos = 0
    while pos < len(data):  # whole records per chunk, as the follower hands them
        cut = data.rfind(b"\n", pos, pos + chunk) + 1 or len(data)
        if cut <= pos:
            cut = data.find(b"\n", pos) + 1 or len(data)
        events = scanner.feed(data[pos:cut], pos)
        grouped += sum(1 for ev in events if type(ev) is KvScaleRun)
        state = state.apply_run(events, REF_TS + 5, replay=replay)
        pos = cut
    snap = state.snapshot(REF_TS + 5)
    stats = scanner.stream.stats
    return snap, state.lifetime, state.node, vars(stats), grouped


def test_runs_fold_like_one_event_per_record() -> None:
    data, _counts = load_log()
    for replay in (False, True):
        for chunk in (4096, 1 << 20):
            want = fold(data, False, replay, chunk)
            got = fold(data, True, replay, chunk)
            assert want[4] == 0 and got[4] > 0
            assert got[:4] == want[:4]


def test_a_run_stops_where_the_stamp_goes_back() -> None:
    a, b = REAL[0], REAL[1]
    later = re.sub(rb"\d\d:\d\d:\d\d", b"23:59:59", a, count=1)
    got = kv_run(later + b"\n" + b + b"\n", 0)
    assert got is not None and got[1] == 1


def stream_view(data: bytes, runs: bool, chunk: int) -> tuple[object, ...]:
    """Every event but the k/v warnings, their count, and what the stream holds after."""
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS), runs=runs)
    events = []
    pos = 0
    while pos < len(data):
        cut = data.rfind(b"\n", pos, pos + chunk) + 1 or len(data)
        if cut <= pos:
            cut = data.find(b"\n", pos) + 1 or len(data)
        events += scanner.feed(data[pos:cut], pos)
        pos = cut
    s = scanner.stream
    kv = sum(ev.count if type(ev) is KvScaleRun else 1 for ev in events if "kv_scale" in ev.type)
    others = [ev for ev in events if "kv_scale" not in ev.type]
    anchors = {k: (a.start_ts, a.last_done) for k, a in s._bars.items()}
    held = (s._last_ts, s._bar_owner, anchors, s._pending_prefix, s.mode, s.in_traceback)
    return others, kv, vars(s.stats), held


@st.composite
def load_records(draw: st.DrawFn) -> bytes:
    """Real k/v warnings and real bar pairs interleaved, some mutated (`_PIECES`)."""
    lines = draw(st.lists(st.sampled_from(REAL + REAL_BARS), min_size=1, max_size=10))
    out = []
    for line in lines:
        if draw(st.integers(0, 3)) == 0:
            i = draw(st.integers(0, len(line)))
            j = draw(st.integers(i, min(len(line), i + draw(st.integers(0, 6)))))
            line = line[:i] + draw(_PIECES) + line[j:]
        out.append(line)
    return b"\n".join(out) + b"\n"


def test_real_bars_are_read_within_runs() -> None:
    assert len(REAL_BARS) >= 10
    data = b"\n".join(x for pair in zip(REAL, REAL_BARS, strict=False) for x in pair) + b"\n"
    got = ChunkScanner(EventStream(ref_ts=REF_TS), runs=True).feed(data)
    assert [type(ev) for ev in got[:2]] == [KvScaleRun, ShardProgress]
    assert stream_view(data, True, 1 << 20) == stream_view(data, False, 1 << 20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(load_records(), st.sampled_from([300, 1 << 20]))
def test_bars_within_runs_come_out_as_fed_one_by_one(data: bytes, chunk: int) -> None:
    assert stream_view(data, True, chunk) == stream_view(data, False, chunk)
    for replay in (False, True):
        assert fold(data, True, replay, chunk)[:4] == fold(data, False, replay, chunk)[:4]
