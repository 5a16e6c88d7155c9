"""Restart from a checkpoint after each kind of change made while the follower was down."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.checkpoint import CheckpointStore, checkpoint_name
from loadwatch.daemon.sources.log.follower import FollowerHealth, LogFollower, Position
from tests.follower.helpers import Collector, WriterProcess, expected
from tests.follower.writer import dated, rotate
from tests.helpers import append


def first_run(log: Path, state: Path, lines: int = 100) -> bytes:
    """Write and read `lines` lines, then shut down cleanly (which saves the checkpoint)."""
    log.write_bytes(expected("p", 0, lines))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    f.close()
    assert bytes(col.data) == expected("p", 0, lines)
    return bytes(col.data)


def second_run(log: Path, state: Path) -> tuple[bytes, FollowerHealth]:
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    while f.backlog:
        col.read()
    health = f.health()
    f.close()
    return bytes(col.data), health


def compress(name: str) -> None:
    """`name` -> `name.gz`, as logrotate's compress leaves it (the plain file removed)."""
    with open(name, "rb") as src, gzip.open(f"{name}.gz", "wb") as dst:
        dst.write(src.read())
    os.unlink(name)


def test_appended_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    writer = WriterProcess(log, [["lines", "p", 100, 100, 10]])
    writer.finish()
    data, h = second_run(log, state)
    assert data == expected("p", 100, 100)
    assert h.start == "exact"


def test_nothing_changed_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    data, h = second_run(log, state)
    assert data == b"" and h.start == "exact"


@pytest.mark.parametrize("kind", ["rename", "copytruncate", "dateext", "dateext_copytruncate"])
def test_rotated_while_down(log: Path, state: Path, kind: str) -> None:
    first_run(log, state)
    plan: list[list[object]] = [
        ["lines", "p", 100, 20, 5],
        ["rotate", kind],
        ["lines", "p", 120, 80, 5],
    ]
    WriterProcess(log, plan).finish()
    data, h = second_run(log, state)
    assert data == expected("p", 100, 100)  # the old file's rest, then the new file
    assert h.start == "rotated"


def test_rotated_twice_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    plan: list[list[object]] = [
        ["lines", "p", 100, 10, 5],
        ["rotate", "rename"],
        ["lines", "p", 110, 10, 5],
        ["rotate", "copytruncate"],
        ["lines", "p", 120, 10, 5],
        ["rotate", "rename"],
        ["lines", "p", 130, 10, 5],
    ]
    WriterProcess(log, plan).finish()
    data, h = second_run(log, state)
    assert data == expected("p", 100, 40)
    assert h.start == "rotated"


def test_rotated_to_dated_names_twice_while_down(log: Path, state: Path) -> None:
    """logrotate `dateext`: the checkpoint's file is two dated names back; of the dated names
    only the newest `rotated_keep` are looked at, newest first."""
    for day in range(20261101, 20261111):  # older dated files of other days, not ours
        Path(f"{log}-{day}").write_bytes(expected("old", 0, 3))
        os.utime(f"{log}-{day}", (1_700_000_000 + day % 100, 1_700_000_000 + day % 100))
    first_run(log, state)
    plan: list[list[object]] = [
        ["lines", "p", 100, 10, 5],
        ["rotate", "dateext"],
        ["lines", "p", 110, 10, 5],
        ["rotate", "dateext"],
        ["lines", "p", 120, 10, 5],
    ]
    WriterProcess(log, plan).finish()
    data, h = second_run(log, state)
    assert data == expected("p", 100, 30)
    assert h.start == "rotated"


def test_deleted_and_recreated_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    plan: list[list[object]] = [["rotate", "delete"], ["lines", "q", 0, 50, 5]]
    WriterProcess(log, plan).finish()
    data, h = second_run(log, state)
    assert data == expected("q", 0, 50)  # the old file is gone: the new one from its start
    assert h.start == "gone"


def test_truncated_and_regrown_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    ino = os.stat(log).st_ino
    with open(log, "r+b") as w:  # same inode, new content longer than the old offset
        w.truncate(0)
        w.write(expected("q", 0, 300))
    assert os.stat(log).st_ino == ino
    data, h = second_run(log, state)
    assert data == expected("q", 0, 300)
    assert h.start == "gone"


def test_truncated_to_zero_while_down(log: Path, state: Path) -> None:
    first_run(log, state)
    os.truncate(log, 0)
    append(log, expected("q", 0, 5))
    data, h = second_run(log, state)
    assert data == expected("q", 0, 5)
    assert h.start == "gone"


def test_cut_back_below_the_checkpoint_while_down(log: Path, state: Path) -> None:
    """The same inode with the same first bytes, now shorter than the checkpoint's offset: cut
    back while we were away, so it is read from 0 (and said to have "changed", not "gone")."""
    first_run(log, state, lines=200)
    os.truncate(log, len(expected("p", 0, 50)))
    data, h = second_run(log, state)
    assert data == expected("p", 0, 50)
    assert h.start == "changed"
    assert h.truncations_total == 1


