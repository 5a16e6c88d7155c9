"""Follow one log path: every record exactly once, across rotation, truncation and restarts.

The synchronous core, `LogFollower`, needs no threads: `read()` returns what the file holds now as
`Chunk`s (runs of whole records, bounded per call) and keeps its place. Call it again later, or
after `wait()` / `await wait_async()` says the file may have changed; `follow()` and
`follow_async()` wrap read + wait into iterators of chunk lists. The daemon loop::

    follower = LogFollower(path, state_dir=state)        # resumes from its checkpoint, if any
    while running:
        for chunk in follower.read():
            scanner.feed(chunk.data, chunk.offset, chunk.file_id)
        follower.maybe_checkpoint({"session_start": start.to_dict()})
        if not follower.backlog:
            await follower.wait_async()
    follower.close()                                     # writes the final checkpoint

A path, not a handle, is followed. `LogFollower` composes parts that each own their state, in
their own modules:

- `FileSet` (follow_files.py): the open files, oldest first, and what happened to them: each
  `read()` begins with its `refresh`, which stats the path and notices rotations and
  truncations; it also keeps the files left and the identities given before (`know`).
- `RecordReader` (follow_read.py): reads the first open file with `pread`, in reads of
  ``read_bytes`` (256 KiB; of ``cap_bytes`` without the C scanner, and where a record of the cap
  or more is), into chunks of whole records (records longer than the cap are cut), up to
  ``max_read_bytes`` per `read()` (then `backlog`); it counts what was read.
- `Placer` (follow_place.py): where reading starts (`start_at`, else the checkpoint's place) and
  where a remembered position's file is now (`seek`, `where`).
- `Checkpointer` (follow_save.py): loads the checkpoint at start, and decides when and what to
  save (`checkpoint`, `maybe_checkpoint`).
- `Waiting` (follow_wait.py): the path's `Waker` (wake.py), for `wait`, `wait_async`, `arm`.
- `Errors` (follow_state.py, with the health record and the other shared names): the errors,
  given to each part that can fail.

The parts get what they need passed in (the `FileSet`, the `Errors`, the clocks; the
checkpointer, `position`), never the follower; it keeps the public surface and its own few things: the read budget and `backlog`,
when reads last found data and finished, and whether it is closed.

Identity and open-file state live in files.py, the rotated-name lookup in generations.py,
compressed rotated files in gzipped.py.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.checkpoint import Checkpoint
from loadwatch.daemon.sources.log.files import FileIdentity, Position
from loadwatch.daemon.sources.log.follow_files import FileSet
from loadwatch.daemon.sources.log.follow_place import Placer
from loadwatch.daemon.sources.log.follow_read import READ_BYTES, RecordReader
from loadwatch.daemon.sources.log.follow_save import Checkpointer
from loadwatch.daemon.sources.log.follow_state import (
    Errors,
    FollowerError,
    FollowerHealth,
    StartKind,
)
from loadwatch.daemon.sources.log.follow_wait import Waiting
from loadwatch.daemon.sources.log.wake import Mode

if TYPE_CHECKING:  # (the daemon's loop alone runs it: `analyze` reads without asyncio)
    import asyncio

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
        read_bytes: int = READ_BYTES,
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
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._max_read = max_read_bytes
        self._wall = wall_clock
        self._errors = Errors()
        self._files = FileSet(str(self.path), rotated_keep)
        self._reader = RecordReader(
            self._files,
            cap_bytes=cap_bytes,
            split_cr=split_cr,
            read_bytes=min(max(cap_bytes, read_bytes), max_read_bytes),
        )
        self._saver = Checkpointer(
            state_dir,
            self.path,
            files=self._files,
            position=self.position,
            errors=self._errors,
            every_records=checkpoint_every_records,
            every_s=checkpoint_every_s,
            min_interval_s=checkpoint_min_interval_s,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._placer = Placer(self._files, self._errors, self._saver.loaded, start_at)
        self._waiting = Waiting(
            self.path,
            mode=mode,
            mountinfo=mountinfo,
            poll_interval_s=poll_interval_s,
            coalesce_s=coalesce_s,
            errors=self._errors,
        )
        self._backlog = False
        self._closed = False
        self._last_read_ts: float | None = None  # wall clock, the last read that found data
        self._last_check_ts: float | None = None  # ... the last read that finished well

    @property
    def loaded_checkpoint(self) -> Checkpoint | None:
        """The checkpoint found at start, if any."""
        return self._saver.loaded

    @property
    def start(self) -> StartKind:
        """How this follower began (`FollowerHealth.start`); "pending" until the first read."""
        return self._placer.start

    @property
    def recovered(self) -> tuple[str, ...]:
        """When the checkpoint's file was gone: the rotated files written after the checkpoint
        was saved, read from their start before the path (oldest first)."""
        return self._placer.recovered

    @property
    def rewrites_total(self) -> int:
        """Files found rewritten in place (same first bytes, other bytes before our place)."""
        return self._files.rewrites + self._placer.rewrites

    @property
    def rotated_keep(self) -> int:
        """How many rotated names (PATH.1 ..., and as many dated ones) are searched for a file
        of ours."""
        return self._files.gens.keep

    @property
    def backlog(self) -> bool:
        """The last `read()` stopped at ``max_read_bytes``: more is there now."""
        return self._backlog

    @property
    def last_error(self) -> str | None:
        """`health().last_error`, without making the rest (asked after every read)."""
        return self._errors.last

    @property
    def file_exists(self) -> bool:
        return self._files.exists

    def read(self) -> list[Chunk]:
        """Everything readable now, up to ``max_read_bytes``, as chunks of whole records."""
        out: list[Chunk] = []
        if self._closed:
            return out
        files, reader = self._files, self._reader
        mark = self._waiting.begin_read()
        bytes_before = reader.bytes
        budget = self._max_read
        self._backlog = False
        try:
            self._placer.apply_pending()
            files.refresh()
            while files.sources:
                src = files.sources[0]
                budget, self._backlog = reader.drain(src, out, budget)
                if self._backlog:
                    break
                if files.sources[0] is not src:
                    continue  # it was truncated and a copy of it goes first
                if len(files.sources) == 1:
                    break
                rs = reader.finish(src, out)  # (None: it grew since the drain: drain again)
                if rs is not None:
                    files.leave(src, rs)
            self._last_check_ts = self._wall()
            self._errors.read_works()
        except OSError as e:
            self._errors.fail(e)
            if e.errno == errno.ESTALE:  # the NFS handle is gone: find our place again by path
                pos = self.position()
                files.close()
                self._placer.look_again(pos)
        if out:
            files.delivered(Position(out[-1].file_id, out[-1].next_offset))
        found = reader.bytes != bytes_before
        if found:
            self._last_read_ts = self._wall()
        self._waiting.end_read(mark, found=found, found_at_path=found and files.at_path)
        return out

    def position(self) -> Position | None:
        """Where the next undelivered record starts; None when no file was seen yet."""
        pending = self._placer.pending()
        return pending if pending is not None else self._files.position()

    def know(self, file_id: str) -> None:
        """A file identity given before (a checkpoint's, a position noted elsewhere): a file it
        names gets exactly it when read, so identities compare as strings (`OpenFile.known_as`)."""
        try:
            self._files.know(FileIdentity.parse(file_id))
        except ValueError:
            return

    def where(self, position: Position) -> int | None:
        """Which name holds the position's file and reaches its offset (see `Placer.where`):
        0 the path, i PATH.i; None when none does."""
        return self._placer.where(position)

    def seek(self, position: Position) -> bool:
        """Re-read from a remembered position if its file is still here (the path or PATH.N).

        Returns False, and keeps the current place, when that file is gone.
        """
        if not self._placer.seek(position):
            return False
        self._backlog = False
        return True

    def checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool:
        """Save `position()` and `extra` (kept for later saves when None) now; False on failure."""
        return self._saver.checkpoint(self._reader.records, extra)

    def checkpoint_due(self) -> bool:
        """`maybe_checkpoint` would save now (when something changed): a caller may skip
        making its `extra` until then."""
        return self._saver.due(self._reader.records)

    def maybe_checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool:
        """`checkpoint` once enough records or seconds have passed and something changed, and
        the first time it is called when there was none to load (see follow_save.py)."""
        return self._saver.maybe_checkpoint(self._reader.records, extra)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the file may have changed or the poll interval passed; True on an event
        (see `Waiting.wait`)."""
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
        """`wait` for an asyncio loop (see `Waiting.wait_async`)."""
        return await self._waiting.wait_async(timeout_s)

    def health(self) -> FollowerHealth:
        files, reader, placer = self._files, self._reader, self._placer
        src = files.sources[0] if files.sources else None
        waker = self._waiting.waker
        return FollowerHealth(
            path=files.path,
            mode=waker.mode if waker is not None else None,
            mode_reason=waker.reason if waker is not None else None,
            file_exists=files.exists,
            records_total=reader.records,
            bytes_total=reader.bytes,
            cuts_total=reader.cuts,
            unterminated_total=reader.unterminated,
            rotations_total=files.rotations,
            truncations_total=files.truncations + placer.truncations,
            checkpoints_total=self._saver.saves,
            errors_total=self._errors.total,
            last_error=self._errors.last,
            last_read_ts=self._last_read_ts,
            last_check_ts=self._last_check_ts,
            file_id=src.ident if src is not None else None,
            offset=src.rs if src is not None else None,
            backlog=self._backlog,
            start=placer.start,
            error_in_state=self._errors.in_state,
        )

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
        self._files.close()

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
