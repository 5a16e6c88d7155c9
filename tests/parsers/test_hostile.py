"""Hostile and arbitrary input: the parser never raises and stays linear."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadwatch.parsers import EventStream, Record, split_records
from loadwatch.parsers.scan import count_records
from tests.parsers.golden import REF_TS, events_of, scanned

MB = 1 << 20

HOSTILE = {
    "digits": "9" * MB,
    "spaces": " " * MB,
    "parens": "(" * MB,
    "nested_prefixes": "(Worker_TP0 pid=1) " * (MB // 19),
    "glued_prefixes": "x(Worker_TP0 pid=1) " * (MB // 20),
    "pid_soup": "(A pid=" * (MB // 7),
    "bar_lookalike": "Loading safetensors checkpoint shards: " + "1" * MB + "% Completed | 1/2 [",
    "bar_repeats": "desc: 50% Completed | 1/2 [00:01<" * (MB // 34),
    "found_scale": "Found " + "k_" * (MB // 2) + " in the checkpoint (e.g. x",
    "header_soup": "INFO 11-30 10:00:00 [" * (MB // 21),
    "exception_like": "a." * (MB // 2) + "Error: x",
    "warning_long": "WARNING 11-30 10:00:00 [x.py:1] " + "Traceback " * (MB // 10),
    "ansi": "\x1b[1;36m" * (MB // 7),
    "ansi_escless": "[1;36m" * (MB // 6),
    "classify_bait": "ERROR 11-30 10:00:00 [x.py:1] No valid attention backend" + " x" * (MB // 2),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_megabyte_record_parses_quickly(name: str) -> None:
    text = HOSTILE[name]
    stream = EventStream(ref_ts=REF_TS)
    start = time.perf_counter()
    stream.feed(Record(text, 0))
    stream.feed(Record("(EngineCore pid=2) ERROR 11-30 10:00:00 [x.py:1] " + text, 1))
    stream.flush()
    elapsed = time.perf_counter() - start
    # Catastrophic backtracking takes minutes on a megabyte; linear work takes milliseconds.
    # The bound is loose so a busy machine does not fail it; bench/ prints the real figures.
    assert elapsed < 2.0, f"{name}: {elapsed:.3f} s for 2 MB"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4000))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    events = events_of(data)
    assert all(e.offset <= len(data) for e in events)


_ALPHABET = st.sampled_from(
    [
        b"\n",
        b"\r",
        b"\r\n",
        b" ",
        b"(Worker_TP0 pid=7) ",
        b"(EngineCore_0 pid=9) ",
        b"INFO 11-30 10:00:0",
        b"ERROR 11-30 10:00:01 [core.py:1] ",
        b"WARNING 11-30 10:00:02 [w.py:2] ",
        b"Traceback (most recent call last):",
        b'  File "x.py", line 1, in f',
        b"ValueError: bad",
        b"RuntimeError: Engine core initialization failed",
        b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
        b"Capturing CUDA graphs (decode, FULL):  50%|##   | 5/10 [00:01<00:01, 5.0it/s]",
        b"Found k_scale in the checkpoint (e.g. model.layers.3.self_attn.k_scale), but not found the expected name in the model (e.g. model.layers.3.self_attn.attn.k_scale). k_scale is not loaded.",
        b"Starting to load model /m...",
        b"Application startup complete.",
        b"\x1b[1;36m",
        b"\x1b[0m",
        b"[1;36m",
        b"\xff\xfe",
        b"CUDA out of memory",
        b"x",
        b"0",
        b"pid=",
    ]
)


@settings(
    max_examples=int(os.environ.get("LOADWATCH_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(_ALPHABET, max_size=80), st.integers(min_value=1, max_value=400))
def test_chunk_scanner_equals_record_by_record(parts: list[bytes], chunk: int) -> None:
    data = b"".join(parts) + b"\n"
    assert scanned(data, chunk) == events_of(data)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ALPHABET, max_size=60))
def test_records_cover_every_non_terminator_byte(parts: list[bytes]) -> None:
    data = b"".join(parts)
    records = list(split_records(data))
    joined = b"".join(data[r.offset : r.offset + 1] for r in records)
    assert all(b not in b"\r\n" for b in joined)
    assert len(records) == len([s for s in data.replace(b"\r", b"\n").split(b"\n") if s])


def test_records_are_counted_once_for_crlf() -> None:
    assert count_records(b"a\nb\r\nc\rd\n") == 4


def test_yearless_times_follow_the_reference_across_new_year() -> None:
    from datetime import datetime

    from loadwatch.parsers.vllm.lines import YearResolver

    years = YearResolver(datetime(2026, 12, 31, 23, 0).timestamp())
    assert datetime.fromtimestamp(years.stamp("12-31 22:59:00") or 0).year == 2026
    years.set_reference(datetime(2027, 1, 2, 1, 0).timestamp())  # the daemon ran on
    assert datetime.fromtimestamp(years.stamp("01-02 00:30:00") or 0).year == 2027
    assert datetime.fromtimestamp(years.stamp("12-31 22:59:00") or 0).year == 2026