def test_inode_reuse_is_caught(log: Path, state: Path) -> None:
    first_run(log, state, lines=200)
    old_ino = os.stat(log).st_ino
    os.unlink(log)
    # A new file, often given the freed inode number: identity must not rest on it alone.
    log.write_bytes(expected("z", 0, 300))
    data, h = second_run(log, state)
    assert data == expected("z", 0, 300)
    assert h.start == "gone"
    assert h.file_id is not None
    assert h.file_id.split(":")[1] == str(os.stat(log).st_ino)
    assert old_ino > 0


def test_restart_in_the_middle_of_draining_a_rotated_file(log: Path, state: Path) -> None:
    log.write_bytes(expected("m", 0, 10))
    f = LogFollower(log, state_dir=state, cap_bytes=1024, max_read_bytes=1024)
    col = Collector(f)
    col.read()
    append(log, expected("m", 10, 400))
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("m", 410, 10))
    col.read()  # bounded: stops inside the old file
    assert f.backlog
    f.close()
    g = LogFollower(log, state_dir=state)
    col2 = Collector(g)
    col2.read()
    assert bytes(col.data) + bytes(col2.data) == expected("m", 0, 420)
    assert g.health().start == "rotated"


def test_crash_resumes_at_the_last_checkpoint(log: Path, state: Path) -> None:
    log.write_bytes(expected("c", 0, 50))
    f = LogFollower(log, state_dir=state)
    Collector(f).read()
    assert f.checkpoint()
    append(log, expected("c", 50, 50))
    Collector(f).read()
    f.close(checkpoint=False)  # a crash: the last 50 lines were never committed
    data, _ = second_run(log, state)
    assert data == expected("c", 50, 50)


def test_session_start_survives_restart_and_rotation(log: Path, state: Path) -> None:
    """The daemon keeps where the vLLM session began in `extra` and re-reads from there."""
    log.write_bytes(expected("old-session", 0, 20))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    assert f.maybe_checkpoint() is True  # the first one at once
    session_start = Position(col.chunks[-1].file_id, col.chunks[-1].next_offset)
    append(log, expected("s", 0, 30))
    col.read()
    assert f.maybe_checkpoint({"session_start": session_start.to_dict()}) is False  # not due
    f.close()  # the clean shutdown saves the extra given last
    rotate(str(log), os.open(log, os.O_WRONLY | os.O_APPEND), "rename")
    append(log, expected("s", 30, 10))

    g = LogFollower(log, state_dir=state)
    assert g.loaded_checkpoint is not None
    start = Position.from_dict(g.loaded_checkpoint.extra["session_start"])
    assert g.seek(start)
    rebuilt = Collector(g)
    rebuilt.read()
    assert bytes(rebuilt.data) == expected("s", 0, 40)  # the whole session, once
    g.close()


def test_seek_to_a_file_that_is_gone_keeps_the_place(log: Path, state: Path) -> None:
    log.write_bytes(expected("g", 0, 10))
    f = LogFollower(log)
    Collector(f).read()
    here = f.position()
    gone = Position("1:2:3:0123456789abcdef", 0)
    assert not f.seek(gone)
    assert f.position() == here
    assert not f.seek(Position("nonsense", 0))
    assert f.health().errors_total == 1


def test_start_at_overrides_the_checkpoint(log: Path, state: Path) -> None:
    log.write_bytes(expected("o", 0, 10))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    f.close()
    g = LogFollower(log, state_dir=state, start_at=Position(col.chunks[0].file_id, 0))
    again = Collector(g)
    again.read()
    assert bytes(again.data) == expected("o", 0, 10)


def test_corrupt_checkpoint_is_one_error_and_a_fresh_start(log: Path, state: Path) -> None:
    state.mkdir()
    (state / checkpoint_name(log)).write_text("{not json")
    log.write_bytes(expected("x", 0, 5))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    h = f.health()
    assert bytes(col.data) == expected("x", 0, 5)
    assert h.errors_total == 1 and h.last_error is not None and "unreadable" in h.last_error
    assert h.start == "fresh"
    assert f.checkpoint()  # and it is replaced by a good one
    assert CheckpointStore(state, log).load() is not None


