"""Restart after the log was rotated and compressed while the follower was down (logrotate's
`compress`, with and without `delaycompress`, numbered and dated names): the checkpoint's file
is found by its first bytes in the `.gz`, and read from the checkpoint on, then the newer files."""

from __future__ import annotations

import gzip
import os
import tempfile
from pathlib import Path

from loadwatch.daemon.sources.log.files import FINGERPRINT_BYTES
from loadwatch.daemon.sources.log.follower import LogFollower, Position
from loadwatch.daemon.sources.log.gzipped import inflate, inflate_into
from tests.follower.helpers import Collector, expected
from tests.follower.test_restart import append, compress, first_run, second_run


def test_renamed_and_compressed_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    append(log, expected("p", 100, 20))
    os.rename(log, f"{log}.1")
    compress(f"{log}.1")
    log.write_bytes(expected("p", 120, 80))
    data, h = second_run(log, state)
    assert data == expected("p", 100, 100)  # the compressed file's rest, then the new file
    assert h.start == "rotated"


def test_compressed_two_back_with_a_plain_one_between(log: Path, state: Path) -> None:
    """`delaycompress`: PATH.1 stays plain, PATH.2 (ours) is compressed."""
    first_run(log, state)
    append(log, expected("p", 100, 10))
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("p", 110, 10))
    os.rename(f"{log}.1", f"{log}.2")
    compress(f"{log}.2")
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("p", 120, 10))
    data, h = second_run(log, state)
    assert data == expected("p", 100, 30)
    assert h.start == "rotated"


def test_ours_and_a_newer_one_compressed(log: Path, state: Path) -> None:
    """`compress` without `delaycompress`, rotated twice: both rotated files are `.gz`."""
    first_run(log, state)
    append(log, expected("p", 100, 10))
    os.rename(log, f"{log}.1")
    compress(f"{log}.1")
    log.write_bytes(expected("p", 110, 10))
    os.rename(f"{log}.1.gz", f"{log}.2.gz")
    os.rename(log, f"{log}.1")
    compress(f"{log}.1")
    log.write_bytes(expected("p", 120, 10))
    data, h = second_run(log, state)
    assert data == expected("p", 100, 30)
    assert h.start == "rotated"


def test_dated_and_compressed_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    append(log, expected("p", 100, 20))
    os.rename(log, f"{log}-20261130")
    compress(f"{log}-20261130")
    log.write_bytes(expected("p", 120, 10))
    data, h = second_run(log, state)
    assert data == expected("p", 100, 30)
    assert h.start == "rotated"


def test_a_gz_cut_short_is_read_up_to_the_cut(log: Path, state: Path) -> None:
    """A compression that did not finish: what the data holds past the checkpoint is read."""
    first_run(log, state)
    append(log, expected("p", 100, 2000))
    os.rename(log, f"{log}.1")
    compress(f"{log}.1")
    gz = Path(f"{log}.1.gz")
    gz.write_bytes(gz.read_bytes()[:-2000])
    log.write_bytes(expected("n", 0, 10))
    data, h = second_run(log, state)
    assert h.start == "rotated"
    cut = data.index(expected("n", 0, 1))  # the new file's lines come after the salvage
    # its last record, cut mid-line, ends with the terminator a file we leave gets
    assert cut > len(expected("p", 100, 1000)) and data[cut - 1 : cut] == b"\n"
    assert expected("p", 100, 2000).startswith(data[: cut - 1])
    assert data[cut:] == expected("n", 0, 10)


