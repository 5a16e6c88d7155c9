"""`loadwatch analyze` and `loadwatch events` on a gzip file (a rotated log logrotate compressed):
the same report as on the plain log, the compressed size beside its own, the inflated copy
deleted at the end; data cut short or corrupt is read up to where it ends, as a read error."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main

from .helpers import FIXTURES, REF_TS


def gz_copy(tmp_path: Path, name: str, data: bytes | None = None) -> tuple[Path, Path]:
    """The fixture as a plain file and as a gzip file, both with the reference mtime."""
    plain = tmp_path / name
    plain.write_bytes(data if data is not None else (FIXTURES / name).read_bytes())
    packed = tmp_path / f"{name}.gz"
    with gzip.open(packed, "wb") as w:
        w.write(plain.read_bytes())
    for p in (plain, packed):
        os.utime(p, (REF_TS, REF_TS))
    return plain, packed


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of its own, to see the inflated copy go."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.mark.parametrize("name", ["v1-2026-sm120.log", "real-v0.32-kv-too-small.log"])
def test_a_gzip_log_reads_as_the_plain_one(
    name: str, tmp_path: Path, tmpdir_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain, packed = gz_copy(tmp_path, name)
    code, out, err = run(["analyze", str(plain), "--json"], capsys)
    want = json.loads(out)
    gcode, gout, gerr = run(["analyze", str(packed), "--json"], capsys)
    got = json.loads(gout)
    assert (gcode, gerr) == (code, err)
    assert got["log"]["compressed_bytes"] == packed.stat().st_size
    assert want["log"]["compressed_bytes"] is None
    for doc in (want, got):
        doc["log"].pop("path"), doc["log"].pop("compressed_bytes")
    assert got == want  # sessions, verdict, line numbers, sizes: all the log's own
    code, text, _ = run(["analyze", str(packed)], capsys)
    assert "(gzip, " in text
    assert list(tmpdir_env.iterdir()) == []  # the inflated copy is gone

    code, plain_events, _ = run(["events", str(plain)], capsys)
    gcode, gz_events, gerr = run(["events", str(packed)], capsys)
    assert (gcode, gerr) == (0, "") and gz_events == plain_events and plain_events
    assert list(tmpdir_env.iterdir()) == []


def test_gzip_data_cut_short_is_read_up_to_the_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, packed = gz_copy(tmp_path, "v1-2026-sm120.log")
    raw = packed.read_bytes()
    packed.write_bytes(raw[: len(raw) * 2 // 3])
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    salvage = d.decompress(packed.read_bytes())  # all that the cut data holds
    code, out, err = run(["analyze", str(packed), "--json"], capsys)
    doc = json.loads(out)["log"]
    assert err == "" and code in (0, 1, 2)
    assert doc["size_bytes"] == len(salvage) and doc["records"] > 0
    assert doc["read_errors"] == 1 and "gzip data cut short" in doc["last_error"]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x1f\x8b" + b"not deflate data at all", "corrupt"),
        (gzip.compress(b"", mtime=0), "empty"),
        (gzip.compress(b"x" * 100, mtime=0)[:10], "cut short"),  # the header alone
    ],
    ids=["corrupt", "empty", "cut short"],  # the same in every test process (xdist compares them)
)
def test_a_gzip_file_with_no_log_in_it_is_one_line(
    data: bytes, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "vllm.log.2.gz"
    bad.write_bytes(data)
    code, out, err = run(["analyze", str(bad)], capsys)
    assert (code, out) == (65, "")
    assert err.startswith(f"loadwatch: {bad}: gzip data with no log in it (") and why in err
    assert len(err.splitlines()) == 1
