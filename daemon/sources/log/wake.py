"""The follower's waking side: tell the reader when the followed path may have changed.

A watchdog (inotify) observer watches the directory of the followed path, or its nearest existing
ancestor while that directory does not exist yet, and sets an event from its own thread. The reader
waits on it (`wait`, or `wait_async` from an asyncio loop, woken via `loop.call_soon_threadsafe`)
for at most the poll interval, so a change that gives no event is still seen one interval later.

Shared and network file systems (NFS and the like) give no events for writes made on other hosts.
``mode="auto"`` starts in poll mode when the path lies on one of those, and otherwise switches to
poll mode when the reader reports that timer wakes keep finding data no event announced
(`note_read`). The inotify watch asks for modify and delete events only: no move events,
because watchdog holds every later event back for half a second after an unpaired move, and a
rotation always shows up as a write to the new file anyway.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Literal

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import ObservedWatch
from watchdog.observers.inotify import InotifyObserver

Mode = Literal["auto", "inotify", "poll"]
ActiveMode = Literal["inotify", "poll"]
Wake = Literal["event", "timer"] | None  # what ended the last wait; None: read without waiting

# Timer wakes in a row that found data with no event since the previous read: then events do not
# arrive here. Four rides out a busy observer thread.
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


class _Handler(FileSystemEventHandler):
    def __init__(self, waker: Waker) -> None:
        self._waker = waker

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._waker._on_fs_event(event)


class Waker:
    """Wakes a reader when the followed path may have changed. Owns the observer thread."""

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
        self._event = threading.Event()
        self._observer: InotifyObserver | None = None
        # what is watched: directory -> (dev, inode, whether it stands in for a missing one)
        self._plan: dict[str, tuple[int, int, bool]] = {}
        self._watches: list[ObservedWatch] = []
        self._names: tuple[str, ...] = (self.path.name,)  # the link's name and its target's
        self._ancestors: frozenset[str] = frozenset()
        self._check_due = True  # look whether the watched directories changed, at the next wait
        self._misses = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._aevent: asyncio.Event | None = None
        self._scheduled = False
        if mode == "poll":
            return
        if mode == "auto":
            kind = fs_type(self.path, mountinfo)
            if kind in REMOTE_FS_TYPES:
                self.reason = f"{kind} gives no change events across hosts"
                return
        try:
            self._start_observer()
        except OSError as e:
            message = f"inotify unavailable: {e.strerror or e}"
            if mode == "inotify":
                raise WakeError(message) from None
            self.reason = message

    # -- observer -----------------------------------------------------------------------------

    def _start_observer(self) -> None:
        observer = InotifyObserver()
        try:
            observer.start()
            self._observer = observer
            self._arm()
        except OSError:
            self._observer = None
            observer.stop()
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
        observer = self._observer
        if observer is None:
            return
        plan, names = self._wanted()
        if plan == self._plan and names == self._names:
            return
        for watch in self._watches:
            observer.unschedule(watch)
        self._watches = []
        self._plan, self._names = plan, names
        self._ancestors = frozenset(d for d, (_, _, ancestor) in plan.items() if ancestor)
        for directory, (_, _, ancestor) in plan.items():
            events: list[type[FileSystemEvent]]
            if ancestor:
                events = [DirCreatedEvent, DirDeletedEvent]
            else:
                events = [FileModifiedEvent, FileDeletedEvent, DirDeletedEvent]
            self._watches.append(observer.schedule(_Handler(self), directory, event_filter=events))

    def _rearm_if_needed(self) -> None:
        if self._observer is None:
            return
        try:
            self._arm()
        except OSError as e:
            self.reason = f"cannot watch {self.path.parent}: {e.strerror or e}"

    def _on_fs_event(self, event: FileSystemEvent) -> None:
        """Runs in the observer thread: keep it to setting flags."""
        src = os.fsdecode(event.src_path)
        directory, name = os.path.split(src)
        ours = any(name == n or name.startswith(n + ".") for n in self._names)
        if not ours and directory not in self._ancestors and src not in self._plan:
            return
        if event.is_directory:
            self._check_due = True
        self.events_total += 1
        self._event.set()
        loop = self._loop
        if loop is not None and not self._scheduled:
            self._scheduled = True
            try:
                loop.call_soon_threadsafe(self._set_async)
            except RuntimeError:  # the loop is closed
                self._scheduled = False

    def _set_async(self) -> None:
        self._scheduled = False
        if self._aevent is not None:
            self._aevent.set()

    def _to_poll(self, reason: str) -> None:
        self.reason = reason
        self.mode = "poll"
        observer, self._observer = self._observer, None
        self._watches, self._plan = [], {}
        if observer is not None:
            observer.stop()  # its threads end on their own; no join in the reader's path

    # -- the reader's side --------------------------------------------------------------------

    def timeout_s(self, poll_interval_s: float) -> float:
        """How long a wait may last: the poll interval, or the safety net's with events."""
        return poll_interval_s if self.mode == "poll" else max(poll_interval_s, SAFETY_POLL_S)

    def _before_wait(self) -> None:
        if self._observer is not None and self._check_due:
            self._check_due = False
            self._rearm_if_needed()

    def wait(self, timeout_s: float) -> bool:
        """Block until an event arrives or `timeout_s` passes; True when an event woke us."""
        self._before_wait()
        fired = self._event.wait(timeout_s)
        self._event.clear()
        if not fired:
            self._check_due = True
        return fired

    async def wait_async(self, timeout_s: float) -> bool:
        """`wait` for an asyncio loop: the observer thread wakes the loop thread-safely."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._aevent is None:
            self._aevent = asyncio.Event()
            self._scheduled = False
            self._loop = loop
        self._before_wait()
        aevent = self._aevent
        fired = self._event.is_set()
        if not fired:
            try:
                async with asyncio.timeout(timeout_s):
                    await aevent.wait()
                fired = True
            except TimeoutError:
                fired = self._event.is_set()
        aevent.clear()
        self._event.clear()
        if not fired:
            self._check_due = True
        return fired

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
        observer, self._observer = self._observer, None
        self._watches, self._plan = [], {}
        if observer is not None:
            observer.stop()
            if observer.is_alive():
                observer.join(timeout=2.0)
        self._loop = None
        self._aevent = None
