"""The C candidate search (parsers/_scan.c) returns what the Python one returns, on any bytes;
its event builder what the Python one builds.

`make test` builds the C module; a test here fails when it could not, so a missing compiler
cannot pass unnoticed as a slow scanner.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadwatch.parsers import ChunkScanner, EventStream, events
from loadwatch.parsers.dispatch import (
    Mode,
)
from loadwatch.parsers.events import Event, KvScaleWarning, ShardProgress, field_names, filler
from loadwatch.parsers.scan import NATIVE, count_records, count_records_py, long_record_py
from loadwatch.parsers.vllm.grammar import GRAMMAR
from loadwatch.parsers.vllm.plans import quiet_record
from loadwatch.parsers.vllm.process_names import distinct_prefixes_py
from tests.perf.logs import load_log, serving_log

NATIVE_PLANS = GRAMMAR.native_plans

try:
    from loadwatch.parsers import _scan
except ImportError:  # the test below says so
    _scan = None  # type: ignore[assignment]


@pytest.fixture(scope="module", autouse=True, params=["nibble pass", "pair pass"])
def vector_pass(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here on both searches of a few anchors (the nibble pass needs AVX2: where the
    CPU has none, both runs take the pair pass)."""
    if _scan is None:
        yield request.param
        return
    was = _scan.nibbles(request.param == "nibble pass")
    yield request.param
    _scan.nibbles(bool(was))


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
        b"ERROR \xff\xc3 not UTF-8 \xe2\x82",  # (decoded as the stream is fed: errors replaced)
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


_AROUND = st.sampled_from([b"(", b")", b"((", b" pid=", b"pid=7)", b"\n", b"\r", b" ", b"x" * 250])


@settings(max_examples=1000, deadline=None)
@example(parts=[b"(A pid=1) x\n(B rank=2 pid=3, ip=1.2.3.4) y (A pid=1)\n((C pid=4)"])
@example(parts=[b"(A pid=1) pid=2)", b"(A", b" pid=1)"])
@given(st.lists(_PREFIX | _AROUND | _MESSAGE | st.binary(max_size=6), max_size=30))
def test_distinct_prefixes_equal_the_regex(parts: list[bytes]) -> None:
    data = b"".join(parts)
    assert _scan.prefixes(data, 1 << 20) == distinct_prefixes_py(data)
    assert _scan.prefixes(data, 2) == distinct_prefixes_py(data)[:2]


@pytest.mark.parametrize("rare", [b" p", b"pi", b"id", b"d="])
def test_distinct_prefixes_whichever_pair_of_the_marker_is_looked_for(rare: bytes) -> None:
    # " pid=" is looked for by whichever of its pairs the first bytes hold least: first bytes
    # full of the other three make each one that pair in turn
    filler = b"".join(p * 400 for p in (b" p", b"pi", b"id", b"d=") if p != rare) + b"\n"
    data = filler + b"(A pid=1) x (B rank=2 pid=3) y\n" * 3 + filler + b"(C pid=4)\n(A pid=1)"
    assert (
        _scan.prefixes(data, 1 << 20)
        == distinct_prefixes_py(data)
        == [
            b"(A pid=1)",
            b"(B rank=2 pid=3)",
            b"(C pid=4)",
        ]
    )


def test_distinct_prefixes_equal_on_generated_logs() -> None:
    for data in (serving_log()[0][:2_000_000], load_log()[0][:2_000_000]):
        c = _scan.prefixes(data, 1 << 20)
        assert c == distinct_prefixes_py(data)
        assert len(c) > 1  # (the comparison is about something)


@given(
    st.lists(st.sampled_from([b"a", b"\n", b"\r", b"\r\n"]) | st.binary(max_size=5)),
    st.integers(-3, 40),
    st.integers(-3, 40),
)
def test_count_lines_equals_bytes_count(parts: list[bytes], start: int, end: int) -> None:
    data = b"".join(parts)
    assert _scan.count_lines(data, start, end) == data.count(b"\n", max(start, 0), max(end, 0))


# Parts long enough that the sixteen-byte blocks, and a lane's 255 of them, are crossed.
_LONG_PARTS = st.sampled_from(
    [b"a", b"\n", b"\r", b"\r\n", b"xyz", b"x" * 300, b"\n" * 40, b"\r\n" * 33, b"y\n" * 600]
) | st.binary(max_size=5)


@given(st.lists(_LONG_PARTS), st.integers(-1, 700))
def test_long_record_equals_python(parts: list[bytes], cap: int) -> None:
    data = b"".join(parts)
    for cr in (False, True):
        assert _scan.long_record(data, cap, cr) == long_record_py(data, cap, cr)


