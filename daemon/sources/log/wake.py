"""The follower's waking side: tell the reader when the followed path may have changed.

An inotify descriptor (inotify.py) watches the directory of the followed path, or its nearest
existing ancestor while that directory does not exist yet; the reader waits on it (`wait`, or
`wait_async` in an asyncio loop, where it is a reader of the loop: no thread of its own) for at
most the poll interval, so a change that gives no event is still seen one interval later.

Waking costs per wake-up, not per line: `wait_async(..., coalesce_s=)` lets the writes of a
short tick after the first event gather, so a serving vLLM's many small appends between two
reads make one read; while reads keep finding data, the next read is simply a tick after the
last. During a tick the writes raise no events (IN_MODIFY is asked for only while the reader
waits idle: one event per line, each read and dropped, was most of a busy log's cost; a stream
never toggles it), and an event that is more than a write (a rotation, a new file, lost events)
ends the tick at once, so a log rotated faster than the tick is still read before its files go.
When a stream ends (a read found nothing), the writes are asked for again and the log is read
once more a tick later: a line written between that read and the wait raised no event.

Shared and network file systems (NFS and the like) give no events for writes made on other hosts.
``mode="auto"`` starts in poll mode when the path lies on one of those, and otherwise switches to
poll mode when the reader reports that timer wakes keep finding data no event announced
(`note_read`). Events are taken for entries named as the followed file (and its rotated names):
writes, attribute changes, deletions, creations and renames, so a file moved into place wakes
the reader at once.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from loadwatch.daemon.sources.log.fs_kind import REMOTE_FS_TYPES, fs_type
from loadwatch.daemon.sources.log.inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_DONT_FOLLOW,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    SELF,
    Inotify,
)

if TYPE_CHECKING:  # (the daemon's loop alone runs it: `analyze` reads without asyncio)
    import asyncio

Mode = Literal["auto", "inotify", "poll"]
ActiveMode = Literal["inotify", "poll"]
# What ended the last wait: an event, the timeout, or the tick of a stream (the last read found
# data, so the next one is due a tick later, announced or not); None: a read without waiting.
Wake = Literal["event", "timer", "tick"] | None
OnWake = Callable[[Wake], None]  # what `Waker.arm` calls, once
Fire = Callable[[bool], None]  # what a log input's `arm` calls: True after an event or a tick
Disarm = Callable[[], None]

# Timer wakes in a row that found data with no event since the previous read: then events do not
# arrive here. Four ride out a late wake-up.
MISSES_TO_FALLBACK = 4
# With events, the timer is only a safety net (writes to a deleted file, a file moved into
# place, events that stopped coming): it need not wake four times a second.
SAFETY_POLL_S = 1.0


class WakeError(Exception):
    """inotify could not be set up and the mode demands it; the message is one line."""


# What each watched directory is asked for: the followed file's entries, and the directory itself
# (deleted or moved: it is looked at again); a stand-in ancestor, directories appearing in it.
_FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO
_DIR_EVENTS = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
_ALWAYS = IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
_ENTRY_CHANGES = IN_ISDIR | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO


# A watched directory: its (device, inode), and whether it stands in for a missing one.
Plan = dict[str, tuple[int, int, bool]]


def watch_plan(path: Path) -> tuple[Plan, tuple[str, ...]]:
    """The directories to watch for `path`: its own (or its nearest existing ancestor), and the
    directory of its target when it is a symlink (writes raise events there); and the names
    that are the followed file in them."""
    plan: Plan = {}
    directory = path.parent
    while not directory.is_dir() and directory != directory.parent:
        directory = directory.parent
    st = os.stat(directory)
    plan[str(directory)] = (st.st_dev, st.st_ino, directory != path.parent)
    names = [path.name]
    real = Path(os.path.realpath(path))
    if real != path:
        names.append(real.name)
        try:
            st = os.stat(real.parent)
            plan.setdefault(str(real.parent), (st.st_dev, st.st_ino, False))
        except OSError:
            pass
    return plan, tuple(names)


class Waker:
    """Wakes a reader when the followed path may have changed. Owns the inotify descriptor."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: Mode = "auto",
        mountinfo: str = "/proc/self/mountinfo",
    ) -> None:
        if mode not in ("auto", "inotify", "poll"):
            raise ValueError(f"unknown follow mode {mode!r} (auto, inotify or poll)")
        self.path = Path(os.path.abspath(os.fspath(path)))
        self.requested: Mode = mode
        self.mode: ActiveMode = "poll"
        self.reason: str | None = None  # one line: why poll mode is active when not asked for
        self.events_total = 0
        self._inotify: Inotify | None = None
        self._plan: Plan = {}  # what is watched
        self._watches: dict[int, str] = {}  # watch descriptor -> directory
        self._names: tuple[str, ...] = (self.path.name,)  # the link's name and its target's
        self._ancestors: frozenset[str] = frozenset()
        self._check_due = True  # look whether the watched directories changed, at the next wait
        self._writes_watched = True  # IN_MODIFY asked for (not while a stream is read on a tick)
        self._writes_queued = True  # IN_MODIFY was asked for during the last read: events queued
        self._misses = 0
        # The descriptor is a reader of the loop that arms it, from the first `arm` on: the
        # events go to the wait armed then, or are kept for the next one.
        self._reader: asyncio.AbstractEventLoop | None = None
        self._armed: _Armed | None = None
        self._pending = (False, False)  # (relevant, urgent) events that came while unarmed
        if mode == "poll":
            return
        if mode == "auto":
            kind = fs_type(self.path, mountinfo)
            if kind in REMOTE_FS_TYPES:
                self.reason = f"{kind} gives no change events across hosts"
                return
        try:
            self._start()
        except OSError as e:
            message = f"inotify unavailable: {e.strerror or e}"
            if mode == "inotify":
                raise WakeError(message) from None
            self.reason = message

    # -- the descriptor -----------------------------------------------------------------------

    def _start(self) -> None:
        inotify = Inotify()
        self._inotify = inotify
        try:
            self._arm()
        except OSError:
            self._inotify = None
            inotify.close()
            raise
        self.mode = "inotify"

    def _arm(self) -> None:
        inotify = self._inotify
        if inotify is None:
            return
        plan, names = watch_plan(self.path)
        if plan == self._plan and names == self._names:
            return
        for wd in self._watches:
            inotify.remove(wd)
        self._watches = {}
        self._plan, self._names = plan, names
        self._ancestors = frozenset(d for d, (_, _, ancestor) in plan.items() if ancestor)
        for directory, (_, _, ancestor) in plan.items():
            mask = _ALWAYS | (_DIR_EVENTS if ancestor else self._file_events())
            self._watches[inotify.add(directory, mask)] = directory

    def _file_events(self) -> int:
        return _FILE_EVENTS if self._writes_watched else _FILE_EVENTS & ~IN_MODIFY

    def _watch_writes(self, on: bool) -> None:
        """Ask for the followed file's writes (IN_MODIFY), or stop. While a stream is read on
        a tick, its writes are read on the tick anyway: each one's event, one per line, would
        only be queued, read and dropped, while a rotation or a new file must still wake the
        reader at once. Asking again replaces a watch's mask and keeps its descriptor."""
        inotify = self._inotify
        if inotify is None or on == self._writes_watched:
            return
        self._writes_watched = on
        mask = _ALWAYS | self._file_events()
        for wd, directory in self._watches.items():
            if directory in self._ancestors:
                continue
            try:
                same = inotify.add(directory, mask) == wd
            except OSError:
                same = False
            if not same:  # the directory is another one now: watched afresh at the next wait
                self._check_due = True

    def _rearm_if_needed(self) -> None:
        if self._inotify is None:
            return
        try:
            self._arm()
        except OSError as e:
            self.reason = f"cannot watch {self.path.parent}: {e.strerror or e}"

    def _drain(self) -> bool:
        """Take the queued events; True when one may concern the followed path."""
        return self._take()[0]

    def _take(self) -> tuple[bool, bool]:
        """Take the queued events: whether one may concern the followed path, and whether one
        of those is more than a write to it (a rotation, a new file, a lost event)."""
        inotify = self._inotify
        if inotify is None:
            return False, False
        relevant = urgent = 0
        for ev in inotify.read():
            if ev.mask & IN_Q_OVERFLOW:  # events were lost: any of them may have been ours
                self._check_due = True
                relevant += 1
                urgent += 1
                continue
            directory = self._watches.get(ev.wd)
            if directory is None:
                continue  # a watch removed meanwhile
            if ev.mask & SELF or not ev.name:  # the watched directory itself went or moved
                self._check_due = True
                relevant += 1
                urgent += 1
            elif directory in self._ancestors:
                if ev.mask & IN_ISDIR:  # a directory on the way to the path appeared or went
                    self._check_due = True
                    relevant += 1
                    urgent += 1
            elif any(ev.name == n or ev.name.startswith(n + ".") for n in self._names):
                if ev.mask & _ENTRY_CHANGES:  # the path may name another file (a symlink's)
                    self._check_due = True
                relevant += 1
                urgent += ev.mask != IN_MODIFY
        self.events_total += relevant
        return relevant > 0, urgent > 0

    def _to_poll(self, reason: str) -> None:
        self.reason = reason
        self.mode = "poll"
        self._close_inotify()

    def _close_inotify(self) -> None:
        inotify, self._inotify = self._inotify, None
        self._watches, self._plan = {}, {}
        if inotify is None:
            return
        if self._reader is not None and not self._reader.is_closed():
            self._reader.remove_reader(inotify.fd)  # (a wait in progress times out)
        self._reader = None
        self._pending = (False, False)
        inotify.close()

    # -- the reader's side --------------------------------------------------------------------

    def timeout_s(self, poll_interval_s: float) -> float:
        """How long a wait may last: the poll interval, or the safety net's with events."""
        return poll_interval_s if self.mode == "poll" else max(poll_interval_s, SAFETY_POLL_S)

    def _before_wait(self) -> None:
        if self._inotify is not None and self._check_due:
            self._check_due = False
            self._rearm_if_needed()

    def wait(self, timeout_s: float) -> bool:
        """Block until an event arrives or `timeout_s` passes; True when an event woke us."""
        self._before_wait()
        self._watch_writes(True)
        inotify = self._inotify
        if inotify is None:
            time.sleep(timeout_s)
            self._check_due = True
            return False
        end = time.monotonic() + timeout_s
        fired = self._drain()
        while not fired:
            left = end - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([inotify.fd], [], [], left)
            fired = bool(ready) and self._drain()
        if not fired:
            self._check_due = True
        return fired

    def arm(
        self,
        loop: asyncio.AbstractEventLoop,
        fire: OnWake,
        timeout_s: float,
        coalesce_s: float = 0.0,
        *,
        streaming: bool = False,
    ) -> Callable[[], None]:
        """Have `loop` call `fire("event")` once a change event came and `coalesce_s` more
        passed (the events that tick's writes raised taken with it: the read that follows
        covers them), or `fire("timer")` after `timeout_s` without one; once. No task and no
        future: the descriptor is one of the loop's readers, from the first `arm` on, and hands
        its events to the wait armed then. Returns what disarms it.

        `streaming` (the last read found data, so more is likely on its way): the next read is
        simply one tick later (`fire("tick")`), and the writes of the tick raise no events; a
        rotation, a new file or a lost event still fires at once."""
        self._before_wait()
        inotify = self._inotify
        if inotify is None:
            return loop.call_later(timeout_s, self._fired, fire, "timer").cancel
        self._listen(loop, inotify)
        streaming = streaming and coalesce_s > 0
        if not streaming and not self._writes_watched:
            # A stream ended (its last read found nothing), and its writes raised no events: one
            # written since that read would go unannounced. Watched again from now on, and read
            # once more a tick later; a stream that goes on never asks twice per tick.
            self._watch_writes(True)
            streaming = coalesce_s > 0
        elif streaming:
            self._watch_writes(False)
        if self._writes_queued:
            # What the last read's own writes queued, taken now rather than as a wake-up of its
            # own (twice a second beside a serving vLLM): the read covered them.
            self._readable()
        return _Armed(self, loop, fire, timeout_s, coalesce_s, streaming).cancel

    def _listen(self, loop: asyncio.AbstractEventLoop, inotify: Inotify) -> None:
        if self._reader is not loop:
            if self._reader is not None and not self._reader.is_closed():
                self._reader.remove_reader(inotify.fd)
            loop.add_reader(inotify.fd, self._readable)
            self._reader = loop

    def _readable(self) -> None:
        relevant, urgent = self._take()
        if self._armed is not None:
            self._armed.events(relevant, urgent)
        else:
            was_relevant, was_urgent = self._pending
            self._pending = (was_relevant or relevant, was_urgent or urgent)

    def _fired(self, fire: OnWake, wake: Wake) -> None:
        # What came before is the read's. The writes stay unwatched when a tick silenced them:
        # a read that finds data goes on streaming (the next `arm`), one that finds none turns
        # them on again.
        self._writes_queued = self._writes_watched
        self._pending = (False, False)
        if wake == "timer":
            self._check_due = True
        fire(wake)

    async def wait_async(self, timeout_s: float, coalesce_s: float = 0.0) -> bool:
        """`wait` for an asyncio loop (`arm`, awaited)."""
        import asyncio

        loop = asyncio.get_running_loop()
        woken: asyncio.Future[bool] = loop.create_future()

        def fire(wake: Wake) -> None:
            if not woken.done():
                woken.set_result(wake == "event")

        disarm = self.arm(loop, fire, timeout_s, coalesce_s)
        try:
            return await woken
        finally:
            disarm()

    def note_read(self, *, woke: Wake, events_before: int, found_data: bool) -> None:
        """After a read: a timer wake that found data no event announced counts as a miss."""
        if self.mode != "inotify" or self.requested != "auto" or woke in (None, "tick"):
            return
        if woke == "event" or self.events_total != events_before:
            self._misses = 0
            return
        if found_data:
            self._misses += 1
            if self._misses >= MISSES_TO_FALLBACK:
                self._to_poll(f"no change events for {self._misses} polls that found new data")

    def close(self) -> None:
        self._close_inotify()


