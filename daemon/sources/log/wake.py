"""The follower's waking side: tell the reader when the followed path may have changed.

An inotify descriptor (inotify.py) watches the directory of the followed path, or its nearest
existing ancestor while that directory does not exist yet; the reader waits on it (`wait`, or
`wait_async` in an asyncio loop, where it is a reader of the loop: no thread of its own) for at
most the poll interval, so a change that gives no event is still seen one interval later.

Waking costs per wake-up, not per line: `wait_async(..., coalesce_s=)` lets the writes of a
short tick after the first event gather, and reads the events they raised once, so a serving
vLLM's many small appends between two reads make one read.

Shared and network file systems (NFS and the like) give no events for writes made on other hosts.
``mode="auto"`` starts in poll mode when the path lies on one of those, and otherwise switches to
poll mode when the reader reports that timer wakes keep finding data no event announced
(`note_read`). Events are taken for entries named as the followed file (and its rotated names):
writes, attribute changes, deletions, creations and renames, so a file moved into place wakes
the reader at once.
"""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

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

Mode = Literal["auto", "inotify", "poll"]
ActiveMode = Literal["inotify", "poll"]
Wake = Literal["event", "timer"] | None  # what ended the last wait; None: read without waiting
Fire = Callable[[bool], None]  # what `arm` calls: True after an event, False after the timeout
Disarm = Callable[[], None]

# Timer wakes in a row that found data with no event since the previous read: then events do not
# arrive here. Four ride out a late wake-up.
MISSES_TO_FALLBACK = 4
# With events, the timer is only a safety net (writes to a deleted file, a file moved into
# place, events that stopped coming): it need not wake four times a second.
SAFETY_POLL_S = 1.0

# File systems where writes from other hosts raise no inotify event on this one.
REMOTE_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "lustre",
        "gpfs",
        "glusterfs",
        "beegfs",
        "afs",
        "9p",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
        "fuse.ceph-fuse",
        "fuse.lxcfs",
    }
)


