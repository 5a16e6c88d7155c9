"""Waking costs per wake-up, not per line: the appends of a coalescing tick are read once, and
the waiting runs in the caller's thread (no observer threads)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from loadwatch.daemon.sources.log.follower import LogFollower
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
