"""Follow one log path: every record exactly once, across rotation, truncation and restarts.

The synchronous core, `LogFollower`, needs no threads: `read()` returns what the file holds now as
`Chunk`s (runs of whole records, bounded per call) and keeps its place. Call it again later, or
after `wait()` / `await wait_async()` says the file may have changed (see follower_wake.py). The
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
of the first undelivered record, handing over everything up to the last terminator (``\\n`` or
``\\r``, found with `rfind`; no per-record work). A partial record at end of file stays in the file
and is read again next time. A read of ``cap_bytes`` with no terminator is a record longer than
the cap: its first ``cap_bytes`` are kept, the rest is skipped read by read without buffering, and
once its terminator arrives it is delivered alone as ``head + b"\\n"`` with ``cut=True``.

Files and identity. A file is known by device + inode and a fingerprint of its first bytes (up to
`FINGERPRINT_BYTES`), written ``"dev:ino:len:hash"`` (`FileIdentity`) and carried by every chunk.
The fingerprint is taken when the first record of a file is delivered, so a file that is
truncated and grows again, or a new file that reuses an inode, is told apart. A file that an
identity given before names (the checkpoint's, or one passed to `know`: same inode, same first
bytes over that identity's length; at a rotated name, a copy with those first bytes) gets
exactly that identity again, however long the file has grown since, so identities from
different runs compare as strings.

- rename + create, delete + recreate: the old file stays open and is drained to its end once the
  new file at the path has data (an empty new file means the writer has not moved yet), then the
  new one is read from 0. Files rotated in between (``PATH.1``, ``PATH.2``... newer than ours)
  are read first, oldest first. A log deleted and not recreated stays open: a process may still
  be writing to it. A symlinked path is followed to its target, and a retargeted link is a
  rotation.
- copytruncate, truncation: the path's file got smaller than our place, or its first bytes
  changed. A rotated file that begins with our bytes and reaches our place is the copy: its rest
  is read (with our identity), then the truncated file from 0. Without a copy, a file that still
  begins with our bytes was cut back: reading goes on where it first differs from the bytes we
  delivered last (the last 256 KiB are kept for this), from the start of that record; when the
  cut lies further back, or the bytes differ, from 0.
- a record left without its terminator in a file we leave is delivered with ``b"\\n"`` appended
  and ``cut=True`` (counted as unterminated).

Restart. `checkpoint()` stores `position()` (the identity and offset of the next undelivered
record; when nothing of the current file was delivered yet, the end of the last record that was)
plus an opaque ``extra`` dict atomically in the state directory; `maybe_checkpoint()` does so
when ``checkpoint_every_records`` records or ``checkpoint_every_s`` seconds have passed since the
last one, but not within ``checkpoint_min_interval_s`` of it. Checkpoint after the chunks were
applied: a crash then re-delivers only what came after the last checkpoint. At start, or on
`seek(position)`, the position's file is looked for at the path, then among ``PATH.1`` ...
``PATH.<rotated_keep>`` and the newest ``rotated_keep`` of logrotate's ``dateext`` names
(``PATH-20261130``; renamed, a copy, or compressed there: ``PATH.2.gz``, read from a temporary
file it is inflated into); reading resumes there and continues through the newer files. When
it is gone, the rotated files last written after the checkpoint was saved (they came after its
file; `recovered` names them) and then the path are read from 0; when it was cut back while we
were away, the path is read from 0 (`health().start` says which: "gone", "changed").

Waking. `wait(timeout_s)` blocks until a file-system event (watchdog/inotify on the directory) or
the poll interval (with inotify, a one-second safety net); `wait_async` does the same in an
asyncio loop. ``mode="auto"`` chooses polling on network file systems and falls back to it when
events do not arrive. `follow()` and `follow_async()` wrap read + wait into iterators of chunk
lists. Identity and open-file state live in files.py, the rotated-name lookup in generations.py,
compressed rotated files in gzipped.py.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.birth import born_ns
from loadwatch.daemon.sources.log.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    tail_digest,
)
from loadwatch.daemon.sources.log.files import (
    FINGERPRINT_BYTES,
    FileIdentity,
    Found,
    OpenFile,
    Position,
    fingerprint,
    open_file,
)
from loadwatch.daemon.sources.log.generations import Generations, Since
from loadwatch.daemon.sources.log.wake import ActiveMode, Mode, Wake, WakeError, Waker
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

StartKind = Literal["fresh", "pending", "exact", "rotated", "changed", "gone"]
_LF, _CR = 10, 13


class FollowerError(Exception):
    """A configuration the follower cannot work with; the message is one line."""


@dataclass(frozen=True, slots=True)
class FollowerHealth:
    path: str
    mode: ActiveMode | None  # None until waiting begins (a bare read() loop has no mode)
    mode_reason: str | None  # why polling is active when inotify was wanted
    file_exists: bool
    records_total: int
    bytes_total: int  # bytes consumed: delivered plus skipped
    cuts_total: int  # records longer than the cap
    unterminated_total: int  # records delivered without terminator: their file was left
    rotations_total: int  # files switched to (rename, delete + recreate, copytruncate copies)
    truncations_total: int
    checkpoints_total: int
    errors_total: int
    last_error: str | None  # one line; None again once reading (a save, for a checkpoint) works
    last_read_ts: float | None  # wall clock, the last read that found data
    last_check_ts: float | None  # wall clock, the last read() that finished without error
    file_id: str | None  # the file being read, once a record of it was delivered
    offset: int | None  # next undelivered byte in that file
    backlog: bool  # the last read() stopped at its size bound; call again without waiting
    # how this follower began: no checkpoint yet, at it, at it in a rotated file, the path from 0
    # because the checkpoint's file was cut back below it ("changed") or is not found ("gone")
    start: StartKind
    error_in_state: bool = False  # last_error is the state directory's (a save), not the log's


TAIL_BYTES = 256  # the bytes before a place that must still be there to resume at it
LEFT_KEPT = 16  # files left that are remembered, for one that comes back


def _first_terminator(buf: bytes) -> int:
    lf = buf.find(b"\n")
    cr = buf.find(b"\r", 0, lf if lf >= 0 else len(buf))
    return cr if cr >= 0 else lf


def _longer(file_id: str, head: str | None) -> FileIdentity | None:
    """The identity `file_id` with the first bytes `head` ("N:FP") names, when they are more
    than its own; None otherwise (or when either does not parse)."""
    n, _, fp = (head or "").partition(":")
    try:
        ident = FileIdentity.parse(file_id)
        longer = FileIdentity.parse(f"{ident.dev}:{ident.ino}:{n}:{fp}")
    except ValueError:
        return None
    return longer if longer.fp_len > ident.fp_len else None


def _one_line(e: BaseException | str) -> str:
    text = str(e)
    if isinstance(e, OSError) and e.strerror:
        name = os.fsdecode(e.filename) if e.filename else ""
        if len(name) > 200:  # a path too long to show keeps its ends; the reason is kept whole
            name = f"{name[:80]}...{name[-80:]}"
        text = f"{name}: {e.strerror}" if name else e.strerror
    return " ".join(text.split())[:300]


class LogFollower:
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
    ) -> None:
        if cap_bytes < 1 or max_read_bytes < cap_bytes:
            raise FollowerError("need 1 <= cap_bytes <= max_read_bytes")
        if poll_interval_s <= 0 or rotated_keep < 0:
            raise FollowerError("need poll_interval_s > 0 and rotated_keep >= 0")
        if mode not in ("auto", "inotify", "poll"):
            raise FollowerError(f"unknown follow mode {mode!r} (auto, inotify or poll)")
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._path = str(self.path)
        self._cap = cap_bytes
        self._max_read = max_read_bytes
        self._poll = poll_interval_s
        self._mode: Mode = mode
        self._mountinfo = mountinfo
        # A container runtime's log (container.py) ends its lines with \n only; a \r is content.
        self._split_cr = split_cr
        self._clock = clock
        self._wall = wall_clock
        self._gens = Generations(self._path, rotated_keep)
        self._every_records = checkpoint_every_records
        self._every_s = checkpoint_every_s
        self._min_interval_s = checkpoint_min_interval_s

        self._sources: list[OpenFile] = []
        self._pending: tuple[FileIdentity, int] | None = None  # a start position to look up
        self._known: list[FileIdentity] = []  # identities given before: see `know`
        self._last_end: Position | None = None  # after the last record delivered
        self._start: StartKind = "fresh"
        # after what the files that came after the checkpoint's were written (see `written_after`)
        self._since: Since | None = None
        # the checkpoint's file by its first bytes at the save, when they are more than its
        # identity holds (`Checkpoint.head`): what looking for that file looks for
        self._heads: dict[str, FileIdentity] = {}
        self._born: dict[str, int] = {}  # and its birth time at the save (`Checkpoint`)
        self._recovered: tuple[str, ...] = ()  # see `recovered`
        self._rewritten: set[str] = set()  # identities whose file was rewritten in place
        self.rewrites_total = 0  # files found rewritten in place (same first bytes, longer)
        # files left (drained after a rotation), by inode: (identity, first bytes, where we
        # were, ended in "\r", the bytes before that place), for one that comes back
        self._left: dict[tuple[int, int], tuple[str, bytes, int, bool, bytes]] = {}
        self._exists = False
        self._at_path = False
        self._backlog = False
        self._waker: Waker | None = None
        self._woke: Wake = None
        self._closed = False

        self._records = 0
        self._bytes = 0
        self._cuts = 0
        self._unterminated = 0
        self._rotations = 0
        self._truncations = 0
        self._errors = 0
        self._checkpoints = 0
        self._last_error: str | None = None
        self._error_in_state = False  # the last error is the state directory's: a save clears it
        self._last_read_ts: float | None = None
        self._last_check_ts: float | None = None

        self._store = CheckpointStore(state_dir, self.path) if state_dir is not None else None
        self._extra: dict[str, Any] = {}
        self._cp_records = 0
        self._cp_time = clock()
        self._cp_saved: tuple[Position | None, dict[str, Any]] | None = None
        self._cp_tried = False  # a save was tried with a position (so the first is done)
        self.loaded_checkpoint: Checkpoint | None = None
        if self._store is not None:
            try:
                self.loaded_checkpoint = self._store.load()
            except CheckpointError as e:
                self._fail(e, state=True)
        if self.loaded_checkpoint is not None:
            self._extra = dict(self.loaded_checkpoint.extra)
            cp = self.loaded_checkpoint
            longer = _longer(cp.file_id, cp.head)
            if longer is not None:
                self._heads[cp.file_id] = longer
            if cp.file_born_ns is not None:
                self._born[cp.file_id] = cp.file_born_ns
        start = start_at
        if start is None and self.loaded_checkpoint is not None:
            start = Position(self.loaded_checkpoint.file_id, self.loaded_checkpoint.offset)
            self._since = Since.of(self.loaded_checkpoint)
            if not self._tail_holds(self.loaded_checkpoint):
                # same inode and first bytes, other bytes before our place: rewritten in place
                # (`> PATH` and a fixed banner) while we were away: not ours past byte 0
                self._rewritten.add(self.loaded_checkpoint.file_id)
        if start is not None:
            try:
                self._pending = (FileIdentity.parse(start.file_id), start.offset)
                self._known.append(self._pending[0])
                self._start = "pending"
            except ValueError as e:
                self._fail(e, state=True)

    # -- reading ------------------------------------------------------------------------------

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
        woke, self._woke = self._woke, None
        waker = self._waker
        events_before = waker.events_total if waker is not None else 0
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
            if not self._error_in_state:
                self._last_error = None  # reading works again
        except OSError as e:
            self._fail(e)
            if e.errno == errno.ESTALE:  # the NFS handle is gone: find our place again by path
                self._reopen_at_position()
        if out:
            self._last_end = Position(out[-1].file_id, out[-1].next_offset)
        found = self._bytes != bytes_before
        if found:
            self._last_read_ts = self._wall()
        if waker is not None:
            waker.note_read(
                woke=woke, events_before=events_before, found_data=found and self._at_path
            )
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

    def _remember(self, src: OpenFile, rs: int) -> None:
        """A file we leave may come back to the path (a symlink flipped back to a target read
        before, a rotation undone): kept by inode with where we were, to resume there."""
        if src.ident is None:
            return
        tail = b"".join(data for _, data in src.recent)[-TAIL_BYTES:]
        if rs != src.rs:
            tail = b""  # (an unterminated last record was delivered: its bytes are not kept)
        self._left[src.key] = (src.ident, src.prefix, rs, src.cr_end, tail)
        while len(self._left) > LEFT_KEPT:
            del self._left[next(iter(self._left))]

    def _resume_known(self, f: OpenFile) -> None:
        """`f` is a file we read before and left: go on where we were, if it still holds what
        we read (its first bytes, and the bytes just before our place); else it is new."""
        left = self._left.pop(f.key, None)
        if left is None:
            return
        ident, prefix, rs, cr_end, tail = left
        if os.fstat(f.fd).st_size < rs or os.pread(f.fd, len(prefix), 0) != prefix:
            return
        if tail and os.pread(f.fd, len(tail), rs - len(tail)) != tail:
            return
        f.ident, f.prefix, f.rs, f.cr_end = ident, prefix, rs, cr_end

    # -- noticing changes -----------------------------------------------------------------------

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
            self._rotate(newest)
            self._at_path = True

    def _check_truncation(self, src: OpenFile, size: int) -> None:
        if size == src.last_size:
            return
        src.last_size = size
        if size < (src.skip_pos if src.skipping else src.rs):
            self._truncated(src, size)
            return
        now = os.pread(src.fd, FINGERPRINT_BYTES, 0)
        if not now.startswith(src.prefix):
            self._truncated(src, size)  # rewritten in place: copytruncate, then new lines
            return
        if len(now) > len(src.prefix):
            src.prefix = now
        if not src.skipping and src.recent:
            # Same first bytes, but are the bytes before our place still those we delivered?
            # (`> PATH` by a restart script, a fixed banner, then more than we had read.)
            tail = b"".join(data for _, data in src.recent)[-TAIL_BYTES:]
            if os.pread(src.fd, len(tail), src.rs - len(tail)) != tail:
                self.rewrites_total += 1
                self._truncations += 1
                end = self._kept_end(src, size)
                if end is not None and end > src.recent[0][0]:  # it differs in our window
                    src.rs, src.skipping, src.head = end, False, b""
                    src.forget()
                else:  # before it: read it all again, as a new file
                    src.reset()

    def _truncated(self, src: OpenFile, size: int) -> None:
        self._truncations += 1
        if src.prefix:  # we saw its first bytes, so a copy of it can be recognised
            names = self._gens.names()
            found = self._gens.find_copy(names, src.prefix, src.rs, {s.key for s in self._sources})
            if found is not None:
                j, copy = found
                copy.rs, copy.ident, copy.prefix, copy.cr_end = (
                    src.rs,
                    src.ident,
                    src.prefix,
                    src.cr_end,
                )
                known = {s.key for s in self._sources} | {copy.key}
                newer = self._gens.open_newer(names, j - 1, known)
                i = self._sources.index(src)
                self._sources[i:i] = [copy, *newer]
                self._rotations += 1 + len(newer)
                src.reset()
                return
            if size >= len(src.prefix) and os.pread(src.fd, len(src.prefix), 0) == src.prefix:
                end = self._kept_end(src, size)
                if end is not None:  # cut back, and we can tell where: go on from there
                    src.rs, src.skipping, src.head = end, False, b""
                    src.forget()
                    return
        src.reset()

    def _kept_end(self, src: OpenFile, size: int) -> int | None:
        """Where the file stops matching the bytes we delivered, when that lies in our window.

        The file still begins with our bytes but is shorter than our place: it was cut back to
        some point, and lines may have been appended since. Where it first differs from what we
        delivered last, new lines began; we go back to the start of that record, since a new
        line may well begin with the same bytes as the old one there (timestamps). Earlier than
        our window we cannot tell (then: from 0).
        """
        if not src.recent or src.recent[0][0] > size:
            return None
        start = src.recent[0][0]
        old = b"".join(data for _, data in src.recent)
        now = os.pread(src.fd, min(size, src.rs) - start, start)
        lo, hi = 0, len(now)  # longest common prefix of `now` and `old`, by halving
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if now[:mid] == old[:mid]:
                lo = mid
            else:
                hi = mid - 1
        if lo == len(now):  # nothing appended since the cut (or nothing we can tell from)
            return start + lo
        return start + max(now.rfind(b"\n", 0, lo), now.rfind(b"\r", 0, lo)) + 1

    def _rotate(self, newest: OpenFile) -> None:
        """The path holds another file with data: queue the files newer than `newest`."""
        known = {s.key for s in self._sources}
        names = self._gens.names()
        newer = self._gens.open_newer(names, self._gens.index_of(names, newest.key) - 1, known)
        current = open_file(self._path)
        if current is not None and current.key not in known:
            self._resume_known(current)
            newer.append(current)
        elif current is not None:
            current.close()
        self._sources.extend(newer)
        self._rotations += len(newer)

    # -- positions --------------------------------------------------------------------------------

    @property
    def rotated_keep(self) -> int:
        """How many rotated names (PATH.1 ..., and as many dated ones) are searched for a file
        of ours."""
        return self._gens.keep

    def position(self) -> Position | None:
        """Where the next undelivered record starts; None when no file was seen yet."""
        if self._pending is not None:
            ident, offset = self._pending
            return Position(str(ident), offset)
        if not self._sources:
            return None
        src = self._sources[0]
        if src.ident is not None:
            return Position(src.ident, src.rs)
        if self._last_end is not None:
            # Nothing delivered from this file yet (new at the path, or cut back in place): after
            # the last record delivered, which names its file by its first bytes. This file may
            # be empty, and an identity of no bytes would name whatever its inode holds later.
            return self._last_end
        try:
            return Position(src.provisional_identity(self._known, src.name != self._path), src.rs)
        except OSError:
            return None

    def _fix_identity(self, src: OpenFile) -> str:
        return src.fix_identity(self._known, copy=src.name != self._path)

    def know(self, file_id: str) -> None:
        """A file identity given before (a checkpoint's, a position noted elsewhere): a file it
        names gets exactly it when read, so identities compare as strings (`OpenFile.known_as`)."""
        try:
            ident = FileIdentity.parse(file_id)
        except ValueError:
            return
        if ident not in self._known:
            self._known.append(ident)

    def where(self, position: Position) -> int | None:
        """Which name holds the position's file and reaches its offset, found as `seek` finds
        it: 0 the path, i PATH.i (renamed, or a copy); None when none does (gone or cut back
        below the offset, or an OSError)."""
        if position.file_id in self._rewritten and position.offset > 0:
            return None  # rewritten in place: what we read of it is not there any more
        try:
            ident = FileIdentity.parse(position.file_id)
            return self._gens.where(self._look(ident), position.offset)
        except (ValueError, OSError):
            return None

    def _tail_holds(self, cp: Checkpoint) -> bool:
        """The checkpoint's file (wherever it is found) still has, just before the checkpoint's
        offset, the bytes that were there when it was saved; True when that cannot be told."""
        if cp.tail is None or cp.offset == 0:
            return True
        try:
            n = int(cp.tail.split(":", 1)[0])
            found = self._locate(FileIdentity.parse(cp.file_id), cp.offset)
        except (ValueError, OSError):
            return True
        if found is None or found[1] == "changed":
            if found is not None:
                for f in found[0]:
                    f.close()
            return True  # gone or cut back: the start says so
        try:
            first = found[0][0]
            return tail_digest(os.pread(first.fd, n, cp.offset - n)) == cp.tail
        except OSError:
            return True
        finally:
            for f in found[0]:
                f.close()

    def _locate(self, ident: FileIdentity, offset: int) -> tuple[list[OpenFile], Found] | None:
        """`Generations.locate`, by the longer first bytes the checkpoint knows of the file when
        it knows them (`_heads`); the file found keeps the identity it was given."""
        found = self._gens.locate(self._look(ident), offset)
        if found is not None:
            found[0][0].ident = str(ident)
        return found

    def _look(self, ident: FileIdentity) -> FileIdentity:
        """What to look for to find the file `ident` names: by the longer first bytes the
        checkpoint kept of it, and not by its inode when a file born later holds that now (the
        inode was freed and given again; "inode 0" is no file's)."""
        key = str(ident)
        look = self._heads.get(key, ident)
        born = self._born.get(key)
        if born is not None and self._gens.reborn((look.dev, look.ino), born):
            look = FileIdentity(look.dev, 0, look.fp_len, look.fp)
        return look

    def seek(self, position: Position) -> bool:
        """Re-read from a remembered position if its file is still here (the path or PATH.N).

        Returns False, and keeps the current place, when that file is gone.
        """
        try:
            ident = FileIdentity.parse(position.file_id)
            self.know(position.file_id)
            found = self._locate(ident, position.offset)
            if found is not None:  # named as before when known (the checkpoint's file: as it)
                first = found[0][0]
                name = first.known_as(self._known, os.pread(first.fd, FINGERPRINT_BYTES, 0))
                first.ident = name or first.ident
        except (ValueError, OSError) as e:
            self._fail(e)
            return False
        if found is None:
            return False
        self._since = None  # a start of its own: the checkpoint's no longer applies
        self._close_sources()
        self._sources = found[0]
        self._last_end = None
        self._pending = None
        self._backlog = False
        return True

    def _apply_start(self, ident: FileIdentity, offset: int) -> None:
        rewritten = str(ident) in self._rewritten
        found = self._locate(ident, 0 if rewritten else offset)  # an OSError: retried
        if found is not None and rewritten:
            found = (found[0], "changed")
            self.rewrites_total += 1
        self._pending = None
        since, self._since = self._since, None  # the checkpoint's time: for this start only
        if found is None:
            self._start = "gone"
            if since is not None:  # what was rotated away since then is newer than ours
                self._sources = self._gens.written_after(since)
                self._recovered = tuple(f.name for f in self._sources)
        else:
            self._sources, self._start = found
            if self._start == "changed":
                self._truncations += 1  # cut back while we were away

    def _reopen_at_position(self) -> None:
        pos = self.position()
        self._close_sources()
        if pos is not None:
            self._pending = (FileIdentity.parse(pos.file_id), pos.offset)

    # -- checkpoints ------------------------------------------------------------------------------

    def checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool:
        """Save `position()` and `extra` (kept for later saves when None) now; False on failure."""
        if self._store is None:
            return False
        if extra is not None:
            self._extra = dict(extra)
        pos = self.position()
        self._cp_records = self._records
        self._cp_time = self._clock()
        if pos is None:
            return False
        self._cp_tried = True
        cp = Checkpoint(
            self._path,
            pos.file_id,
            pos.offset,
            dict(self._extra),
            self._wall(),
            self._tail(pos),
            *self._seen(pos),
        )
        try:
            self._store.save(cp)
        except CheckpointError as e:
            self._fail(e, state=True)
            return False
        if self._error_in_state:
            self._last_error, self._error_in_state = None, False  # saving works again
        self._checkpoints += 1
        self._cp_saved = (pos, dict(self._extra))
        return True

    def _tail(self, pos: Position) -> str | None:
        """`Checkpoint.tail` of a position in a file still open."""
        n = min(TAIL_BYTES, pos.offset)
        for src in self._sources:
            if src.ident == pos.file_id and n > 0:
                try:
                    return tail_digest(os.pread(src.fd, n, pos.offset - n))
                except OSError:
                    return None
        return None

    def _seen(self, pos: Position) -> tuple[int | None, str | None, int | None]:
        """`Checkpoint.file_mtime_ns`, `.head` and `.file_born_ns`: of the file being read (the
        position's, or the one after the last record delivered); before any is open, the loaded
        checkpoint's own."""
        if self._pending is not None or not self._sources:
            cp = self.loaded_checkpoint
            if cp is not None and cp.file_id == pos.file_id:
                return cp.file_mtime_ns, cp.head, cp.file_born_ns
            return None, None, None
        src = self._sources[0]
        try:
            mtime = os.fstat(src.fd).st_mtime_ns
            if src.ident is None and self._last_end is not None:
                # the position is the end of the file before this one: what was written after
                # it is this file and what came later; its own first bytes are not this one's
                return mtime, None, None
            prefix = os.pread(src.fd, FINGERPRINT_BYTES, 0)
            return mtime, f"{len(prefix)}:{fingerprint(prefix)}", born_ns(src.fd)
        except OSError:
            return None, None, None

    def maybe_checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool:
        """`checkpoint` once enough records or seconds have passed and something changed, and
        the first time it is called when there was none to load.

        Never more often than ``checkpoint_min_interval_s`` (after the first): each save costs
        two fsyncs.
        """
        if self._store is None:
            return False
        elapsed = self._clock() - self._cp_time
        # The first one at once: a daemon killed before it saved any would leave its successor
        # without the file it read, which may have been rotated away by then.
        first = not self._cp_tried and self.loaded_checkpoint is None
        due = first or (
            elapsed >= self._min_interval_s
            and (
                self._records - self._cp_records >= self._every_records or elapsed >= self._every_s
            )
        )
        if not due:
            if extra is not None:
                self._extra = dict(extra)
            return False
        if extra is not None:
            self._extra = dict(extra)
        if self._cp_saved == (self.position(), self._extra):
            self._cp_records, self._cp_time = self._records, self._clock()
            return False
        return self.checkpoint()

    # -- waking -----------------------------------------------------------------------------------

    def _ensure_waker(self) -> Waker:
        if self._waker is None:
            try:
                self._waker = Waker(self.path, mode=self._mode, mountinfo=self._mountinfo)
            except WakeError as e:
                raise FollowerError(str(e)) from None
            except OSError as e:  # the path cannot be looked at (EACCES, ENAMETOOLONG, ...)
                self._fail(e)
                raise FollowerError(_one_line(e)) from None
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
        fired = await waker.wait_async(timeout)
        self._woke = "event" if fired else "timer"
        return fired

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

    # -- health and shutdown ----------------------------------------------------------------------

    def _fail(self, e: BaseException | str, *, state: bool = False) -> None:
        self._errors += 1
        self._last_error = _one_line(e)
        self._error_in_state = state

    def health(self) -> FollowerHealth:
        src = self._sources[0] if self._sources else None
        waker = self._waker
        return FollowerHealth(
            path=self._path,
            mode=waker.mode if waker is not None else None,
            mode_reason=waker.reason if waker is not None else None,
            file_exists=self._exists,
            records_total=self._records,
            bytes_total=self._bytes,
            cuts_total=self._cuts,
            unterminated_total=self._unterminated,
            rotations_total=self._rotations,
            truncations_total=self._truncations,
            checkpoints_total=self._checkpoints,
            errors_total=self._errors,
            last_error=self._last_error,
            last_read_ts=self._last_read_ts,
            last_check_ts=self._last_check_ts,
            file_id=src.ident if src is not None else None,
            offset=src.rs if src is not None else None,
            backlog=self._backlog,
            start=self._start,
            error_in_state=self._error_in_state,
        )

    def _close_sources(self) -> None:
        for src in self._sources:
            src.close()
        self._sources = []

    def close(self, *, checkpoint: bool = True) -> None:
        """Stop waking, save the checkpoint (a clean shutdown), close the files."""
        if self._closed:
            return
        if checkpoint:
            self.checkpoint()
        self._closed = True
        if self._waker is not None:
            self._waker.close()
        self._close_sources()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