def test_checkpoint_cadence(log: Path, state: Path) -> None:
    now = [0.0]
    f = LogFollower(
        log,
        state_dir=state,
        clock=lambda: now[0],
        checkpoint_every_records=100,
        checkpoint_every_s=10.0,
        checkpoint_min_interval_s=1.0,
    )
    log.write_bytes(expected("k", 0, 50))
    f.read()
    assert f.maybe_checkpoint()  # none was there to load: the first one at once
    append(log, expected("k", 50, 50))
    f.read()
    assert not f.maybe_checkpoint()  # 50 records, 0 s
    append(log, expected("k", 100, 50))
    f.read()
    assert not f.maybe_checkpoint()  # 100 records, but within a second of the last
    now[0] = 1.0
    assert f.maybe_checkpoint()  # 100 records
    assert not f.maybe_checkpoint()
    now[0] = 11.0
    assert not f.maybe_checkpoint()  # due by time, but nothing moved
    append(log, expected("k", 150, 1))
    f.read()
    now[0] = 22.0
    assert f.maybe_checkpoint()  # due by time, and moved
    assert not f.maybe_checkpoint({"a": 1})  # not due: extra kept for later
    now[0] = 33.0
    assert f.maybe_checkpoint()  # only the extra changed
    assert f.health().checkpoints_total == 4
    f.close(checkpoint=False)
    cp = CheckpointStore(state, log).load()
    assert cp is not None and cp.extra == {"a": 1} and cp.offset == len(expected("k", 0, 151))
    g = LogFollower(log, state_dir=state, clock=lambda: now[0], checkpoint_min_interval_s=1.0)
    g.read()
    assert not g.maybe_checkpoint()  # resumed from a checkpoint: no first one at once
    g.close(checkpoint=False)


def test_checkpoint_file_is_written_atomically(log: Path, state: Path) -> None:
    log.write_bytes(b"a\n")
    f = LogFollower(log, state_dir=state)
    f.read()
    for _ in range(5):
        assert f.checkpoint({"n": 1})
    assert sorted(p.name for p in state.iterdir()) == [checkpoint_name(log)]
    doc = json.loads((state / checkpoint_name(log)).read_text())
    assert doc["offset"] == 2 and doc["extra"] == {"n": 1} and doc["version"] == 1