class _Armed:
    """One `Waker.arm`: the events the waker hands it, until the first one (then the
    coalescing tick) or the timeout. Streaming: the tick, or at once an event more than a
    write."""

    def __init__(
        self,
        waker: Waker,
        loop: asyncio.AbstractEventLoop,
        fire: OnWake,
        timeout_s: float,
        coalesce_s: float,
        streaming: bool = False,
    ) -> None:
        self._waker, self._loop = waker, loop
        self._fire, self._coalesce_s = fire, coalesce_s
        self._gathering = streaming  # a tick is running: only more than a write ends it early
        if streaming:
            self._timer: asyncio.Handle | None = loop.call_later(coalesce_s, self._done, "tick")
        else:
            self._timer = loop.call_later(timeout_s, self._done, "timer")
        waker._armed = self
        relevant, urgent = waker._pending  # (came since the last read)
        waker._pending = (False, False)
        self.events(relevant, urgent)

    def events(self, relevant: bool, urgent: bool) -> None:
        if urgent or (relevant and not self._gathering):
            self._event(at_once=urgent)
        elif relevant:  # a write in the tick after a stream (the tick reads it): no more of them
            self._waker._watch_writes(False)

    def _event(self, at_once: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._coalesce_s > 0 and not at_once:
            # the tick: the writes it gathers raise no events, a rotation in it ends it
            self._gathering = True
            self._waker._watch_writes(False)
            self._timer = self._loop.call_later(self._coalesce_s, self._done, "event")
        else:
            self._let_go()
            self._timer = self._loop.call_soon(self._done, "event")

    def _let_go(self) -> None:
        if self._waker._armed is self:
            self._waker._armed = None

    def _done(self, wake: Wake) -> None:
        self._let_go()
        self._timer = None
        self._waker._fired(self._fire, wake)

    def cancel(self) -> None:
        self._let_go()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
