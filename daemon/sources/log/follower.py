"""Follow one log path: every record exactly once, across rotation, truncation and restarts.

The synchronous core, `LogFollower`, needs no threads: `read()` returns what the file holds now as
`Chunk`s (runs of whole records, bounded per call) and keeps its place. Call it again later, or
after `wait()` / `await wait_async()` says the file may have changed (see follow_wait.py). The
daemon loop::

    follower = LogFollower(path, state_dir=state)        # resumes from its checkpoint, if any
    while running:
        for chunk in follower.read():
            scanner.feed(chunk.data, chunk.offset, chunk.file_id)
        follower.maybe_checkpoint({"session_start": start.to_dict()})
        if not follower.backlog:
            await follower.wait_async()
    follower.close()                                     # writes the final checkpoint

How the file is read. A path, not a handle, is followed. Each `read()` stats the path, compares it
with the newest open file, then reads with `pread` in reads of at most ``cap_bytes`` from the start
of the first undelivered record, handing over everything up to the last terminator (``\n`` or
``\r``, found with `rfind`; no per-record work). A partial record at end of file stays in the file
and is read again next time. A read of ``cap_bytes`` with no terminator is a record longer than
the cap: its first ``cap_bytes`` are kept, the rest is skipped read by read without buffering, and
once its terminator arrives it is delivered alone as ``head + b"\n"`` with ``cut=True``.

The follower's parts: follow_state.py (what they share, and how a file is known),
follow_changes.py (rotations, truncations), follow_place.py (finding a file again at a restart),
follow_save.py (checkpoints), follow_wait.py (waking). Identity and open-file state live in
files.py, the rotated-name lookup in generations.py, compressed rotated files in gzipped.py.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.files import FileIdentity, OpenFile, Position, open_file
from loadwatch.daemon.sources.log.follow_changes import FollowerChanges
from loadwatch.daemon.sources.log.follow_place import FollowerPlacing
from loadwatch.daemon.sources.log.follow_save import FollowerSaving
from loadwatch.daemon.sources.log.follow_state import (
    _CR,
    _LF,
    FollowerError,
    FollowerHealth,
    StartKind,
    _first_terminator,
)
from loadwatch.daemon.sources.log.follow_wait import Waiting
from loadwatch.daemon.sources.log.wake import Mode
from loadwatch.parsers.scan import count_records

__all__ = [
    "FileIdentity",
    "FollowerError",
    "FollowerHealth",
    "LogFollower",
    "Position",
]

DEFAULT_CAP_BYTES = 64 * 1024
DEFAULT_MAX_READ_BYTES = 4 * 1024 * 1024
DEFAULT_POLL_INTERVAL_S = 0.25
DEFAULT_ROTATED_KEEP = 5


class LogFollower(FollowerChanges, FollowerPlacing, FollowerSaving):
    """Reads one log path as chunks of whole records; see the module docstring."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        state_dir: str | os.PathLike[str] | None = None,
        cap_bytes: int = DEFAULT_CAP_BYTES,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        mode: Mode = "auto",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        start_at: Position | None = None,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        rotated_keep: int = DEFAULT_ROTATED_KEEP,
        checkpoint_every_records: int = 100_000,
        checkpoint_every_s: float = 5.0,
        checkpoint_min_interval_s: float = 1.0,
        mountinfo: str = "/proc/self/mountinfo",
        split_cr: bool = True,
        coalesce_s: float = 0.0,
    ) -> None:
        if cap_bytes < 1 or max_read_bytes < cap_bytes:
            raise FollowerError("need 1 <= cap_bytes <= max_read_bytes")
        if poll_interval_s <= 0 or rotated_keep < 0 or coalesce_s < 0:
            raise FollowerError("need poll_interval_s > 0, rotated_keep >= 0, coalesce_s >= 0")
        if mode not in ("auto", "inotify", "poll"):
            raise FollowerError(f"unknown follow mode {mode!r} (auto, inotify or poll)")
        super().__init__(
            path,
            cap_bytes=cap_bytes,
            clock=clock,
            wall_clock=wall_clock,
            max_read_bytes=max_read_bytes,
            rotated_keep=rotated_keep,
            split_cr=split_cr,
        )
        self._waiting = Waiting(
            self.path,
            mode=mode,
            mountinfo=mountinfo,
            poll_interval_s=poll_interval_s,
            coalesce_s=coalesce_s,
            errors=self._errors,
        )
        self._init_saving(
            state_dir, checkpoint_every_records, checkpoint_every_s, checkpoint_min_interval_s
        )
        self._init_start(start_at)

    @property
    def start(self) -> StartKind:
        """How this follower began (`FollowerHealth.start`); "pending" until the first read."""
        return self._start

    @property
    def recovered(self) -> tuple[str, ...]:
        """When the checkpoint's file was gone: the rotated files written after the checkpoint
        was saved, read from their start before the path (oldest first)."""
        return self._recovered

    @property
    def backlog(self) -> bool:
        """The last `read()` stopped at ``max_read_bytes``: more is there now."""
        return self._backlog

    def read(self) -> list[Chunk]:
        """Everything readable now, up to ``max_read_bytes``, as chunks of whole records."""
        out: list[Chunk] = []
        if self._closed:
            return out
        mark = self._waiting.begin_read()
        bytes_before = self._bytes
        budget = self._max_read
        self._backlog = False
        try:
            self._refresh()
            while self._sources:
                src = self._sources[0]
                budget = self._drain(src, out, budget)
                if self._backlog:
                    break
                if self._sources[0] is not src:
                    continue  # it was truncated and a copy of it goes first
                if len(self._sources) == 1:
                    break
                if self._leave(src, out):
                    self._sources.pop(0)
            self._last_check_ts = self._wall()
            self._errors.read_works()
        except OSError as e:
            self._fail(e)
            if e.errno == errno.ESTALE:  # the NFS handle is gone: find our place again by path
                self._reopen_at_position()
        if out:
            self._last_end = Position(out[-1].file_id, out[-1].next_offset)
        found = self._bytes != bytes_before
        if found:
            self._last_read_ts = self._wall()
        self._waiting.end_read(mark, found=found, found_at_path=found and self._at_path)
        return out

    def _drain(self, src: OpenFile, out: list[Chunk], budget: int) -> int:
        """Read `src` to its end, or until another read could pass `budget` (then backlog)."""
        fd, cap, pread = src.fd, self._cap, os.pread
        while True:
            if budget < cap:
                self._backlog = True
                return budget
            if src.skipping:
                buf = pread(fd, cap, src.skip_pos)
                if not buf:
                    return budget
                if src.prefix and pread(fd, len(src.prefix), 0) != src.prefix:
                    if self._replaced_while_reading(src):
                        return budget
                    continue
                t = _first_terminator(buf) if self._split_cr else buf.find(b"\n")
                if t < 0:
                    src.skip_pos += len(buf)
                    self._bytes += len(buf)
                    budget -= len(buf)
                    if len(buf) < cap:
                        return budget
                    continue
                end = src.skip_pos + t + 1
                self._bytes += t + 1
                budget -= t + 1
                ident = src.ident or self._fix_identity(src)
                out.append(Chunk(src.head + b"\n", src.rs, ident, end, True))
                self._cuts += 1
                self._records += 1
                src.cr_end = buf[t] == _CR
                src.rs, src.skipping, src.head = end, False, b""
                src.forget()  # a cut record is not the file's bytes
                continue
            rs = src.rs
            buf = pread(fd, cap, rs)
            n = len(buf)
            if n == 0:
                return budget
            if src.prefix and pread(fd, len(src.prefix), 0) != src.prefix:
                if self._replaced_while_reading(src):
                    return budget
                continue
            last = buf.rfind(b"\n")
            cr = buf.rfind(b"\r", last + 1) if self._split_cr else -1
            if cr > last:
                last = cr
            if last < 0:
                if n < cap:  # a partial record at the end: it stays in the file until whole
                    return budget
                src.skipping, src.head, src.skip_pos = True, buf, rs + n
                self._bytes += n
                budget -= n
                continue
            size = last + 1
            data = buf if size == n else buf[:size]
            out.append(Chunk(data, rs, src.ident or self._fix_identity(src), rs + size, False))
            src.remember(rs, data)
            src.rs = rs + size
            self._bytes += size
            budget -= size
            records = count_records(data)
            if src.cr_end and data[0] == _LF:
                records -= 1
            src.cr_end = data[-1] == _CR
            self._records += records
            if n < cap:
                return budget

    def _replaced_while_reading(self, src: OpenFile) -> bool:
        """The file was truncated (and grew again) under a read: that read is not ours.

        Checked after every read, not only once per `read()`, because a copytruncate can happen
        and the file regrow past our place while a large backlog is being read. True when a copy
        of it now goes first (stop reading `src`).
        """
        size = os.fstat(src.fd).st_size
        src.last_size = size
        self._truncated(src, size)
        return self._sources[0] is not src

    def _leave(self, src: OpenFile, out: list[Chunk]) -> bool:
        """Done with a file we moved past: deliver an unterminated last record, close it."""
        start = src.skip_pos if src.skipping else src.rs
        tail = os.pread(src.fd, self._cap, start)
        if _first_terminator(tail) >= 0 or len(tail) == self._cap:
            return False  # it grew since the drain: drain again
        rs = src.rs
        if src.skipping or tail:
            ident = src.ident or self._fix_identity(src)
            end = start + len(tail)
            data = src.head if src.skipping else tail
            out.append(Chunk(data + b"\n", src.rs, ident, end, True))
            self._bytes += len(tail)
            self._records += 1
            if src.skipping:
                self._cuts += 1
            else:
                self._unterminated += 1
            rs = end
        self._remember(src, rs)
        src.close()
        return True

    def _refresh(self) -> None:
        if self._pending is not None:
            ident, offset = self._pending
            self._apply_start(ident, offset)
        try:
            st: os.stat_result | None = os.stat(self._path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", self._path)
        self._exists = st is not None
        self._at_path = False
        if not self._sources:
            src = open_file(self._path) if st is not None else None
            if src is not None:
                self._sources.append(src)
                self._at_path = True
            return
        newest = self._sources[-1]
        if st is not None and (st.st_dev, st.st_ino) == newest.key:
            self._at_path = True
            self._check_truncation(newest, st.st_size)
        elif st is not None and st.st_size > 0:
            # The file we read may have been cut (copytruncate) before it was renamed away:
            # that is seen at its own size, not at the path's.
            self._check_truncation(newest, os.fstat(newest.fd).st_size)
            self._rotate(newest)
            self._at_path = True

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the file may have changed or the poll interval passed; True on an event
        (see follow_wait.py)."""
        return self._waiting.wait(timeout_s)

    def arm(
        self,
        loop: asyncio.AbstractEventLoop,
        fire: Callable[[bool], None],
        timeout_s: float | None = None,
    ) -> Callable[[], None]:
        """`wait_async` as a callback: `loop` calls `fire(True)` after an event (and the
        coalescing tick), `fire(False)` after the timeout; once. Returns what disarms it."""
        return self._waiting.arm(loop, fire, timeout_s)

    async def wait_async(self, timeout_s: float | None = None) -> bool:
        """`wait` for an asyncio loop."""
        return await self._waiting.wait_async(timeout_s)

    def follow(self, stop: threading.Event | None = None) -> Iterator[list[Chunk]]:
        """Chunk lists as they come, until `stop` is set."""
        while stop is None or not stop.is_set():
            chunks = self.read()
            if chunks:
                yield chunks
                if stop is not None and stop.is_set():
                    return
            if not self._backlog:
                self.wait()

    async def follow_async(self) -> AsyncIterator[list[Chunk]]:
        while not self._closed:
            chunks = self.read()
            if chunks:
                yield chunks
            if not self._backlog:
                await self.wait_async()

    def close(self, *, checkpoint: bool = True) -> None:
        """Stop waking, save the checkpoint (a clean shutdown), close the files."""
        if self._closed:
            return
        if checkpoint:
            self.checkpoint()
        self._closed = True
        self._waiting.close()
        self._close_sources()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
