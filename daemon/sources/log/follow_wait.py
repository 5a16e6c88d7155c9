"""Waking the follower: `Waiting` owns the path's `Waker` (made at the first wait) and what a read
tells it.

`wait(timeout_s)` blocks until a file-system event (inotify on the directory) or the poll
interval (with inotify, a one-second safety net); `wait_async` does the same in an asyncio loop,
and after an event lets the follower's `coalesce_s` pass, so the appends of that tick are read at
once; `arm` is `wait_async` as a callback. ``mode="auto"`` chooses polling on network file
systems and falls back to it when events do not arrive: each read tells the waker how the wait
before it ended and whether it found data (`begin_read`, `end_read`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from loadwatch.daemon.sources.log.follow_state import Errors, FollowerError, one_line
from loadwatch.daemon.sources.log.wake import Mode, Wake, WakeError, Waker

if TYPE_CHECKING:  # (the daemon's loop alone runs it: `analyze` reads without asyncio)
    import asyncio

ReadMark = tuple[Wake, int]  # how the wait before a read ended, and the waker's events then


class Waiting:
    """`wait`, `wait_async` and `arm` over the path's `Waker`; see the module docstring."""

    def __init__(
        self,
        path: Path,
        *,
        mode: Mode,
        mountinfo: str,
        poll_interval_s: float,
        coalesce_s: float,
        errors: Errors,
    ) -> None:
        self._path = path
        self._mode: Mode = mode
        self._mountinfo = mountinfo
        self._poll = poll_interval_s
        self._coalesce = coalesce_s  # after an event, let the writes of this long gather
        self._errors = errors
        self._waker: Waker | None = None
        self._woke: Wake = None  # how the last wait ended, until a read takes it
        self._found = False  # the last read found data (a stream: the next read on the tick)

    @property
    def waker(self) -> Waker | None:
        """The waker, once waiting began (a bare read() loop has none)."""
        return self._waker

    def _ensure_waker(self) -> Waker:
        if self._waker is None:
            try:
                self._waker = Waker(self._path, mode=self._mode, mountinfo=self._mountinfo)
            except WakeError as e:
                raise FollowerError(str(e)) from None
            except OSError as e:  # the path cannot be looked at (EACCES, ENAMETOOLONG, ...)
                self._errors.fail(e)
                raise FollowerError(one_line(e)) from None
        return self._waker

    def begin_read(self) -> ReadMark:
        """A read begins: it takes how the last wait ended (once)."""
        woke, self._woke = self._woke, None
        return woke, self._waker.events_total if self._waker is not None else 0

    def end_read(self, mark: ReadMark, *, found: bool, found_at_path: bool) -> None:
        """The read begun at `mark` ended, having found data (at the path's file) or not."""
        self._found = found
        if self._waker is not None:
            woke, events_before = mark
            self._waker.note_read(woke=woke, events_before=events_before, found_data=found_at_path)

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

        def done(wake: Wake) -> None:
            self._woke = wake
            fire(wake != "timer")

        try:
            waker = self._ensure_waker()
        except FollowerError:
            retry = max(self._poll, 1.0) if timeout_s is None else timeout_s
            return loop.call_later(retry, done, "timer").cancel
        timeout = waker.timeout_s(self._poll) if timeout_s is None else timeout_s
        return waker.arm(loop, done, timeout, self._coalesce, streaming=self._found)

    async def wait_async(self, timeout_s: float | None = None) -> bool:
        """`wait` for an asyncio loop. With no way to watch the path (an error, said in health),
        the wait is a sleep: the next read is the retry, at a bounded rate."""
        try:
            waker = self._ensure_waker()
        except FollowerError:
            import asyncio

            await asyncio.sleep(max(self._poll, 1.0) if timeout_s is None else timeout_s)
            self._woke = "timer"
            return False
        timeout = waker.timeout_s(self._poll) if timeout_s is None else timeout_s
        fired = await waker.wait_async(timeout, self._coalesce)
        self._woke = "event" if fired else "timer"
        return fired

    def close(self) -> None:
        if self._waker is not None:
            self._waker.close()