def test_a_corrupt_or_foreign_gz_is_not_ours(log: Path, state: Path) -> None:
    """A `.gz` cut before its first bytes, or of other content, is not the checkpoint's file:
    gone, and the path is read from its start (both last written before the checkpoint, so not
    read as rotated away after it either)."""
    first_run(log, state)
    append(log, expected("p", 100, 20))
    os.rename(log, f"{log}.1")
    compress(f"{log}.1")
    gz = Path(f"{log}.1.gz")
    gz.write_bytes(gz.read_bytes()[:20])  # cut inside the gzip header's stream
    other = Path(f"{log}.2.gz")
    with gzip.open(other, "wb") as w:
        w.write(expected("q", 0, 200))
    for p in (gz, other):
        os.utime(p, (1_000_000_000, 1_000_000_000))
    log.write_bytes(expected("n", 0, 10))
    data, h = second_run(log, state)
    assert data == expected("n", 0, 10)
    assert h.start == "gone"


def test_where_finds_a_compressed_file_by_its_first_bytes(log: Path) -> None:
    data = expected("p", 0, 100)
    log.write_bytes(data)
    f = LogFollower(log)
    Collector(f).read()
    pos = f.position()
    f.close(checkpoint=False)
    assert pos is not None and pos.offset == len(data)
    os.rename(log, f"{log}.1")
    compress(f"{log}.1")
    log.write_bytes(expected("n", 0, 5))
    g = LogFollower(log)
    try:
        assert g.where(pos) == 1
        assert g.where(Position(pos.file_id, pos.offset + 1)) is None  # does not reach it
    finally:
        g.close(checkpoint=False)


def test_inflate_keeps_only_the_head_and_what_lies_after_the_offset(tmp_path: Path) -> None:
    content = expected("big", 0, 200_000)  # about 4.6 MB
    gz = tmp_path / "big.gz"
    with gzip.open(gz, "wb") as w:
        w.write(content)
    offset = len(content) - 300_000
    f = inflate(str(gz), offset)
    assert f is not None
    try:
        assert f.last_size == len(content)
        assert os.pread(f.fd, FINGERPRINT_BYTES, 0) == content[:FINGERPRINT_BYTES]
        assert os.pread(f.fd, len(content), offset) == content[offset:]
        on_disk = os.fstat(f.fd).st_blocks * 512
        if _holes_supported(tmp_path):
            assert on_disk < 1_000_000, on_disk  # not the 4.6 MB before the offset
    finally:
        f.close()
    assert inflate(str(tmp_path / "missing.gz")) is None
    (tmp_path / "plain.gz").write_bytes(b"not gzip at all\n")
    assert inflate(str(tmp_path / "plain.gz")) is None


def _holes_supported(where: Path) -> bool:
    with tempfile.TemporaryFile(dir=tempfile.gettempdir()) as t:
        t.seek(8 << 20)
        t.write(b"x")
        t.flush()
        return os.fstat(t.fileno()).st_blocks * 512 < (1 << 20)


def test_inflate_into_reads_every_member_and_says_why_it_ended_early(tmp_path: Path) -> None:
    a, b = expected("a", 0, 500), expected("b", 0, 500)
    gz = tmp_path / "x.gz"

    def inflated(data: bytes, keep_from: int = 0, head: int = 0) -> tuple[bytes, str | None]:
        gz.write_bytes(data)
        with tempfile.TemporaryFile() as out:
            why = inflate_into(str(gz), out, keep_from, head)
            out.seek(0)
            return out.read(), why

    two = gzip.compress(a) + gzip.compress(b)  # `cat x.gz y.gz`: one stream of both
    assert inflated(two) == (a + b, None)
    assert inflated(two + b"\0" * 64) == (a + b, None)  # zeros after the end: padding
    got, why = inflated(two + b"not gzip")
    assert got == a + b and why is not None and why.startswith("corrupt")
    got, why = inflated(gzip.compress(a)[:-20])  # cut short: all it holds, and why
    assert why == "cut short" and a.startswith(got) and len(got) > len(a) // 2
    got, why = inflated(gzip.compress(a), keep_from=3000, head=100)  # a hole between
    assert why is None and len(got) == len(a)
    assert got[:100] == a[:100] and got[3000:] == a[3000:] and got[100:3000] == bytes(2900)
