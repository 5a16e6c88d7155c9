from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import pytest

from loadwatch.daemon.supervise.logsink import OutputPump, RotatingLog
from tests.helpers import wait_for


def _files(path: Path) -> list[Path]:
    rotated = sorted(path.parent.glob(path.name + ".*"), key=lambda p: -int(p.suffix[1:]))
    return [*rotated, path]


def _joined(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in _files(path))


def test_rotates_at_record_boundaries_and_concatenates_exactly(tmp_path: Path) -> None:
    path = tmp_path / "v.log"
    log = RotatingLog(str(path), max_bytes=100, backups=1000)
    rng = random.Random(7)
    pieces = [b"abc\n", b"\rbar 1/9", b"\rbar 2/9", b"\n", b"x" * 30 + b"\r\n", b"tail\r", b"\nz\n"]
    written = b""
    for _ in range(400):
        chunk = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        # Also split chunks at random points, as a pipe read may.
        cut = rng.randint(0, len(chunk))
        for part in (chunk[:cut], chunk[cut:]):
            if part:
                log.write(part)
                written += part
    log.close()
    assert _joined(path) == written
    files = _files(path)
    assert len(files) > 20 and log.rotations_total == len(files) - 1
    for older, newer in itertools.pairwise(files):
        data = older.read_bytes()
        # Over the limit only by the rest of the record that was open when it was reached.
        body = data.removesuffix(b"\n").removesuffix(b"\r")
        last_record_start = max(body.rfind(b"\n"), body.rfind(b"\r")) + 1
        assert last_record_start <= 100
        assert data.endswith(b"\n") or (
            data.endswith(b"\r") and not newer.read_bytes().startswith(b"\n")
        )


def test_keeps_only_n_backups(tmp_path: Path) -> None:
    path = tmp_path / "v.log"
    log = RotatingLog(str(path), max_bytes=10, backups=3)
    lines = [f"line {i:03d}\n".encode() for i in range(20)]  # 9 bytes each: one per file
    for ln in lines:
        log.write(ln)
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.log", "v.log.1", "v.log.2", "v.log.3"]
    assert _joined(path) == b"".join(lines[-4:])


def test_record_longer_than_limit_is_kept_whole(tmp_path: Path) -> None:
    path = tmp_path / "v.log"
    log = RotatingLog(str(path), max_bytes=16, backups=5)
    log.write(b"short\n")
    log.write(b"L" * 40)  # no terminator yet: stays in one file until it ends
    log.write(b"L" * 10 + b"\nnext\n")
    log.close()
    assert (tmp_path / "v.log.2").read_bytes() == b"short\n"
    assert (tmp_path / "v.log.1").read_bytes() == b"L" * 50 + b"\n"
    assert path.read_bytes() == b"next\n"


def test_appends_to_an_existing_log(tmp_path: Path) -> None:
    path = tmp_path / "v.log"
    path.write_bytes(b"old session\n")
    log = RotatingLog(str(path), max_bytes=1000, backups=2)
    log.write(b"new session\n")
    log.close()
    assert path.read_bytes() == b"old session\nnew session\n"


def test_write_errors_are_counted_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "v.log"
    path.parent.mkdir()
    log = RotatingLog(str(path), max_bytes=10, backups=2)
    os.chmod(path.parent, 0o755)
    path.parent.joinpath("v.log").unlink()
    path.parent.rmdir()  # the directory is gone: rotation cannot rename into it
    log.write(b"0123456789abc\n")
    log.write(b"more\n")
    assert log.errors_total >= 1 and log.last_error is not None
    assert "\n" not in log.last_error


def test_rejects_nonsense_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RotatingLog(str(tmp_path / "v.log"), max_bytes=0, backups=1)


def test_pump_copies_partial_records_immediately(tmp_path: Path) -> None:
    got: list[bytes] = []
    r, w = os.pipe()
    pump = OutputPump(r, got.append)
    pump.start()
    os.write(w, b"\rLoading:  50%|#####     | 1/2")
    wait_for(lambda: got, "the partial record copied", 5)
    assert got == [b"\rLoading:  50%|#####     | 1/2"]  # no newline needed
    os.write(w, b"\n")
    os.close(w)
    assert pump.join(5)
    assert pump.eof and b"".join(got).endswith(b"\n") and pump.bytes_total == 31


def test_pump_stop_ends_even_if_the_writer_never_closes() -> None:
    r, w = os.pipe()
    pump = OutputPump(r, lambda b: None)
    pump.start()
    os.write(w, b"x\n")
    pump.stop()
    assert pump.join(2)
    assert not pump.eof
    os.close(w)


def test_new_log_files_are_not_world_readable(tmp_path: Path) -> None:
    path = tmp_path / "v.log"
    log = RotatingLog(str(path), max_bytes=4, backups=2)
    log.write(b"abc\ndef\n")
    log.close()
    for p in (path, tmp_path / "v.log.1"):
        assert p.stat().st_mode & 0o007 == 0