@given(st.lists(_LONG_PARTS), st.integers(-3, 9000), st.integers(-3, 9000))
def test_counts_of_long_data_equal_bytes_count(parts: list[bytes], start: int, end: int) -> None:
    data = b"".join(parts)
    assert _scan.count_lines(data, start, end) == data.count(b"\n", max(start, 0), max(end, 0))
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
    assert found == [(0, 8, "x w069 y"), (9, 11, "ab"), (20, 24, "w000")] and quiet == []


def _records_holding(data: bytes, pos: int, anchors: list[bytes]) -> list[tuple[int, int]]:
    """The records from `pos` (ended by `\\n`) that hold one of the anchors, found the plain way."""
    out, start = [], pos
    for end in [i for i in range(pos, len(data)) if data[i] == 10] + [len(data)]:
        if any(a in data[start:end] for a in anchors):
            out.append((start, end))
        start = end + 1
    return out


_PAIR_BYTES = st.sampled_from([b"a", b"b", b"N", b"o", b" ", b"\n", b"ab", b"No"])


@settings(max_examples=1500, deadline=None)
@example(anchors=[b"Noab", b"abab"], parts=[b"No"] * 20 + [b"\n", b"Noab"], cut=0)
@example(anchors=[b"Noab"], parts=[b"Noab", b"\n", b"Noab", b"\n", *[b"o"] * 20], cut=0)
@given(
    st.lists(
        st.lists(st.sampled_from([b"a", b"b", b"N", b"o", b" "]), min_size=4, max_size=7).map(
            b"".join
        ),
        min_size=1,
        max_size=16,
    ),
    st.lists(_PAIR_BYTES, max_size=300),
    st.integers(0, 40),
)
def test_few_anchors_are_found_by_their_pairs_wherever_they_lie(
    anchors: list[bytes], parts: list[bytes], cut: int
) -> None:
    # up to 16 anchors are looked for by a pair of each, chosen by how often it is seen in the
    # data's first bytes: whichever pair is chosen, in whatever block an anchor lies, each record
    # holding one is found once (a small alphabet: pairs of anchors and data collide often)
    data = b"".join(parts)
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == 10]
    pos = starts[cut % len(starts)]
    found, quiet = _scan.candidates(data, pos, tuple((a, None, False) for a in anchors), False)
    assert [(s, e) for s, e, _text in found] == _records_holding(data, pos, anchors)
    assert all(text == data[s:e].decode() for s, e, text in found) and quiet == []


def _event_classes() -> list[type[Event]]:
    """Every event class (`dataclass(slots=True)` leaves the class it replaced behind, with no
    slots of its own: not one of them)."""
    out: list[type[Event]] = []
    todo: list[type[Event]] = [Event]
    while todo:
        cls = todo.pop()
        if "__slots__" in vars(cls):
            out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


@pytest.mark.parametrize("cls", _event_classes(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("where", ["C", "Python"])
def test_fill_builds_what_the_python_filler_builds(
    cls: type[Event], where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if where == "Python":  # as where the C helper is not built
        monkeypatch.setattr(events, "_fill", None)
    names = field_names(cls)
    values = tuple(f"v{i}" for i in range(len(names)))  # (types do not matter to a slot)
    split = len(names) // 2
    made = filler(cls, names)(values[:split], *values[split:])
    assert type(made) is cls and tuple(getattr(made, n) for n in names) == values
    py = object.__new__(cls)
    for name, value in zip(names, values, strict=True):
        object.__setattr__(py, name, value)
    assert made == py


def test_fill_refuses_what_it_cannot_build() -> None:
    names = field_names(KvScaleWarning)
    slots = tuple(vars(Event).get(n) or vars(KvScaleWarning)[n] for n in names)
    values = (0, 1.0, "W", 1, "k", 2, None, None, False)
    assert _scan.fill(KvScaleWarning, slots, values[:4], *values[4:]) == KvScaleWarning(
        offset=0, ts=1.0, process="W", pid=1, scale="k", layer=2
    )
    with pytest.raises(TypeError, match="as many slots as values"):
        _scan.fill(KvScaleWarning, slots, values[:4])
    with pytest.raises(TypeError, match=r"object\.__new__"):
        _scan.fill(dict, (), ())
    with pytest.raises(TypeError, match="member descriptors"):
        _scan.fill(KvScaleWarning, ("offset",), (0,))
    with pytest.raises(TypeError, match="doesn't apply"):
        _scan.fill(ShardProgress, slots, values)
