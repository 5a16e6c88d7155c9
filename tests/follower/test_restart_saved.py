"""Restart: finding the checkpoint's file by what the checkpoint kept of it at the save (its
first bytes, its modification time), not by the daemon's clock."""

from __future__ import annotations

import os
from pathlib import Path

from loadwatch.daemon.sources.log.checkpoint import Checkpoint, CheckpointStore
from loadwatch.daemon.sources.log.follower import LogFollower, Position
from tests.follower.helpers import Collector, expected
from tests.follower.test_restart import compress, second_run
from tests.helpers import append


def seen_empty(log: Path, state: Path) -> Checkpoint:
    """A follower that saw the log empty, stopped cleanly: the checkpoint it saved."""
    log.write_bytes(b"")
    f = LogFollower(log, state_dir=state)
    Collector(f).read()
    f.close()
    cp = CheckpointStore(state, log).load()
    assert cp is not None
    return cp


def test_gone_while_down_a_file_stamped_before_the_save_by_the_kernels_coarse_clock(
    log: Path, state: Path
) -> None:
    """The kernel stamps a file's mtime from a clock coarser than the one a process reads, so a
    file written just after the checkpoint's save can carry a time a few milliseconds before
    `saved_at`. What came after ours is decided by file times alone: ours as last seen
    (`file_mtime_ns`) against the rotated files'. Here ours was empty at the save; lines came,
    it was rotated and compressed away, and its compressed copy keeps a time before the save."""
    cp = seen_empty(log, state)
    assert cp.saved_at is not None and cp.file_mtime_ns is not None
    assert cp.file_mtime_ns == log.stat().st_mtime_ns
    stamp = cp.file_mtime_ns  # the next write in the same tick of that clock
    assert stamp < cp.saved_at * 1e9  # so by the daemon's clock it looks older than the save
    older = Path(f"{log}.5")  # last written before ours was: older than ours, not read
    older.write_bytes(expected("old", 0, 5))
    os.utime(older, ns=(stamp - 10**9, stamp - 10**9))
    append(log, expected("p", 0, 10))
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("p", 10, 5))  # (created while ours still holds its inode)
    compress(f"{log}.1")
    os.rename(f"{log}.1.gz", f"{log}.2.gz")  # ours, renamed again: a new inode, a new name
    os.utime(f"{log}.2.gz", ns=(stamp, stamp))
    data, health = second_run(log, state)
    assert data == expected("p", 0, 15)
    assert health.start == "gone"


def test_a_file_first_seen_empty_is_found_compressed_by_the_bytes_it_had_at_the_save(
    log: Path, state: Path
) -> None:
    """A file's identity is fixed when the follower first sees it; seen empty, it names the
    file by its inode alone, which a compressed copy does not keep. The checkpoint also keeps
    the file's first bytes at the save (`head`), so a restart finds it compressed and reads on
    after what was read, not from the start of it, and not as a file that is gone."""
    seen_empty(log, state)
    append(log, expected("p", 0, 10))
    data, _ = second_run(log, state)
    assert data == expected("p", 0, 10)
    cp = CheckpointStore(state, log).load()
    assert cp is not None and cp.file_id.split(":")[2] == "0"  # the identity: no bytes
    assert cp.head is not None and int(cp.head.split(":")[0]) > 0
    append(log, expected("p", 10, 5))
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("p", 15, 5))
    compress(f"{log}.1")
    data, health = second_run(log, state)
    assert data == expected("p", 10, 10)
    assert health.start == "rotated"


def test_another_file_first_seen_empty_is_found_compressed_by_its_saved_bytes(
    log: Path, state: Path
) -> None:
    """The checkpoint keeps the first bytes of the other files read too (`heads`): a file first
    seen empty, read, rotated away, and then compressed while the daemon is down is still
    found (`where`, as a restart looks for the file a session began in)."""
    ours = seen_empty(log, state).file_id  # the identity of an empty file: no bytes
    append(log, expected("p", 0, 10))
    os.rename(log, f"{log}.1")
    log.write_bytes(expected("q", 0, 5))
    data, _ = second_run(log, state)
    assert data == expected("p", 0, 10) + expected("q", 0, 5)
    cp = CheckpointStore(state, log).load()
    assert cp is not None and cp.file_id != ours and ours in cp.heads
    compress(f"{log}.1")
    f = LogFollower(log, state_dir=state)
    try:
        assert f.where(Position(ours, 0)) == 1
        assert f.where(Position(ours, 10**6)) is None  # it does not reach that far
    finally:
        f.close()