class WakeError(Exception):
    """inotify could not be set up and the mode demands it; the message is one line."""


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        c = field[i]
        octal = field[i + 1 : i + 4]
        if c == "\\" and len(octal) == 3 and all(d in "01234567" for d in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


def fs_type(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The file-system type the path (or its nearest existing ancestor) lies on, if known."""
    p = Path(os.path.abspath(os.fspath(path)))
    while p != p.parent:
        try:
            os.stat(p)
            break
        except OSError:  # missing, or unreachable (EACCES, ENAMETOOLONG): its parent tells
            p = p.parent
    target = os.path.realpath(p)
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount = _unescape_mount(fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= best[0]):
            best = (len(mount), right.split()[0])
    return None if best is None else best[1]


# What each watched directory is asked for: the followed file's entries, and the directory itself
# (deleted or moved: it is looked at again); a stand-in ancestor, directories appearing in it.
_FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO
_DIR_EVENTS = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE
_ALWAYS = IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW
_ENTRY_CHANGES = IN_ISDIR | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO


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
        # what is watched: directory -> (dev, inode, whether it stands in for a missing one)
        self._plan: dict[str, tuple[int, int, bool]] = {}
        self._watches: dict[int, str] = {}  # watch descriptor -> directory
        self._names: tuple[str, ...] = (self.path.name,)  # the link's name and its target's
        self._ancestors: frozenset[str] = frozenset()
        self._check_due = True  # look whether the watched directories changed, at the next wait
        self._misses = 0
        self._reader: asyncio.AbstractEventLoop | None = None  # the loop the descriptor is in
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

    def _wanted(self) -> tuple[dict[str, tuple[int, int, bool]], tuple[str, ...]]:
        """The directories to watch: the path's (or its nearest existing ancestor), and the
        directory of its target when the path is a symlink (writes raise events there)."""
        plan: dict[str, tuple[int, int, bool]] = {}
        directory = self.path.parent
        while not directory.is_dir() and directory != directory.parent:
            directory = directory.parent
        st = os.stat(directory)
        plan[str(directory)] = (st.st_dev, st.st_ino, directory != self.path.parent)
        names = [self.path.name]
        real = Path(os.path.realpath(self.path))
        if real != self.path:
            names.append(real.name)
            try:
                st = os.stat(real.parent)
                plan.setdefault(str(real.parent), (st.st_dev, st.st_ino, False))
            except OSError:
                pass
        return plan, tuple(names)

    def _arm(self) -> None:
        inotify = self._inotify
        if inotify is None:
            return
        plan, names = self._wanted()
        if plan == self._plan and names == self._names:
            return
        for wd in self._watches:
            inotify.remove(wd)
        self._watches = {}
        self._plan, self._names = plan, names
        self._ancestors = frozenset(d for d, (_, _, ancestor) in plan.items() if ancestor)
        for directory, (_, _, ancestor) in plan.items():
            mask = _ALWAYS | (_DIR_EVENTS if ancestor else _FILE_EVENTS)
            self._watches[inotify.add(directory, mask)] = directory

    def _rearm_if_needed(self) -> None:
        if self._inotify is None:
            return
        try:
            self._arm()
        except OSError as e:
            self.reason = f"cannot watch {self.path.parent}: {e.strerror or e}"

    def _drain(self) -> bool:
        """Take the queued events; True when one may concern the followed path."""
        inotify = self._inotify
        if inotify is None:
            return False
        relevant = 0
        for ev in inotify.read():
            if ev.mask & IN_Q_OVERFLOW:  # events were lost: any of them may have been ours
                self._check_due = True
                relevant += 1
                continue
            directory = self._watches.get(ev.wd)
            if directory is None:
                continue  # a watch removed meanwhile
            if ev.mask & SELF or not ev.name:  # the watched directory itself went or moved
                self._check_due = True
                relevant += 1
            elif directory in self._ancestors:
                if ev.mask & IN_ISDIR:  # a directory on the way to the path appeared or went
                    self._check_due = True
                    relevant += 1
            elif any(ev.name == n or ev.name.startswith(n + ".") for n in self._names):
                if ev.mask & _ENTRY_CHANGES:  # the path may name another file (a symlink's)
                    self._check_due = True
                relevant += 1
        self.events_total += relevant
        return relevant > 0

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
        fire: Callable[[bool], None],
        timeout_s: float,
        coalesce_s: float = 0.0,
        *,
        streaming: bool = False,
    ) -> Callable[[], None]:
        """Have `loop` call `fire(True)` once a change event came and `coalesce_s` more passed
        (the events that tick's writes raised taken with it: the read that follows covers
        them), or `fire(False)` after `timeout_s` without one; once. No task and no future:
        the descriptor is one of the loop's readers while armed. Returns what disarms it.

        `streaming` (the last read found data, so more is likely on its way): the next read is
        simply one tick later, and the events of the tick say whether it was announced; a
        wake-up saved per read while a serving vLLM writes on."""
        self._before_wait()
        inotify = self._inotify
        if inotify is None:
            return loop.call_later(timeout_s, self._fired, fire, False).cancel
        if streaming and coalesce_s > 0:
            return loop.call_later(coalesce_s, self._ticked, fire).cancel
        return _Armed(self, inotify, loop, fire, timeout_s, coalesce_s).cancel

    def _ticked(self, fire: Callable[[bool], None]) -> None:
        fire(self._drain())  # (no event in the tick, and data: a miss, as a timer's)

    def _fired(self, fire: Callable[[bool], None], event: bool) -> None:
        if event:
            self._drain()  # (the coalescing tick's own events: this read covers them)
        else:
            self._check_due = True
        fire(event)

    async def wait_async(self, timeout_s: float, coalesce_s: float = 0.0) -> bool:
        """`wait` for an asyncio loop (`arm`, awaited)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[bool] = loop.create_future()

        def fire(event: bool) -> None:
            if not woken.done():
                woken.set_result(event)

        disarm = self.arm(loop, fire, timeout_s, coalesce_s)
        try:
            return await woken
        finally:
            disarm()

    def note_read(self, *, woke: Wake, events_before: int, found_data: bool) -> None:
        """After a read: a timer wake that found data no event announced counts as a miss."""
        if self.mode != "inotify" or self.requested != "auto" or woke is None:
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
    """One `Waker.arm`: the descriptor read by the loop until an event, then the coalescing
    tick; or the timeout."""

    def __init__(
        self,
        waker: Waker,
        inotify: Inotify,
        loop: asyncio.AbstractEventLoop,
        fire: Callable[[bool], None],
        timeout_s: float,
        coalesce_s: float,
    ) -> None:
        self._waker, self._inotify, self._loop = waker, inotify, loop
        self._fire, self._coalesce_s = fire, coalesce_s
        self._reading = False
        self._timer: asyncio.Handle | None = None
        # (events that came since the last read make the descriptor readable at once)
        loop.add_reader(inotify.fd, self._readable)
        self._reading = True
        waker._reader = loop
        self._timer = loop.call_later(timeout_s, self._timeout)

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            if self._waker._inotify is self._inotify:  # (else closed, and taken out then)
                self._loop.remove_reader(self._inotify.fd)
                self._waker._reader = None

    def _readable(self) -> None:
        if self._waker._drain():
            self._stop_reading()
            if self._timer is not None:
                self._timer.cancel()
            self._event()

    def _event(self) -> None:
        if self._coalesce_s > 0:
            self._timer = self._loop.call_later(self._coalesce_s, self._done, True)
        else:
            self._timer = self._loop.call_soon(self._done, True)

    def _timeout(self) -> None:
        self._stop_reading()
        self._done(False)

    def _done(self, event: bool) -> None:
        self._timer = None
        self._waker._fired(self._fire, event)

    def cancel(self) -> None:
        self._stop_reading()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
