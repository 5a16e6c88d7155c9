"""The rotation matrix, live: a writer process rotates the log while the follower reads it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.follower import LogFollower
from tests.follower.helpers import Collector, WriterProcess, expected, line
from tests.follower.writer import rotate
from tests.helpers import wait_for


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "vllm.log"


@pytest.fixture
def follower(log: Path) -> Iterator[LogFollower]:
    f = LogFollower(log, poll_interval_s=0.05)
    yield f
    f.close()


def run_plan(log: Path, f: LogFollower, plan: list[list[object]], total: bytes) -> Collector:
    """Run the writer; at each ``wait`` step release it once everything so far has arrived."""
    col = Collector(f)
    writer = WriterProcess(log, plan)
    try:
        written = 0
        for step in plan:
            if step[0] == "wait":
                col.pump_bytes(written)
                writer.go()
            elif step[0] == "lines":
                _, tag, first, count, _ = step
                written += len(expected(str(tag), int(first), int(count)))  # type: ignore[call-overload]
        col.pump_bytes(len(total))
        writer.finish()
        col.settle(0.2)
    finally:
        writer.kill()
    assert bytes(col.data) == total
    return col


@pytest.mark.parametrize(
    "kind", ["rename", "copytruncate", "delete", "dateext", "dateext_copytruncate"]
)
def test_rotation_while_following(log: Path, follower: LogFollower, kind: str) -> None:
    # 200 lines seen, 200 more written and not yet read when the rotation happens, 200 after.
    plan: list[list[object]] = [
        ["lines", "r", 0, 200, 10],
        ["wait"],
        ["lines", "r", 200, 200, 200],
        ["rotate", kind],
        ["lines", "r", 400, 200, 10],
    ]
    run_plan(log, follower, plan, expected("r", 0, 600))
    h = follower.health()
    assert h.rotations_total == 1
    assert h.truncations_total == (1 if kind.endswith("copytruncate") else 0)
    assert h.file_exists and h.errors_total == 0
    assert h.file_id is not None and os.stat(log).st_ino == int(h.file_id.split(":")[1])


def test_truncate_to_zero(log: Path, follower: LogFollower) -> None:
    plan: list[list[object]] = [
        ["lines", "t", 0, 100, 10],
        ["wait"],
        ["truncate", 0],
        ["lines", "t", 100, 50, 10],
    ]
    run_plan(log, follower, plan, expected("t", 0, 150))
    assert follower.health().truncations_total == 1


def test_truncate_to_a_smaller_size_keeps_what_was_delivered(
    log: Path, follower: LogFollower
) -> None:
    keep = len(expected("s", 0, 40))
    plan: list[list[object]] = [
        ["lines", "s", 0, 100, 10],
        ["wait"],
        ["truncate", keep],
        ["lines", "s", 100, 50, 10],
    ]
    col = Collector(follower, contiguous=False)
    writer = WriterProcess(log, plan)
    try:
        col.pump_bytes(len(expected("s", 0, 100)))
        writer.go()
        col.pump_bytes(len(expected("s", 0, 150)))
        writer.finish()
        col.settle(0.2)
    finally:
        writer.kill()
    assert bytes(col.data) == expected("s", 0, 150)  # nothing twice, nothing lost
    assert col.chunks[-1].next_offset == os.path.getsize(log)
    assert follower.health().truncations_total == 1


def test_file_and_directory_not_existing_yet(log: Path, follower: LogFollower) -> None:
    assert not log.parent.exists()
    follower.read()
    follower.wait(0.01)
    assert follower.health().mode == "inotify"
    plan: list[list[object]] = [["sleep", 0.2], ["lines", "n", 0, 300, 7]]
    run_plan(log, follower, plan, expected("n", 0, 300))
    assert follower.health().file_exists


def test_file_not_existing_yet_in_existing_directory(log: Path, follower: LogFollower) -> None:
    log.parent.mkdir()
    follower.read()
    plan: list[list[object]] = [["sleep", 0.1], ["lines", "m", 0, 100, 1]]
    run_plan(log, follower, plan, expected("m", 0, 100))


@pytest.mark.parametrize("dated", [False, True])
def test_several_rotations_between_two_reads(log: Path, dated: bool) -> None:
    """Ours rotated, then the next file too, before the next read: read ours, then the newer
    rotated file, then PATH. Numbered (PATH.2 ours, PATH.1) or dated (logrotate's `dateext`:
    PATH-20261129 ours, PATH-20261130). Names that are not a date, and a `.gz` that is not
    gzip, are not rotated files of ours."""
    log.parent.mkdir()
    f = LogFollower(log)
    col = Collector(f)

    def rotate(day: int) -> None:
        if dated:
            os.rename(log, f"{log}-202611{day}")
        else:
            if os.path.exists(f"{log}.1"):
                os.rename(f"{log}.1", f"{log}.2")
            os.rename(log, f"{log}.1")

    log.write_bytes(expected("c", 0, 10))
    col.read()
    with open(log, "ab") as w:
        w.write(expected("c", 10, 5))
    rotate(29)
    log.write_bytes(expected("c", 15, 10))
    rotate(30)
    log.write_bytes(expected("c", 25, 10))
    Path(f"{log}-20261131.gz").write_bytes(expected("z", 0, 3))  # not gzip: nothing in it
    Path(f"{log}-backup").write_bytes(expected("z", 0, 3))  # not a date
    col.read()
    assert bytes(col.data) == expected("c", 0, 35)
    assert f.health().rotations_total == 2


def test_empty_new_file_waits_for_the_writer_to_move(log: Path) -> None:
    """logrotate `create` without an immediate reopen: the app writes to the old file a while."""
    log.parent.mkdir()
    f = LogFollower(log)
    col = Collector(f)
    old = open(log, "ab", buffering=0)  # noqa: SIM115
    old.write(expected("w", 0, 10))
    col.read()
    os.rename(log, f"{log}.1")
    log.write_bytes(b"")
    col.read()
    old.write(expected("w", 10, 10))  # still to the old file
    col.read()
    old.close()
    with open(log, "ab") as new:
        new.write(expected("w", 20, 10))
    col.read()
    assert bytes(col.data) == expected("w", 0, 30)
    assert f.health().rotations_total == 1


def test_unterminated_last_record_of_a_rotated_file(log: Path) -> None:
    log.parent.mkdir()
    f = LogFollower(log)
    log.write_bytes(b"one\npartial")
    assert [c.data for c in f.read()] == [b"one\n"]
    os.rename(log, f"{log}.1")
    log.write_bytes(b"two\n")
    chunks = f.read()
    assert [(c.data, c.cut) for c in chunks] == [(b"partial\n", True), (b"two\n", False)]
    assert chunks[0].offset == 4 and chunks[0].next_offset == 11
    assert f.health().unterminated_total == 1


def test_copytruncate_then_regrown_past_our_place_before_we_look(log: Path) -> None:
    """Size alone shows nothing here; the first bytes changed, and the copy holds our rest."""
    log.parent.mkdir()
    f = LogFollower(log)
    col = Collector(f)
    log.write_bytes(expected("g", 0, 100))
    col.read()
    with open(log, "ab") as w:
        w.write(expected("g", 100, 20))
    shutil.copyfile(log, f"{log}.1")
    os.truncate(log, 0)
    with open(log, "ab") as w:
        w.write(expected("g", 120, 300))
    assert os.path.getsize(log) > len(expected("g", 0, 120))
    col.read()
    assert bytes(col.data) == expected("g", 0, 420)
    h = f.health()
    assert (h.truncations_total, h.rotations_total) == (1, 1)


def test_truncated_and_regrown_in_place_without_a_copy(log: Path) -> None:
    log.parent.mkdir()
    f = LogFollower(log)
    col = Collector(f)
    log.write_bytes(expected("a", 0, 50))
    col.read()
    with open(log, "r+b") as w:  # same inode, new content longer than what we read
        w.truncate(0)
        w.write(expected("b", 0, 200))
    col.read()
    assert bytes(col.data) == expected("a", 0, 50) + expected("b", 0, 200)
    assert f.health().truncations_total == 1


def test_copytruncate_copy_found_two_generations_back(log: Path) -> None:
    log.parent.mkdir()
    f = LogFollower(log)
    col = Collector(f)
    log.write_bytes(expected("k", 0, 30))
    col.read()
    with open(log, "ab") as w:
        w.write(expected("k", 30, 5))
    shutil.copyfile(log, f"{log}.1")
    os.truncate(log, 0)
    os.rename(f"{log}.1", f"{log}.2")
    with open(log, "ab") as w:
        w.write(expected("k", 35, 5))
    shutil.copyfile(log, f"{log}.1")
    os.truncate(log, 0)
    with open(log, "ab") as w:
        w.write(expected("k", 40, 5))
    col.read()
    assert bytes(col.data) == expected("k", 0, 45)


def test_delete_without_recreate_then_recreate(log: Path, follower: LogFollower) -> None:
    log.parent.mkdir()
    col = Collector(follower)
    log.write_bytes(line("d", 0))
    col.read()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.unlink(log)
    os.write(fd, line("d", 1))  # the deleted file is still written to and still ours
    col.read()
    assert not follower.health().file_exists
    os.close(fd)
    log.write_bytes(line("d", 2))
    col.read()
    assert bytes(col.data) == expected("d", 0, 3)


def _rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(f.readline().split()[1])


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_copytruncate_in_the_middle_of_a_long_read(log: Path, tmp_path: Path) -> None:
    """A copytruncate, and the file growing past our place again, while one `read()` is still
    working through a backlog: every read is checked against the file's first bytes.

    The follower runs in a child process (64-byte reads, so a 1 MB backlog takes a while). Once
    it has read 100 kB into its backlog it is stopped with SIGSTOP, the log is copied, truncated
    and written again past its place, and it goes on: that same read must see the truncation and
    deliver the old lines, the copy's rest and the new lines, each once.
    """
    log.parent.mkdir()
    log.write_bytes(b"")
    out = tmp_path / "delivered.bin"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.follower.reader", str(log), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None

    def ask() -> None:  # one read()
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()

    def answer() -> dict[str, int]:  # what that read delivered and saw
        assert child.stdout is not None
        doc: dict[str, int] = json.loads(child.stdout.readline())
        return doc

    try:
        assert child.stdout.readline() == "ready\n"
        want = bytearray()
        hit = None
        for r in range(5):  # the stop lands after the read ended only if the child outran us
            old = expected(f"L{r}", 0, 30_000)
            new = expected(f"N{r}", 0, 50_000)
            with open(log, "ab") as w:
                w.write(old)
            want += old
            base = _rchar(child.pid)
            ask()
            deadline = time.monotonic() + 20
            while _rchar(child.pid) - base < 100_000:
                assert child.poll() is None and time.monotonic() < deadline, "the reader stopped"
            os.kill(child.pid, signal.SIGSTOP)
            try:
                wait_for(lambda: _stopped(child.pid), "the reader stopped", 10, every_s=0.001)
                rotate(str(log), -1, "copytruncate")
                with open(log, "ab") as w:
                    w.write(new)
            finally:
                os.kill(child.pid, signal.SIGCONT)
            want += new
            during = answer()
            ask()
            rest = answer()
            assert out.read_bytes() == bytes(want), r
            assert during["truncations"] + rest["truncations"] == 1
            if during["truncations"] == 1:
                hit = (during, rest)
                break
        assert hit is not None, "the child finished each read before it could be stopped"
        during, rest = hit
        assert during["bytes"] == len(old) + len(new)  # the read that saw it delivered it all
        assert rest == {"bytes": 0, "truncations": 0}
    finally:
        child.kill()
        child.wait()


def test_copytruncate_then_rename_between_two_reads(log: Path) -> None:
    """The file we read is copied and cut (copytruncate), written again, then renamed away
    (a second rotation, by rename) before we read again: the cut is seen at the old file's own
    size, so the copy's rest, the old file's new lines and the new file each come once."""
    log.parent.mkdir(parents=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, expected("a", 0, 20))
    f = LogFollower(log, poll_interval_s=0.05)
    col = Collector(f)
    col.read()
    os.write(fd, expected("a", 20, 5))  # after the read: in the copy only
    fd = rotate(str(log), fd, "copytruncate")
    os.write(fd, expected("b", 0, 10))
    fd = rotate(str(log), fd, "rename")
    os.write(fd, expected("c", 0, 10))
    os.close(fd)
    col.read()
    f.close()
    assert bytes(col.data) == expected("a", 0, 25) + expected("b", 0, 10) + expected("c", 0, 10)
