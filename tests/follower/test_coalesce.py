"""Waking costs per wake-up, not per line: the appends of a coalescing tick are read once, and
the waiting runs in the caller's thread (no observer threads)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from loadwatch.daemon.sources.log.follower import LogFollower
from loadwatch.daemon.sources.log.wake import Wake, Waker
from tests.follower.helpers import expected, line


def test_the_appends_of_a_tick_are_one_read_and_raise_no_second_wake(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    f = LogFollower(log, poll_interval_s=0.05, coalesce_s=0.3)

    async def main() -> tuple[bool, list[bytes], bool, int]:
        f.read()
        loop = asyncio.get_running_loop()
        threads = threading.active_count()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)

        def writer() -> None:  # a line per write, as vLLM's logging does, within the tick
            for i in range(20):
                os.write(fd, line("c", i))
                time.sleep(0.005)  # (real: the writes come spread over the tick, each an event)

        loop.call_later(0.05, lambda: threading.Thread(target=writer, daemon=True).start())
        woke = await f.wait_async(5.0)
        os.close(fd)
        chunks = [c.data for c in f.read()]
        again = await f.wait_async(0.2)  # the tick's own events were taken with it
        return woke, chunks, again, threads

    woke, chunks, again, threads = asyncio.run(main())
    assert woke and again is False
    assert b"".join(chunks) == expected("c", 0, 20) and len(chunks) == 1
    assert f.health().mode == "inotify"
    assert threading.active_count() == threads  # nothing but this thread waited
    f.close()


def test_arm_calls_back_once_without_a_task(tmp_path: Path) -> None:
    """The daemon's loop waits by callback: an event fires it (after the tick), a quiet path
    fires it on the timeout; a disarmed one never fires."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    f = LogFollower(log, poll_interval_s=0.05, coalesce_s=0.05)

    async def main() -> list[tuple[str, bool]]:
        f.read()
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, bool]] = []
        done = asyncio.Event()

        def on(name: str) -> object:
            def fire(event: bool) -> None:
                fired.append((name, event))
                done.set()

            return fire

        f.arm(loop, on("quiet"), 0.1)
        await done.wait()
        done.clear()
        f.arm(loop, on("write"), 5.0)
        loop.call_later(0.05, lambda: log.write_bytes(b"x\n"))
        await done.wait()
        disarm = f.arm(loop, on("disarmed"), 0.05)
        disarm()
        done.clear()
        f.arm(loop, on("later"), 0.1)  # its timeout comes after the disarmed one's would
        await done.wait()
        assert len(asyncio.all_tasks()) == 1  # this one: waiting made none
        return fired

    assert asyncio.run(main()) == [("quiet", False), ("write", True), ("later", False)]
    assert [c.data for c in f.read()] == [b"x\n"]
    f.close()


def test_a_stream_is_read_on_the_tick_and_a_rotation_in_it_wakes_at_once(tmp_path: Path) -> None:
    """While reads find data, the next is a tick later and the stream's writes raise no event
    (one per line, each to be read and dropped); a rotation within the tick wakes the reader at
    once, not a tick later."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    tick_s = 0.5
    waker = Waker(log, mode="inotify")

    async def main() -> tuple[list[Wake], float, float, int]:
        loop = asyncio.get_running_loop()
        wakes: list[Wake] = []
        with open(log, "ab", buffering=0) as w:
            woke: asyncio.Future[float] = loop.create_future()

            def fire(wake: Wake) -> None:
                wakes.append(wake)
                woke.set_result(loop.time())

            t0 = loop.time()
            waker.arm(loop, fire, 5.0, tick_s, streaming=True)
            before = waker.events_total
            for i in range(30):  # the stream: a line per write
                w.write(line("a", i))
                await asyncio.sleep(0.002)
            tick_after = await woke - t0
            writes_seen = waker.events_total - before
            woke = loop.create_future()
            t1 = loop.time()
            waker.arm(loop, fire, 5.0, tick_s, streaming=True)
            w.write(line("a", 30))
            os.rename(log, tmp_path / "vllm.log.1")
            log.write_bytes(line("b", 0))
            rotated_after = await woke - t1
        return wakes, tick_after, rotated_after, writes_seen

    wakes, tick_after, rotated_after, writes_seen = asyncio.run(main())
    assert wakes == ["tick", "event"]
    assert tick_s * 0.9 <= tick_after < tick_s + 0.3
    assert writes_seen == 0  # 30 writes, and no event was read for them
    assert rotated_after < tick_s / 2  # the rotation did not wait for the tick
    waker.close()


def test_writes_wake_again_once_a_stream_ends(tmp_path: Path) -> None:
    """A stream's writes raise no events. When its read finds nothing, the next wait asks for
    them again and reads once more a tick later: a line written between that read and the wait
    is read then, not by the safety net; after that, a write wakes the reader on its own."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    waker = Waker(log, mode="inotify")

    async def main() -> tuple[list[Wake], float, float]:
        loop = asyncio.get_running_loop()
        wakes: list[Wake] = []
        woke: asyncio.Future[float] = loop.create_future()

        def fire(wake: Wake) -> None:
            wakes.append(wake)
            if len(wakes) == 1:  # a line comes while the stream's last read finds nothing
                log.write_bytes(line("a", 0))
            woke.set_result(loop.time())

        waker.arm(loop, fire, 5.0, 0.05, streaming=True)
        await woke
        woke = loop.create_future()
        t0 = loop.time()
        waker.arm(loop, fire, 5.0, 0.05)  # not a stream's wait: its read found nothing
        unannounced = await woke - t0
        woke = loop.create_future()
        t1 = loop.time()
        waker.arm(loop, fire, 5.0, 0.05)  # idle: the writes are watched again
        with log.open("ab") as f:
            f.write(line("a", 1))
        return wakes, unannounced, await woke - t1

    wakes, unannounced, announced = asyncio.run(main())
    assert wakes == ["tick", "tick", "event"]
    assert unannounced < 1.0 and announced < 1.0  # (the safety net would be 5 s here)
    waker.close()


def test_the_tick_after_a_stream_is_not_woken_by_each_write(tmp_path: Path) -> None:
    """The tick that reads once more after a stream watches the writes again, for the wait that
    may follow: its first write's event turns them off for the rest of it (the tick reads them
    anyway), so a busy writer does not wake the loop at every line."""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    waker = Waker(log, mode="inotify")
    tick_s = 0.3

    async def main() -> tuple[list[Wake], int]:
        loop = asyncio.get_running_loop()
        wakes: list[Wake] = []
        woke: asyncio.Future[None] = loop.create_future()

        def fire(wake: Wake) -> None:
            wakes.append(wake)
            woke.set_result(None)

        waker.arm(loop, fire, 5.0, tick_s, streaming=True)
        await woke
        woke = loop.create_future()
        waker.arm(loop, fire, 5.0, tick_s)  # the stream's last read found nothing
        before = waker.events_total
        with log.open("ab") as w:
            for i in range(30):
                w.write(line("a", i))
                w.flush()
                await asyncio.sleep(0.002)
        await woke
        return wakes, waker.events_total - before

    wakes, events = asyncio.run(main())
    assert wakes == ["tick", "tick"]
    assert 1 <= events <= 2  # the first write's event (and one queued beside it), not 30
    waker.close()
