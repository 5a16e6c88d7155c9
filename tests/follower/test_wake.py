"""The waking side: real inotify, polling, and the automatic fallback."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.follower import LogFollower
from loadwatch.daemon.sources.log.fs_kind import fs_type
from loadwatch.daemon.sources.log.inotify import IN_CREATE, IN_MODIFY, Inotify
from loadwatch.daemon.sources.log.wake import MISSES_TO_FALLBACK, SAFETY_POLL_S
from tests.follower.helpers import Collector, expected, line
from tests.helpers import append


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "logs" / "vllm.log"
    p.parent.mkdir()
    p.write_bytes(b"")
    return p


@pytest.fixture
def follower(log: Path) -> Iterator[LogFollower]:
    f = LogFollower(log, poll_interval_s=0.05)
    yield f
    f.close()


def later(delay_s: float, action: object) -> threading.Thread:
    """`action` from another thread `delay_s` from now: while the caller blocks in a wait."""

    def run() -> None:
        time.sleep(delay_s)  # (real: it must land while this thread blocks in the wait)
        action()  # type: ignore[operator]

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_write_wakes_the_waiter(log: Path, follower: LogFollower) -> None:
    follower.read()
    follower.wait(0.01)  # starts the watcher
    assert follower.health().mode == "inotify"
    t = later(0.2, lambda: append(log, b"hello\n"))
    start = time.monotonic()
    woke = follower.wait(5.0)
    took = time.monotonic() - start
    t.join()
    assert woke and took < 2.0
    assert [c.data for c in follower.read()] == [b"hello\n"]


def test_own_reads_and_other_files_do_not_wake(log: Path, follower: LogFollower) -> None:
    append(log, expected("o", 0, 50))
    follower.read()
    while follower.wait(0.2):  # let the events of the set-up pass
        follower.read()
    reader = LogFollower(log)  # opening and reading the file raise open/access/close events
    assert len(reader.read()) == 1
    reader.close()
    assert follower.wait(0.3) is False
    append(log.parent / "other.log", b"noise\n")
    assert follower.wait(0.3) is False
    append(log, b"x\n")
    assert follower.wait(2.0) is True


def test_poll_mode_reads_on_the_timer(log: Path) -> None:
    f = LogFollower(log, poll_interval_s=0.05, mode="poll")
    col = Collector(f)
    assert f.wait(0.01) is False
    assert f.health().mode == "poll"
    append(log, expected("p", 0, 3))
    assert f.wait() is False  # no events in poll mode: the interval passes
    col.read()
    assert bytes(col.data) == expected("p", 0, 3)
    f.close()


def test_auto_mode_polls_on_a_network_file_system(log: Path, tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
        f"98 22 0:51 / {log.parent} rw,relatime shared:40 - nfs4 filer:/export/logs rw,vers=4.2\n"
    )
    f = LogFollower(log, poll_interval_s=0.05, mountinfo=str(mountinfo))
    f.wait(0.01)
    h = f.health()
    assert h.mode == "poll" and h.mode_reason is not None and "nfs4" in h.mode_reason
    f.close()


def test_fs_type_reads_mountinfo_with_escapes(tmp_path: Path) -> None:
    spaced = tmp_path / "with space"
    spaced.mkdir()
    escaped = str(spaced).replace(" ", "\\040")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw - ext4 /dev/vda rw\n"
        f"23 22 0:22 / {escaped} rw - cifs //srv/share rw\n"
        "garbage line\n"
    )
    assert fs_type(spaced / "x.log", str(mountinfo)) == "cifs"
    assert fs_type(tmp_path / "elsewhere.log", str(mountinfo)) == "ext4"
    assert fs_type(tmp_path, str(tmp_path / "no-such-mountinfo")) is None


def test_auto_mode_falls_back_when_events_do_not_arrive(log: Path, tmp_path: Path) -> None:
    """Writes through a hard link in another directory raise no event on the log's directory:
    the same silence a network file system gives for writes made on another host."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.link(log, elsewhere / "vllm.log")
    f = LogFollower(log, poll_interval_s=0.03)
    col = Collector(f)
    f.wait(0.01)
    assert f.health().mode == "inotify"
    fd = os.open(elsewhere / "vllm.log", os.O_WRONLY | os.O_APPEND)
    written = 0

    def write_then_look() -> bool:
        """A line between reads: the next wake is the timer's, and its read finds data."""
        nonlocal written
        os.write(fd, line("h", written))
        written += 1
        return f.health().mode == "poll"

    try:
        col.pump(write_then_look, timeout_s=10)
    finally:
        os.close(fd)
    col.settle(0.2)
    h = f.health()
    assert h.mode_reason is not None and "no change events" in h.mode_reason
    n = bytes(col.data).count(b"\n")
    assert n >= MISSES_TO_FALLBACK and bytes(col.data) == expected("h", 0, n)
    f.close()


