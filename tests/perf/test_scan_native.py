"""The C candidate search (parsers/_scan.c) returns what the Python one returns, on any bytes.

`make test` builds the C module; a test here fails when it could not, so a missing compiler
cannot pass unnoticed as a slow scanner.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadwatch.parsers import ChunkScanner, EventStream
from loadwatch.parsers.scan import NATIVE, count_records, count_records_py
from loadwatch.parsers.vllm.grammar import GRAMMAR
from loadwatch.parsers.vllm.plans import quiet_record
from loadwatch.parsers.vllm.segment import Mode
from tests.perf.logs import load_log, serving_log

NATIVE_PLANS = GRAMMAR.native_plans

try:
    from loadwatch.parsers import _scan
except ImportError:  # the test below says so
    _scan = None  # type: ignore[assignment]


def test_the_c_scanner_is_built() -> None:
    assert NATIVE and _scan is not None, "parsers/_scan.c did not build: is a C compiler there?"


def both(data: bytes, pos: int, mode: Mode) -> tuple[object, object]:
    py = ChunkScanner(EventStream(), native=False)._candidates_py(
        data, pos, mode, data.find(b"\r") >= 0
    )
    c = _scan.candidates(data, pos, NATIVE_PLANS[mode], mode == "serving")
    return c, py


_PREFIX = st.sampled_from(
    [
        b"",
        b"(APIServer pid=1) ",
        b"(APIServer pid=1)",
        b"(VllmWorker rank=1 pid=9) ",
        b"(VllmWorker rank=1234567 pid=9) ",
        b"(VllmWorker PP0_TP1 pid=2) ",
        b"(W A1_B2_C3_D4_E5_F6_G7_H8_I9 pid=2) ",
        b"(W ABCDEFGHI1 pid=2) ",
        b"(RayWorkerWrapper pid=5, ip=10.0.0.2) ",
        b"(RayWorkerWrapper pid=5, ip=) ",
        b"(x" + b"y" * 63 + b" pid=1) ",
        b"(x" + b"y" * 64 + b" pid=1) ",
        b"(1x pid=1) ",
        b"(A pid=12345678901) ",
        b" (A pid=1) ",
    ]
)
_LEVEL = st.sampled_from([b"INFO ", b"DEBUG ", b"WARNING ", b"ERROR ", b"INFO  ", b"INFO:     "])
_STAMP = st.sampled_from([b"11-30 10:00:00", b"11-30 10:00", b"1-30 10:00:00", b"11/30 10:00:00"])
_FRACTION = st.sampled_from([b"", b".123", b",5", b".1234567", b".", b".123456"])
_SOURCE = st.sampled_from(
    [
        b" [logger.py:71] ",
        b" [x]",
        b" [" + b"a" * 200 + b"] ",
        b" [" + b"a" * 201 + b"] ",
        b" [x\xc2\xa0y.py:1] ",
        b" []",
        b" [a b] ",
        b"[x.py:1] ",
    ]
)
_MESSAGE = st.sampled_from(
    [
        b" ",
        b"prompt: 'ERROR and WARNING'",
        b"Traceback (most recent call last):",
        b"CRITICAL",
        b"  version 0.1",
        b"server version",
        b"Starting to load model /m",
        b"Shutting down",
        b"Application startup complete.",
        b"No available shared memory broadcast block found",
        b"Uvicorn running on",
        b"Found k_scale in the checkpoint (e.g. model.layers.1.k_scale)",
        b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
        b"Loading weights took 12.3 seconds",
        b"down",
        b"died",
        b"ERR",
        b"ERROR",
        b" pid=",
        b"(B pid=3) ERROR 11-30 10:00:01 [c.py:3] boom",
        b"\x1b[0m",
        b"[1;36m",
        b"6m",
        b"0m",
        b"m",
        b"=",
        b"\xff\xfe",
    ]
)
_RECORD = st.tuples(
    _PREFIX,
    _LEVEL,
    _STAMP,
    _FRACTION,
    _SOURCE,
    st.lists(_MESSAGE | st.binary(max_size=6), max_size=5),
).map(lambda t: b"".join(t[:5]) + b"".join(t[5]))
_TERMINATOR = st.sampled_from([b"\n", b"\r", b"\r\n", b"\n\n"])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(parts=[b"INFO 11-30 10:00:00 [logger.py:71] ERROR"], cut=0)
@example(parts=[b"ERROR", b"\r", b"ERROR", b"\r\n", b"down"], cut=2)
@given(
    st.lists(_RECORD | _TERMINATOR | _MESSAGE | st.binary(max_size=8), max_size=30),
    st.integers(0, 40),
)
def test_candidates_equal_the_python_search(parts: list[bytes], cut: int) -> None:
    data = b"".join(parts)
    # the scanner looks for candidates from a record's start: the chunk's, or after a terminator
    starts = [0] + [i + 1 for i, b in enumerate(data) if b in b"\r\n"]
    pos = starts[cut % len(starts)]
    for mode in ("serving", "startup"):
        c, py = both(data, pos, mode)  # type: ignore[arg-type]
        assert c == py, (mode, pos)


@pytest.mark.parametrize("name", ["serving", "load"])
@pytest.mark.parametrize("crlf", [False, True])
def test_candidates_equal_on_generated_logs(name: str, crlf: bool) -> None:
    data = (serving_log() if name == "serving" else load_log())[0][:400_000]
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    for mode in ("serving", "startup"):
        c, py = both(data, 0, mode)  # type: ignore[arg-type]
        assert c == py
        found, quiet = c  # type: ignore[misc]
        assert found  # the comparison is about something
        if name == "serving" and mode == "serving":
            assert sum(count for _s, count, _e, _t in quiet) > 100


_TRICKY = st.sampled_from([b"6m", b"0m", b"m", b"\x1b", b" pid=", b"pid=", b"=", b" ", b"x"])


@settings(max_examples=800, deadline=None)
@example(record=b"(A pid=1) DEBUG 11-30 10:00:00.123456 [logger.py:71] ERR6m")
@example(record=b"INFO 11-30 10:00:00 [x.py:1] 0m")
@example(record=b"INFO 11-30 10:00:00 [x.py:1] \x1b")
@example(record=b"INFO 11-30 10:00:00 [x.py:1] a (B pid=2)")
@example(record=b"(A pid=1) INFO 11-30 10:00:00 [x.py:1] m=")
@given(
    _RECORD
    | st.tuples(_PREFIX, _FRACTION, st.lists(_TRICKY, max_size=6)).map(
        lambda t: t[0] + b"INFO 11-30 10:00:00" + t[1] + b" [x.py:1] " + b"".join(t[2])
    )
)
def test_quiet_headers_equal_quiet_record(record: bytes) -> None:
    line = record.replace(b"\n", b"").replace(b"\r", b"") + b" ERROR"
    _, quiet = _scan.candidates(line, 0, ((b"ERROR", None, True),), True)
    want = quiet_record(line, 0, len(line))
    assert (quiet[0][3] if quiet else None) == want


@given(st.lists(st.sampled_from([b"a", b"\n", b"\r", b"\r\n", b"xyz"]) | st.binary(max_size=5)))
def test_count_records_equals_python(parts: list[bytes]) -> None:
    data = b"".join(parts)
    assert count_records(data) == count_records_py(data)
    assert _scan.count_records(data) == count_records_py(data)


def test_bad_plans_are_refused_with_a_clear_error() -> None:
    for groups in (((b"", None, False),), (("ERROR", None, False),), ((b"E", [b"E"], False),)):
        with pytest.raises(TypeError, match="groups"):
            _scan.candidates(b"ERROR\n", 0, groups, False)  # type: ignore[arg-type]


def test_more_than_64_groups_and_short_anchors_are_searched_too() -> None:
    # beyond one pass's limits the C module falls back to one search per anchor
    groups = (*tuple((b"w%03d" % i, None, False) for i in range(70)), (b"ab", None, False))
    data = b"x w069 y\nab\nnothing\nw000\n"
    found, quiet = _scan.candidates(data, 0, groups, False)
    assert found == [(0, 8), (9, 11), (20, 24)] and quiet == []


# -- runs of plain k/v scale warnings: _kvrun.c against parsers/vllm/kvrun.py ---------------------

try:
    from loadwatch.parsers.vllm import _kvrun
except ImportError:  # the test below says so
    _kvrun = None  # type: ignore[assignment]

_KV = (
    b"(Worker_TP0 pid=51300) WARNING 01-28 00:12:58 [weight_utils.py:1398] Found k_scale in the "
    b"checkpoint (e.g. language_model.model.layers.1.self_attn.k_scale), but not found the "
    b"expected name in the model (e.g. language_model.model.layers.1.self_attn.mla_attn.k_scale)."
    b" k_scale is not loaded."
)  # tests/fixtures/v1-2026-sm120.log
_KV_PIECES = st.sampled_from(
    [
        b"v",
        b"k",
        b"(",
        b")",
        b" ",
        b"0m",
        b"6m",
        b"layers.",
        b"layer.",
        b"1234567",
        b".",
        b"9",
        b"02-29",
        b"12-31",
        b"00",
        b"\r",
        b"\n",
        b"\xff",
        b"-",
        b"_",
        b"WARNING",
        b"] ",
        b" pid=",
    ]
)


def _mutated(
    draw: st.DrawFn, line: bytes, pieces: st.SearchStrategy[bytes], times: int, width: int
) -> bytes:
    """`line` with up to `times` spans of up to `width` bytes replaced by one of `pieces`."""
    for _ in range(draw(st.integers(0, times))):
        i = draw(st.integers(0, len(line)))
        j = draw(st.integers(i, min(len(line), i + draw(st.integers(0, width)))))
        line = line[:i] + draw(pieces) + line[j:]
    return line


@st.composite
def kv_bytes(draw: st.DrawFn) -> bytes:
    out = [_mutated(draw, _KV, _KV_PIECES, 3, 8) for _ in range(draw(st.integers(1, 5)))]
    return draw(st.sampled_from([b"\n", b"\r\n", b"\r"])).join(out) + draw(
        st.sampled_from([b"\n", b""])
    )


def test_the_c_kv_run_is_built() -> None:
    assert _kvrun is not None, "parsers/vllm/_kvrun.c did not build: is a C compiler there?"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kv_bytes(), st.integers(0, 3))
@example(_KV.replace(b"01-28", b"02-30"), 0)  # no such day: the stream has no time for it
@example(_KV.replace(b"01-28", b"04-31"), 0)
@example(_KV + b"\n" + _KV.replace(b"00:12:58", b"00:12:57"), 0)  # the stamp goes back
@example(_KV.replace(b"layers.1.", b"layers.1234567.").replace(b"mla_attn", b"layer.3.x"), 0)
def test_c_kv_run_equals_python(data: bytes, skip: int) -> None:
    from loadwatch.parsers.vllm.kvrun import kv_run

    start = 0
    for _ in range(skip):  # also from a later record's start
        nl = data.find(b"\n", start)
        start = nl + 1 if nl >= 0 else start
    assert _kvrun.kv_run(data, start) == kv_run(data, start)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 50))
def test_c_kv_run_equals_python_on_any_bytes(data: bytes, start: int) -> None:
    from loadwatch.parsers.vllm.kvrun import kv_run

    start = min(start, len(data))
    assert _kvrun.kv_run(data, start) == kv_run(data, start)


def test_kv_runs_on_the_generated_load_log() -> None:
    from loadwatch.parsers.vllm.kvrun import kv_run

    data, _counts = load_log()
    pos = runs = 0
    while (i := data.find(b") WARNING ", pos)) >= 0:
        s = data.rfind(b"\n", 0, i) + 1
        got = _kvrun.kv_run(data, s)
        assert got == kv_run(data, s)
        runs += got is not None
        pos = (got[0] if got is not None else i) + 1
    assert runs > 10


# -- a load's run across its bars: _kvrun.c's load_run against kvrun.py's ------------------------

_BARS = [  # tests/fixtures/v1-2026-sm120.log: a bar record after its lone prefix and `\r`
    b"(Worker_TP0 pid=51300) \rLoading safetensors checkpoint shards:   0% Completed | 0/119 "
    b"[00:00<?, ?it/s]",
    b"(Worker_TP0 pid=51300) \rLoading safetensors checkpoint shards:   1% Completed | 2/119 "
    b"[00:17<16:50, 8.64s/it]",
    b"(Worker_TP0 pid=51300) \rLoading safetensors checkpoint shards: 100% Completed | 119/119 "
    b"[15:31<00:00, 7.83s/it]",
]
_BAR_PIECES = st.sampled_from(
    [
        b"?",
        b"s/it",
        b"it/s",
        b"%",
        b"|",
        b":",
        b" ",
        b"Completed",
        b"1234567890",
        b".",
        b"0m",
        b"\r",
        b"\n",
        b"(",
        b")",
        b"[",
        b"]",
        b",",
        b"\xff",
        b"9",
        b" pid=",
    ]
)


@st.composite
def load_bytes(draw: st.DrawFn) -> bytes:
    """k/v warning records and bar pairs in any order, some mutated."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            out.append(_mutated(draw, draw(st.sampled_from(_BARS)), _BAR_PIECES, 2, 6))
        else:
            out.append(_mutated(draw, _KV, _KV_PIECES, 2, 6))
    return draw(st.sampled_from([b"\n", b"\r\n"])).join(out) + draw(st.sampled_from([b"\n", b""]))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(load_bytes(), st.integers(0, 3))
