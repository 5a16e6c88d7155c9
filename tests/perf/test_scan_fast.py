"""The scanner's shortcuts give exactly the events of feeding every record, on logs shaped like
the benchmarks' (dense per-layer warnings, `\\r` bars, request echoes that say ERROR)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadwatch.parsers import ChunkScanner, EventStream, Failure, KvScaleWarning, ShardProgress
from loadwatch.parsers.scan import address_of, count_records, first
from loadwatch.parsers.vllm.lines import (
    StandardHeads,
    YearResolver,
    parse_head,
    split_segments,
    strip_ansi,
)
from loadwatch.parsers.vllm.plans import PLANS, quiet_record
from loadwatch.parsers.vllm.segment import PREFILTER
from tests.parsers.golden import REF_TS, events_of, scanned
from tests.perf.logs import coloured, coloured_prefixes, load_log, serving_log

SERVING, SERVING_COUNTS = serving_log()
LOAD, LOAD_COUNTS = load_log()


@pytest.mark.parametrize(
    "name, data",
    [
        ("serving", SERVING),
        ("load", LOAD),
        ("serving-crlf", SERVING.replace(b"\n", b"\r\n")),
        ("load-coloured", coloured(LOAD)),
        ("serving-coloured", coloured(SERVING)),
        ("load-coloured-prefixes", coloured_prefixes(LOAD)),
    ],
)
@pytest.mark.parametrize("chunk", [977, 65536, 1 << 20])  # the last: several search windows
@pytest.mark.parametrize("native", [True, False], ids=["C", "python"])
def test_chunk_scanner_equals_record_by_record_on_generated_logs(
    name: str, data: bytes, chunk: int, native: bool
) -> None:
    assert scanned(data, chunk, native) == events_of(data)


def test_coloured_prefixes_read_as_the_plain_ones() -> None:
    """A load logged with its prefixes coloured (vLLM before 2025-11): the same events, its
    records read on the common path (`StandardHeads`: each prefix's text judged once), not
    stripped of codes and split one by one on the general path."""
    coloured_log = coloured_prefixes(LOAD)
    assert coloured_log.count(b"\x1b[1;36m(") > 1000
    heads = StandardHeads(YearResolver(REF_TS))
    warning = next(r for r in coloured_log.decode().split("\n") if "k_scale" in r)
    assert warning.startswith("\x1b[1;36m(Worker_TP")
    assert heads.head(warning) == parse_head(strip_ansi(warning), heads.years)
    plain, tinted = events_of(LOAD), events_of(coloured_log)
    assert [dataclasses.replace(e, offset=0) for e in tinted] == [
        dataclasses.replace(e, offset=0) for e in plain
    ]


FIXTURES = Path(__file__).parent.parent / "fixtures"
# A colour code whose ESC byte a copy lost (`[32m`): put back, as vLLM wrote it.
_ESCLESS = re.compile(r"\[([0-9]{1,3}(?:;[0-9]{1,3})*m)")


@pytest.mark.parametrize(
    "fixture, shape, records",
    [
        # vLLM on a terminal since 2025-11: prefix and header coloured (vLLM-Omni's docs)
        ("vllmomni-2026-tty-colours.log", r"\x1b\[90m\[", 6),
        # the header before 2025-02: `INFO 11-05 09:58:01 api_server.py:528] `
        (
            "v0-old-header.log",
            r"^[A-Z]{4,7} [0-9]{2}-[0-9]{2} [0-9:]{8} [a-z_0-9]+\.py:[0-9]+\] ",
            21,
        ),
    ],
)
def test_headers_of_every_age_and_colour_are_read_on_the_common_path(
    fixture: str, shape: str, records: int
) -> None:
    """Each record of a real log whose header vLLM coloured, or wrote in its older form, is read
    by `StandardHeads` (its header judged once per text), as the general path reads it once its
    codes are off; the log gives the same events with the codes as without."""
    text = (FIXTURES / fixture).read_text()
    tinted = _ESCLESS.sub("\x1b[\\1", text)
    heads = StandardHeads(YearResolver(REF_TS))
    of_shape = [r for r in tinted.splitlines() if re.search(shape, r)]
    assert len(of_shape) == records
    for record in of_shape:
        head = heads.head(record)
        assert head is not None and head.ts is not None, record
        assert head == parse_head(strip_ansi(record), heads.years)
    plain = strip_ansi(tinted).encode()
    assert [dataclasses.replace(e, offset=0) for e in events_of(tinted.encode())] == [
        dataclasses.replace(e, offset=0) for e in events_of(plain)
    ]


def test_request_echoes_are_quiet_and_never_failures() -> None:
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS))
    events = scanner.feed(SERVING)
    echoes = SERVING.count(b"Received request")
    bait = sum(
        1
        for line in SERVING.split(b"\n")
        if b"Received request" in line and (b"ERROR" in line or b"WARNING" in line)
    )
    assert echoes > 1000 and bait > 100
    assert scanner.quiet >= bait  # proven quiet by their header, not parsed
    failures = [e for e in events if isinstance(e, Failure)]
    for f in failures:
        line_start = SERVING.rfind(b"\n", 0, f.offset) + 1
        assert b"Received request" not in SERVING[line_start : SERVING.find(b"\n", f.offset)]
    assert sum(1 for f in failures if f.kind == "cuda_oom") == SERVING_COUNTS.oom_failures == 1


def test_dense_warnings_and_bars_are_all_found() -> None:
    events = ChunkScanner(EventStream(ref_ts=REF_TS)).feed(LOAD)
    assert sum(isinstance(e, KvScaleWarning) for e in events) == LOAD_COUNTS.kv_scale_warnings
    bars = [e for e in events if isinstance(e, ShardProgress)]
    assert len(bars) == LOAD_COUNTS.weight_updates
    assert all(b.process == "Worker_TP0" for b in bars)  # the prefix before each `\r` bar


def test_every_needle_belongs_to_exactly_one_scan() -> None:
    for mode, groups in PLANS.items():
        covered = [
            n.decode()
            for g in groups
            for n in (g.needles if g.needles is not None else (g.anchor,))
        ]
        assert sorted(covered) == sorted(PREFILTER[mode])
        for g in groups:
            assert g.needles is None or all(g.anchor in n for n in g.needles)
    assert len(PLANS["serving"]) < len(PREFILTER["serving"])
    assert len(PLANS["startup"]) < len(PREFILTER["startup"]) * 2 // 3


@pytest.mark.parametrize(
    "line, quiet",
    [
        (b"(APIServer pid=1) INFO 11-30 10:00:00 [logger.py:71] prompt: 'ERROR Traceback'", True),
        (b"INFO 11-30 10:00:00 [logger.py:71] prompt: 'CRITICAL'", True),
        (b"(APIServer pid=1) DEBUG 11-30 10:00:00 [x.py:1] WARNING in a prompt", True),
        (b"(APIServer pid=1) ERROR 11-30 10:00:00 [x.py:1] boom", False),
        (b"(APIServer pid=1) WARNING 11-30 10:00:00 [x.py:1] odd", False),
        (b"(APIServer pid=1) INFO 11-30 10:00:00 [x.py:1] a(Worker pid=2) ERROR 11-30 ...", False),
        (b"(APIServer pid=1) INFO 11-30 10:00:00 [x.py:1] \x1b[0m ERROR", False),
        (b"(APIServer pid=1) INFO 11-30 10:00:00 [x.py:1] [1;36m ERROR", False),
        (b"(APIServer pid=1) INFO:     10.0.0.1:1 - ERROR", False),  # uvicorn: not this shape
        (b"(APIServer pid=1) INFO 11-30 10:00:00 [x\xc2\xa0y.py:1] ERROR", False),  # NBSP in src
        (b"(APIServer pid=1)  INFO 11-30 10:00:00 [x.py:1] ERROR", False),  # two spaces
    ],
)
def test_quiet_record(line: bytes, quiet: bool) -> None:
    stamp = quiet_record(line, 0, len(line))
    assert (stamp == b"11-30 10:00:00") if quiet else stamp is None


@pytest.mark.parametrize(
    "data",
    [b"", b"a\n", b"a\r\nb\rc\n", b"\r" * 70 + b"\n" * 3, b"x\r", b"\r\n" * 100, b"a\rb\r\n\n"],
)
def test_count_records(data: bytes) -> None:
    assert count_records(data) == data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


_PARTS = st.sampled_from(
    [
        "(Worker_TP0 pid=7) ",
        "(VllmWorker rank=1 pid=9) ",
        "(VllmWorker PP0_TP1 pid=2) ",
        "(RayWorkerWrapper pid=5, ip=10.0.0.2) ",
        "(A pid=1)",
        "INFO ",
        "WARN ",
        "WARNING ",
        "ERROR ",
        "11-30 10:00:00",
        "02-30 10:00:00",
        ".123",
        "٣",
        " [x.py:1] ",
        " [a\u00a0b.py:1] ",
        " x.py:1] ",
        "] ",
        "]",
        " pid=",
        "\x1b[0m",
        "[1;36m",
        # a prefix coloured as vLLM before 2025-11 coloured it
        "\x1b[1;36m",
        "(Worker_TP0 pid=7)",
        "\x1b[0;0m ",
        "[3m",
        "[12;3m",
        " 15m",
        # a header coloured as vLLM colours it on a terminal since 2025-11
        "\x1b[32m",
        "INFO",
        "\x1b[90m",
        "\x1b[90m[x.py:1]\x1b[0m ",
        "]\x1b[0m ",
        # what launchers and collectors write before vLLM's line
        "vllm-1  | ",
        "Dec 06 10:00:00 gpu-node-1 vllm[4242]: ",
        "2025-08-12T08:42:32.1234567Z ",
        "[vllm]: ",
        " [repeated 3x across cluster]",
        "Found k_scale in the checkpoint (e.g. ",
        "msg ",
        " ",
        "(",
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
        # a bar with its process prefix in the same record (no header)
        "(Worker_TP0 pid=7) Loading safetensors checkpoint shards:  50% Completed | 1/2 "
        "[00:01<00:01,  1.00it/s]",
        "2025-11-21 10:26:22,420 - INFO - ",
        "[rank0]: ",
        "\t",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PARTS, min_size=1, max_size=12))
# a coloured prefix: `strip_ansi` then takes a code without its escape off the message too
@example(
    [
        "\x1b[1;36m",
        "(Worker_TP0 pid=7)",
        "\x1b[0;0m ",
        "INFO ",
        "11-30 10:00:00",
        " [x.py:1] ",
        "[3m",
    ]
)
# a header coloured by vLLM on a terminal (formatter.py's ColoredFormatter), after a coloured prefix
@example(
    [
        "\x1b[1;36m",
        "(Worker_TP0 pid=7)",
        "\x1b[0;0m ",
        "\x1b[32m",
        "INFO",
        "\x1b[0m ",
        "\x1b[90m",
        "11-30 10:00:00",
        "\x1b[0m ",
        "\x1b[90m[x.py:1]\x1b[0m ",
        "msg ",
    ]
)
# the header before 2025-02, its source without the opening bracket
@example(["(Worker_TP0 pid=7) ", "WARNING ", "11-30 10:00:00", " x.py:1] ", "msg "])
def test_standard_heads_equal_the_general_path(parts: list[str]) -> None:
    text = "".join(parts)
    years = YearResolver(REF_TS)
    heads = StandardHeads(years)
    for _ in range(2):  # the second time from its caches
        head = heads.head(text)
        if head is None:
            return
        segments = split_segments(strip_ansi(text))
        assert len(segments) == 1
        assert head == parse_head(segments[0], years)


# What docker compose writes before each line, and texts that look like it, near enough to
# meet another alternative of the collector grammar.
_COLUMNS = st.builds(
    lambda name, spaces, bar: name + " " * spaces + bar,
    st.text("aZ09_.-:[]( T", min_size=1, max_size=14),
    st.integers(0, 3),
    st.sampled_from(["| ", "|", "|  ", "| |"]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_COLUMNS, st.lists(_COLUMNS | _PARTS, max_size=8), st.lists(_PARTS, max_size=8))
@example("vllm-1  | ", [], ["(Worker_TP0 pid=7) ", "WARNING ", "11-30 10:00:00", " [x.py:1] "])
@example("Dec 06 | ", [], ["10:00:00 gpu-node-1 vllm[4242]: ", "INFO "])
@example("host |", [], ["x[12]: ", "INFO "])
def test_a_compose_column_seen_before_is_read_as_the_collector_grammar_reads_it(
    column: str, before: list[str], parts: list[str]
) -> None:
    """The column a record starts with is judged once (`StandardHeads` keeps it); every later
    record that starts with it, whatever follows, reads as the general path reads it."""
    years = YearResolver(REF_TS)
    heads = StandardHeads(years)
    for text in (column + "".join(before), column + "".join(parts)):
        head = heads.head(text)
        if head is not None:
            segments = split_segments(strip_ansi(text))
            assert len(segments) == 1
            assert head == parse_head(segments[0], years)


def test_the_compose_column_is_judged_once() -> None:
    heads = StandardHeads(YearResolver(REF_TS))
    lines = [
        f"vllm-1  | (Worker_TP{i} pid={i}) WARNING 11-30 10:00:0{i} [x.py:1] m" for i in range(8)
    ]
    assert [heads.spot(t) for t in lines] == [(f"Worker_TP{i}", i, 29) for i in range(8)]
    assert heads._columns == {"vllm-1  | ": True}  # (one judgement: the rest read it)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PARTS | st.sampled_from(["\u2003", "\n", "\x0b"]), min_size=1, max_size=8))
@example(["(Worker_TP0 pid=7) ", " "])
@example(["(Worker_TP0 pid=7) ", "(A pid=1)"])
@example(["(Worker_TP0 pid=7) ", "\x1b[0m"])
def test_says_more_only_where_the_general_path_finds_no_lone_prefix(parts: list[str]) -> None:
    text = "".join(parts)
    heads = StandardHeads(YearResolver(REF_TS))
    if heads.says_more(text):
        assert not parse_head(strip_ansi(text), heads.years).prefix_only


def test_says_more_of_the_records_a_serving_log_is_made_of() -> None:
    heads = StandardHeads(YearResolver(REF_TS))
    assert heads.says_more('(APIServer pid=9805) INFO 11-18 11:06:40 [a.py:1] "POST /v1 HTTP/1.1"')
    assert not heads.says_more("(Worker_TP0 pid=7) ")
    assert not heads.says_more("(Worker_TP0 pid=7) \x1b[0m")


@pytest.mark.parametrize("needle", [b"ERROR", b"Uvicorn running on", b"absent needle", b"\n"])
@pytest.mark.parametrize("span", [(0, None), (100, None), (5000, 70_000), (65_000, 65_010)])
def test_first_equals_bytes_find(needle: bytes, span: tuple[int, int | None]) -> None:
    data = SERVING[:200_000]
    start, end = span
    stop = len(data) if end is None else end
    assert first(data, address_of(data), needle, start, stop) == data.find(needle, start, stop)


_SERVING_PARTS = st.sampled_from(
    [
        b"\n",
        b"\r",
        b"\r\n",
        b"(APIServer pid=1) INFO:     Application startup complete.\n",
        b"(APIServer pid=1) INFO 11-30 10:00:00 [logger.py:71] prompt: 'ERROR and WARNING'",
        b"(APIServer pid=1) INFO 11-30 10:00:01 [logger.py:71] Traceback (most recent call last):",
        b"INFO 11-30 10:00:02 [x.py:1] CRITICAL in a prompt",
        b"(APIServer pid=1) WARNING 11-30 10:00:03 [w.py:2] odd",
        b"(EngineCore pid=2) ERROR 11-30 10:00:04 [c.py:3] Traceback (most recent call last):",
        b"(EngineCore pid=2) ERROR 11-30 10:00:04 [c.py:3] ValueError: bad",
        b"RuntimeError: Engine core initialization failed",
        b'  File "x.py", line 1, in f',
        b"(APIServer pid=1) INFO 11-30 10:00:05 [api_server.py:1] \xe2\x96\x84  version 0.1",
        b"(W pid=3) INFO 11-30 10:00:06 [r.py:4] Starting to load model /m...",
        b"(APIServer pid=1) INFO:     Shutting down",
        b"(APIServer pid=1) INFO 11-30 10:00:07 [shm.py:5] No available shared memory broadcast block found in 60 seconds",
        b"(W pid=3) \rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
        b"(W pid=3) ",
        b"x(W pid=4) ERROR 11-30 10:00:08 [m.py:6] mid-record",
        b" pid=",
        b"\x1b[0m",
        b"[1;36m",
        b"6m",
        b"\xff\xfe",
        b"ERROR",
        b"Traceback (most recent call last):",
    ]
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(  # a `\r` just before where the candidates are looked for again, after a traceback
    parts=[
        b"Traceback (most recent call last):",
        b"\n",
        b"\xff\xfe",
        b"\r",
        b"Traceback (most recent call last):",
    ],
    chunk=73,
    native=False,
)
@given(
    st.lists(_SERVING_PARTS, max_size=60), st.integers(min_value=1, max_value=600), st.booleans()
)
def test_serving_mode_scanner_equals_record_by_record(
    parts: list[bytes], chunk: int, native: bool
) -> None:
    data = b"".join(parts) + b"\n"
    assert scanned(data, chunk, native) == events_of(data)


_STARTED = b"(APIServer pid=1) INFO:     Application startup complete.\n"
_ECHO = b"(APIServer pid=1) INFO 11-30 10:00:00 [logger.py:71] prompt: 'ERROR'"


@pytest.mark.parametrize(
    "line, hidden",
    [
        # another process's ERROR line glued to a `\r`-only bar: a second segment (glued to
        # anything else, such as a request echo, it is the client's text)
        (
            b"(A pid=1) INFO 11-30 10:00:00 [x.py:1] Capturing CUDA graphs:  50%|#| 1/2 "
            b"[00:01<00:01,  1.00it/s](EngineCore pid=2) ERROR 11-30 10:00:01 [c.py:3] boom",
            "boom",
        ),
        # colour codes: stripped, the bracket is no header and the ERROR header further on is
        (b"(A pid=1) INFO 11-30 10:00:00 [0m] ERROR 11-30 10:00:01 [c.py:3] boom", "boom"),
        (b"(A pid=1) INFO 11-30 10:00:00 [6m] ERROR 11-30 10:00:01 [c.py:3] boom", "boom"),
        # an escape sequence inside a message: stripped, it reads "Shutting down"
        (
            b"(A pid=1) INFO 11-30 10:00:00 [launcher.py:1] Shut\x1b[1mting down ERROR",
            "Shutting down",
        ),
    ],
)
@pytest.mark.parametrize("crlf", [False, True])
def test_records_that_look_quiet_but_are_not(line: bytes, hidden: str, crlf: bool) -> None:
    data = _STARTED + _ECHO + b"\n" + line + b"\n" + _ECHO + b"\n"
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    want = events_of(data)
    assert any(hidden in (getattr(e, "message", "") or getattr(e, "value", "") or "") for e in want)
    for chunk in (len(data), 64, 7):
        assert scanned(data, chunk, native=True) == want
        assert scanned(data, chunk, native=False) == want