def test_forced_inotify_never_falls_back(log: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.link(log, elsewhere / "vllm.log")
    f = LogFollower(log, poll_interval_s=0.02, mode="inotify")
    got = 0
    for i in range(3 * MISSES_TO_FALLBACK):
        append(elsewhere / "vllm.log", line("f", i))
        assert f.wait(0.02) is False  # no event: the timer wakes it
        got += len(f.read())
    assert f.health().mode == "inotify" and got == 3 * MISSES_TO_FALLBACK
    f.close()


def test_directory_removed_and_recreated_is_watched_again(log: Path, follower: LogFollower) -> None:
    follower.read()
    follower.wait(0.01)
    shutil.rmtree(log.parent)
    follower.read()
    assert not follower.health().file_exists
    follower.wait(0.1)
    log.parent.mkdir()
    log.write_bytes(b"back\n")
    follower.wait(0.1)  # sees the directory again and watches it
    follower.read()
    t = later(0.2, lambda: append(log, b"again\n"))
    assert follower.wait(5.0) is True
    t.join()
    assert [c.data for c in follower.read()] == [b"again\n"]


def test_wait_async_is_woken_from_the_observer_thread(log: Path, follower: LogFollower) -> None:
    async def main() -> tuple[bool, float, bool]:
        follower.read()
        await follower.wait_async(0.01)
        t = later(0.2, lambda: append(log, b"async\n"))
        start = time.monotonic()
        woke = await follower.wait_async(5.0)
        took = time.monotonic() - start
        t.join()
        quiet = await follower.wait_async(0.1)
        return woke, took, quiet

    woke, took, quiet = asyncio.run(main())
    assert woke and took < 2.0 and quiet is False
    assert [c.data for c in follower.read()] == [b"async\n"]


def test_follow_async_yields_chunks(log: Path, follower: LogFollower) -> None:
    async def main() -> bytes:
        got = bytearray()
        t = later(0.1, lambda: append(log, expected("a", 0, 20)))
        async for chunks in follower.follow_async():
            for c in chunks:
                got += c.data
            if len(got) >= len(expected("a", 0, 20)):
                break
        t.join()
        return bytes(got)

    assert asyncio.run(main()) == expected("a", 0, 20)


def test_follow_iterator_stops_when_asked(log: Path, follower: LogFollower) -> None:
    stop = threading.Event()
    append(log, expected("i", 0, 5))
    got = b"".join(c.data for chunks in _take(follower, stop) for c in chunks)
    assert got == expected("i", 0, 5)


def _take(f: LogFollower, stop: threading.Event) -> Iterator[list[object]]:
    for chunks in f.follow(stop):
        yield chunks  # type: ignore[misc]
        stop.set()


def test_symlinked_log_wakes_from_its_target_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "vllm-1.log").write_bytes(b"")
    link_dir = tmp_path / "current"
    link_dir.mkdir()
    link = link_dir / "vllm.log"
    link.symlink_to(data / "vllm-1.log")
    f = LogFollower(link, poll_interval_s=0.05)
    f.read()
    f.wait(0.01)
    t = later(0.2, lambda: append(data / "vllm-1.log", b"one\n"))
    assert f.wait(5.0) is True  # the write is in another directory than the link
    t.join()
    assert [c.data for c in f.read()] == [b"one\n"]
    (data / "vllm-2.log").write_bytes(b"two\n")  # the link is pointed at a new file
    tmp_link = link_dir / "vllm.log.tmp"
    tmp_link.symlink_to(data / "vllm-2.log")
    os.replace(tmp_link, link)
    f.wait(0.1)
    assert [c.data for c in f.read()] == [b"two\n"]
    t = later(0.2, lambda: append(data / "vllm-2.log", b"three\n"))
    assert f.wait(5.0) is True
    t.join()
    assert [c.data for c in f.read()] == [b"three\n"]
    assert f.health().mode == "inotify" and f.health().rotations_total == 1
    f.close()


def test_default_wait_is_the_poll_interval_or_the_safety_net(log: Path) -> None:
    polling = LogFollower(log, poll_interval_s=0.05, mode="poll")
    start = time.monotonic()
    polling.wait()
    assert 0.04 <= time.monotonic() - start < 0.5
    polling.close()
    watching = LogFollower(log, poll_interval_s=0.05)
    watching.wait(0.01)
    start = time.monotonic()
    assert watching.wait() is False
    assert time.monotonic() - start >= SAFETY_POLL_S * 0.9
    watching.close()


def test_a_read_gives_each_distinct_event_once(tmp_path: Path) -> None:
    # two files written in turn, 200 times each: the kernel merges an event only with the one
    # queued just before it, so 400 IN_MODIFY events wait; they say two things
    inotify = Inotify()
    try:
        inotify.add(str(tmp_path), IN_MODIFY | IN_CREATE)
        a, b = tmp_path / "vllm.log", tmp_path / "other.log"
        with open(a, "ab", buffering=0) as fa, open(b, "ab", buffering=0) as fb:
            for _ in range(200):
                fa.write(b"x\n")
                fb.write(b"y\n")
        got = [(e.mask, e.name) for e in inotify.read()]
        assert got == [
            (IN_CREATE, "vllm.log"),
            (IN_CREATE, "other.log"),
            (IN_MODIFY, "vllm.log"),
            (IN_MODIFY, "other.log"),
        ]
        assert inotify.read() == []  # nothing left queued
    finally:
        inotify.close()