@example(_KV + b"\n" + _BARS[1] + b"\n" + _KV + b"\n", 0)
@example(_KV + b"\n" + _BARS[1].replace(b"8.64s/it", b"1234567890s/it") + b"\n", 0)
@example(_KV + b"\n" + _BARS[0].replace(b"Loading", b"L0ma") + b"\n" + _KV, 0)
def test_c_load_run_equals_python(data: bytes, skip: int) -> None:
    from loadwatch.parsers.vllm.kvrun import load_run

    start = 0
    for _ in range(skip):
        nl = data.find(b"\n", start)
        start = nl + 1 if nl >= 0 else start
    assert _kvrun.load_run(data, start) == load_run(data, start)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(0, 50))
def test_c_load_run_equals_python_on_any_bytes(data: bytes, start: int) -> None:
    from loadwatch.parsers.vllm.kvrun import load_run

    data = _KV + b"\n" + data  # a run can start: what follows decides how far it goes
    assert _kvrun.load_run(data, start) == load_run(data, start)


def test_load_runs_on_the_generated_load_log() -> None:
    from loadwatch.parsers.vllm.kvrun import load_run

    data, _counts = load_log()
    pos = runs = bars = 0
    while (i := data.find(b") WARNING ", pos)) >= 0:
        s = data.rfind(b"\n", 0, i) + 1
        got = _kvrun.load_run(data, s)
        assert got == load_run(data, s)
        if got is not None:
            runs += 1
            bars += sum(1 for piece in got[1] if len(piece) != 2)
        pos = (got[0] if got is not None else i) + 1
    assert runs >= 1 and bars > 100  # a load's warnings and bars: few runs, long ones