def test_unwritable_state_dir_is_an_error_not_a_crash(log: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "state-is-a-file"
    blocker.write_text("")
    log.write_bytes(b"a\n")
    f = LogFollower(log, state_dir=blocker)
    assert f.health().errors_total == 1  # it could not even look for a checkpoint there
    f.read()
    assert not f.checkpoint()
    h = f.health()
    assert h.errors_total == 2 and h.last_error is not None and "cannot save" in h.last_error
    f.close()  # the failing final checkpoint does not raise either


def test_copy_of_the_log_elsewhere_is_not_confused_with_it(log: Path, state: Path) -> None:
    first_run(log, state)
    shutil.copyfile(log, f"{log}.bak")  # not a rotated name: ignored
    data, h = second_run(log, state)
    assert data == b"" and h.start == "exact"


def _first_identity(log: Path) -> str:
    """The identity a follower told nothing gives the log's file (its first chunk's)."""
    f = LogFollower(log)
    col = Collector(f)
    col.read()
    f.close(checkpoint=False)
    return col.chunks[0].file_id


def test_a_file_keeps_the_identity_it_was_given_before(log: Path, state: Path) -> None:
    """Identities compare as strings: a file first read when it was short (a fingerprint of
    fewer bytes) gets that same identity from a later follower that was told it, whether the
    file is reached by a checkpoint, a seek or as a newer file. A file cut back and written
    again in place (same inode, other first bytes) gets a new one."""
    log.write_bytes(b"short\n")
    short_id = _first_identity(log)
    assert short_id.split(":")[2] == "6"  # fingerprint over the 6 bytes there were
    append(log, expected("k", 0, 50))  # now far past the fingerprint's length

    told = LogFollower(log)
    told.know(short_id)
    col = Collector(told)
    col.read()
    assert {c.file_id for c in col.chunks} == {short_id}
    told.close(checkpoint=False)
    assert _first_identity(log) != short_id  # not told: its own, longer one

    # a newer file after a seek into the older one: the identity it was told
    os.rename(log, f"{log}.1")
    log.write_bytes(b"new\n")
    new_id = _first_identity(log)
    append(log, expected("n", 0, 50))
    h = LogFollower(log)
    h.know(new_id)
    assert h.seek(Position(short_id, 0))
    col = Collector(h)
    col.read()
    assert [c.file_id for c in col.chunks][-1] == new_id
    assert {c.file_id for c in col.chunks} == {short_id, new_id}
    h.close(checkpoint=False)

    # cut back and written again in place: the inode is the same, the first bytes are not
    with open(log, "r+b") as w:
        w.truncate(0)
        w.write(b"other\n")
    k = LogFollower(log)
    k.know(new_id)
    col = Collector(k)
    col.read()
    (ident,) = {c.file_id for c in col.chunks}
    assert ident != new_id and ident.split(":")[:2] == new_id.split(":")[:2]
    k.close(checkpoint=False)


def test_a_seek_names_the_checkpoints_file_as_the_checkpoint_does(log: Path, state: Path) -> None:
    """A position noted with another identity of the checkpoint's file (taken when the file was
    shorter): after a seek there, the file's records carry the checkpoint's identity."""
    log.write_bytes(b"short\n")
    short_id = _first_identity(log)
    append(log, expected("c", 0, 50))
    g = LogFollower(log, state_dir=state)
    Collector(g).read()
    g.close()  # the checkpoint, with this follower's identity of the file
    h = LogFollower(log, state_dir=state)
    assert h.loaded_checkpoint is not None
    cp_id = h.loaded_checkpoint.file_id
    assert cp_id != short_id and cp_id.split(":")[:2] == short_id.split(":")[:2]
    assert h.seek(Position(short_id, 0))
    col = Collector(h)
    col.read()
    assert {c.file_id for c in col.chunks} == {cp_id}
    assert bytes(col.data) == b"short\n" + expected("c", 0, 50)
    h.close(checkpoint=False)


def test_a_checkpoint_after_a_copytruncate_names_the_copy_not_the_empty_file(
    log: Path, state: Path
) -> None:
    """Stopped right after a copytruncate it followed (the path's file cut to nothing), the
    follower's checkpoint is the end of the records it delivered, in the file it read them from
    (now the copy), not the empty file: an identity of no bytes would name whatever that inode
    holds later. Down, the log gets more lines and is rotated the same way again, then again
    written: the restart reads exactly those two runs of lines."""
    log.write_bytes(expected("a", 0, 30))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    first_id = col.chunks[0].file_id
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    fd = rotate(str(log), fd, "copytruncate")
    assert Collector(f).read() == []  # the cut noticed, nothing new
    f.close()
    cp = json.loads((state / checkpoint_name(log)).read_text())
    assert (cp["file_id"], cp["offset"]) == (first_id, len(expected("a", 0, 30)))
    os.write(fd, expected("b", 0, 20))
    fd = rotate(str(log), fd, "copytruncate")
    os.write(fd, expected("c", 0, 10))
    os.close(fd)
    data, health = second_run(log, state)
    assert data == expected("b", 0, 20) + expected("c", 0, 10)
    assert health.start == "rotated"


def test_a_checkpoint_saved_after_an_unread_copytruncate_still_names_what_was_read(
    log: Path, state: Path
) -> None:
    """The file was first read while shorter than the bytes an identity holds (so the
    checkpoint keeps its longer first bytes apart), then copytruncated and written again, and
    the follower stopped before reading that. The checkpoint names the bytes it read, not what
    the file holds now: the restart finds the copy, and reads exactly the lines written after
    the copy (found in the rotated-away file, then the path). Seen by the log source's model
    test (a dated copytruncate, a stop, a dated rename while down)."""
    log.write_bytes(expected("a", 0, 2))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    append(log, expected("a", 2, 40))
    col.read()
    assert bytes(col.data) == expected("a", 0, 42)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    fd = rotate(str(log), fd, "dateext_copytruncate")
    os.write(fd, expected("b", 0, 6))
    f.close()  # before reading what came after the cut
    os.close(fd)
    os.rename(log, dated(str(log)))  # a dated rename while down
    log.write_bytes(expected("c", 0, 5))
    data, health = second_run(log, state)
    assert data == expected("b", 0, 6) + expected("c", 0, 5)
    assert health.start == "rotated"


def test_gone_while_down_reads_what_was_rotated_away_after_the_checkpoint(
    log: Path, state: Path
) -> None:
    """Ours rotated past the kept names (deleted) while down: the rotated files last written
    after the checkpoint was saved came after ours, and are read (oldest first) before the
    path; one last written before it is older than ours, and is not."""
    first_run(log, state)
    cp = CheckpointStore(state, log).load()
    assert cp is not None and cp.saved_at is not None
    saved_at = cp.saved_at
    older = Path(f"{log}.4")
    older.write_bytes(expected("old", 0, 5))
    os.utime(older, (saved_at - 100, saved_at - 100))
    append(log, expected("p", 100, 10))
    os.rename(log, f"{log}.3")  # ours, soon deleted
    log.write_bytes(expected("p", 110, 10))
    os.rename(log, f"{log}.2")
    compress(f"{log}.2")
    log.write_bytes(expected("p", 120, 10))
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("p", 130, 10))
    os.unlink(f"{log}.3")
    for n, name in enumerate((f"{log}.2.gz", f"{log}.1"), start=1):
        os.utime(name, (saved_at + n, saved_at + n))
    f = LogFollower(log, state_dir=state)
    col = Collector(f)
    col.read()
    assert bytes(col.data) == expected("p", 110, 30)  # 100..109 were in the deleted file
    assert f.start == "gone"
    assert f.recovered == (f"{log}.2.gz", f"{log}.1")
    f.close()
