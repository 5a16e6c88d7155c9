"""Records and chunks from one file: terminators, partial records, the cap, bounds, health."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.follower import FileIdentity, FollowerError, LogFollower, Position
from loadwatch.parsers import ChunkScanner, split_records
from tests.follower.helpers import Collector
from tests.helpers import append


def test_records_split_on_lf_crlf_and_lone_cr(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"one\ntwo\r\nbar 1/3\rbar 2/3\rbar 3/3\nlast")
    f = LogFollower(log)
    chunks = f.read()
    assert b"".join(c.data for c in chunks) == b"one\ntwo\r\nbar 1/3\rbar 2/3\rbar 3/3\n"
    records = [r.text for c in chunks for r in split_records(c.data, c.offset, c.file_id)]
    assert records == ["one", "two", "bar 1/3", "bar 2/3", "bar 3/3"]
    assert f.health().records_total == 5
    assert f.position() is not None and f.position().offset == len(chunks[-1].data)  # type: ignore[union-attr]


def test_partial_record_is_held_until_its_terminator(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"INFO first\nINFO sec")
    f = LogFollower(log)
    assert [c.data for c in f.read()] == [b"INFO first\n"]
    assert f.read() == []
    append(log, b"ond half")
    assert f.read() == []
    append(log, b"\n")
    (chunk,) = f.read()
    assert (chunk.data, chunk.offset, chunk.next_offset) == (b"INFO second half\n", 11, 28)


def test_cr_record_is_emitted_as_soon_as_the_cr_arrives(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"Capturing CUDA graphs:  10%|#    | 7/67\r")
    f = LogFollower(log)
    (chunk,) = f.read()
    assert chunk.data.endswith(b"\r")
    append(log, b"Capturing CUDA graphs:  20%|##   | 14/67\r")
    (chunk,) = f.read()
    assert chunk.data == b"Capturing CUDA graphs:  20%|##   | 14/67\r"
    append(log, b"\nnext line\n")  # "\r" then "\n" across reads is one terminator, one record
    f.read()
    assert f.health().records_total == 3


def test_chunk_carries_offset_and_file_identity(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"alpha\nbeta\n")
    f = LogFollower(log)
    (chunk,) = f.read()
    ident = FileIdentity.parse(chunk.file_id)
    st = os.stat(log)
    assert (ident.dev, ident.ino, ident.fp_len) == (st.st_dev, st.st_ino, 11)
    assert chunk.offset == 0 and chunk.next_offset == 11


def test_long_record_is_cut_and_the_rest_skipped(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    cap = 64
    log.write_bytes(b"short\n" + b"A" * 1000 + b"\nafter\n")
    f = LogFollower(log, cap_bytes=cap)
    chunks = f.read()
    cut = [c for c in chunks if c.cut]
    assert len(cut) == 1
    assert cut[0].data == b"A" * cap + b"\n"
    assert (cut[0].offset, cut[0].next_offset) == (6, 1007)
    assert b"".join(c.data for c in chunks if not c.cut) == b"short\nafter\n"
    h = f.health()
    assert (h.cuts_total, h.records_total, h.bytes_total) == (1, 3, 1013)


def test_long_record_growing_slowly_is_cut_once(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    cap = 32
    log.write_bytes(b"")
    f = LogFollower(log, cap_bytes=cap)
    for _ in range(10):
        append(log, b"B" * 20)
        assert f.read() == []
    append(log, b"\rnext\n")
    chunks = f.read()
    assert [(c.data, c.cut) for c in chunks] == [(b"B" * 32 + b"\n", True), (b"next\n", False)]
    assert chunks[0].next_offset == 201


def test_record_of_exactly_the_cap_is_not_cut(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"C" * 31 + b"\n" + b"D" * 32 + b"\n")
    f = LogFollower(log, cap_bytes=32)
    chunks = f.read()
    assert [(c.data, c.cut) for c in chunks] == [
        (b"C" * 31 + b"\n", False),
        (b"D" * 32 + b"\n", True),
    ]


def test_reads_are_bounded_per_call(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    line = b"x" * 99 + b"\n"
    log.write_bytes(line * 10_000)  # 1,000,000 bytes
    f = LogFollower(log, cap_bytes=4096, max_read_bytes=64 * 1024)
    col = Collector(f)
    first = col.read()
    assert sum(len(c.data) for c in first) <= 64 * 1024
    # (a read is larger than the cap when the C scanner can tell its longest record; a chunk
    # holds whole records, none over the cap)
    assert all(c.data.endswith(b"\n") and max(map(len, c.data.split(b"\n"))) < 4096 for c in first)
    assert f.backlog
    calls = 1
    while f.backlog:
        col.read()
        calls += 1
    assert bytes(col.data) == line * 10_000
    assert calls >= 1_000_000 // (64 * 1024)


def test_chunks_feed_the_chunk_scanner(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(
        b"INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.9.0\n"
        b"WARNING 05-01 10:00:01 [config.py:2] something odd\n"
    )
    f = LogFollower(log)
    scanner = ChunkScanner()
    events = [e for c in f.read() for e in scanner.feed(c.data, c.offset, c.file_id)]
    assert f.health().records_total == 2
    assert any(e.type == "log_warning" and e.offset > 0 for e in events), events


def test_missing_file_then_created(tmp_path: Path) -> None:
    log = tmp_path / "later" / "deeper" / "vllm.log"
    f = LogFollower(log)
    assert f.read() == [] and f.position() is None
    h = f.health()
    assert not h.file_exists and h.errors_total == 0
    log.parent.mkdir(parents=True)
    log.write_bytes(b"hello\n")
    assert [c.data for c in f.read()] == [b"hello\n"]
    assert f.health().file_exists


def test_not_a_regular_file_is_one_error_line(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.mkdir()
    f = LogFollower(log)
    assert f.read() == []
    h = f.health()
    assert h.errors_total == 1 and h.last_error is not None
    assert "not a regular file" in h.last_error and "\n" not in h.last_error
    log.rmdir()
    log.write_bytes(b"ok\n")
    assert [c.data for c in f.read()] == [b"ok\n"]


def test_fifo_does_not_hang(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    os.mkfifo(log)
    f = LogFollower(log)
    assert f.read() == []
    assert f.health().errors_total == 1


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(FollowerError):
        LogFollower("/tmp/x.log", cap_bytes=0)
    with pytest.raises(FollowerError):
        LogFollower("/tmp/x.log", mode="fast")  # type: ignore[arg-type]
    with pytest.raises(FollowerError):
        LogFollower("/tmp/x.log", cap_bytes=1 << 20, max_read_bytes=1 << 10)


def test_health_counts(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    ticks = iter(range(100, 200))
    f = LogFollower(log, wall_clock=lambda: float(next(ticks)))
    f.read()
    h0 = f.health()
    assert h0.last_read_ts is None and h0.last_check_ts is not None
    log.write_bytes(b"a\nb\n")
    f.read()
    h = f.health()
    assert (h.records_total, h.bytes_total, h.file_exists) == (2, 4, True)
    assert h.last_read_ts is not None and h.last_read_ts > h0.last_check_ts
    assert h.file_id is not None and h.offset == 4
    assert h.mode is None  # nobody waited yet: no watcher


def test_identity_and_position_text_forms() -> None:
    ident = FileIdentity(2049, 123456, 256, "0123456789abcdef")
    assert FileIdentity.parse(str(ident)) == ident
    for bad in ["", "1:2:3", "1:2:3:xyz", "a:2:3:0123456789abcdef", "1:-2:3:0123456789abcdef"]:
        with pytest.raises(ValueError, match="not a file identity"):
            FileIdentity.parse(bad)
    pos = Position(str(ident), 42)
    assert Position.from_dict(pos.to_dict()) == pos
    with pytest.raises(ValueError):
        Position.from_dict({"file_id": str(ident), "offset": -1})
    with pytest.raises(ValueError):
        Position.from_dict({"file_id": "nope", "offset": 1})
