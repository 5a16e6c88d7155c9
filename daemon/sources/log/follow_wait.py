"""Waking the follower: `wait(timeout_s)` blocks until a file-system event (inotify on the
directory) or the poll interval (with inotify, a one-second safety net); `wait_async` does the
same in an asyncio loop, and after an event lets the follower's `coalesce_s` pass, so the
appends of that tick are read at once. ``mode="auto"`` chooses polling on network file systems and falls back to it when
events do not arrive. `follow()` and `follow_async()` wrap read + wait into iterators of chunk
lists. Identity and open-file state live in files.py, the rotated-name lookup in generations.py,
compressed rotated files in gzipped.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from loadwatch.daemon.sources.log.follow_state import FollowerError, FollowerState, one_line
from loadwatch.daemon.sources.log.wake import WakeError, Waker


class FollowerWaiting(FollowerState):
    """`wait` and `wait_async`, over the path's `Waker`."""

    def _ensure_waker(self) -> Waker:
        if self._waker is None:
            try:
                self._waker = Waker(self.path, mode=self._mode, mountinfo=self._mountinfo)
            except WakeError as e:
                raise FollowerError(str(e)) from None
            except OSError as e:  # the path cannot be looked at (EACCES, ENAMETOOLONG, ...)
                self._fail(e)
                raise FollowerError(one_line(e)) from None
        return self._waker

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the file may have changed or the poll interval passed; True on an event.

        With inotify the default wait is the safety net's (at least `SAFETY_POLL_S`), not the poll
        interval: events wake it sooner.
        """
        waker = self._ensure_waker()
        fired = waker.wait(waker.timeout_s(self._poll) if timeout_s is None else timeout_s)
        self._woke = "event" if fired else "timer"
        return fired

    def arm(
        self,
        loop: asyncio.AbstractEventLoop,
        fire: Callable[[bool], None],
        timeout_s: float | None = None,
    ) -> Callable[[], None]:
        """`wait_async` as a callback: `loop` calls `fire(True)` after an event (and the
        coalescing tick), `fire(False)` after the timeout; once. Returns what disarms it."""

        def done(event: bool) -> None:
            self._woke = "event" if event else "timer"
            fire(event)

        try:
            waker = self._ensure_waker()
        except FollowerError:
            retry = max(self._poll, 1.0) if timeout_s is None else timeout_s
            return loop.call_later(retry, done, False).cancel
        timeout = waker.timeout_s(self._poll) if timeout_s is None else timeout_s
        return waker.arm(loop, done, timeout, self._coalesce, streaming=self._found)

    async def wait_async(self, timeout_s: float | None = None) -> bool:
        """`wait` for an asyncio loop. With no way to watch the path (an error, said in health),
        the wait is a sleep: the next read is the retry, at a bounded rate."""
        try:
            waker = self._ensure_waker()
        except FollowerError:
            await asyncio.sleep(max(self._poll, 1.0) if timeout_s is None else timeout_s)
            self._woke = "timer"
            return False
        timeout = waker.timeout_s(self._poll) if timeout_s is None else timeout_s
        fired = await waker.wait_async(timeout, self._coalesce)
        self._woke = "event" if fired else "timer"
        return fired
