"""Checkpoints: `Checkpointer` saves where the follower stands, so that a restart resumes exactly.

It loads the path's checkpoint at start (`loaded`: where `Placer` starts), and decides when and
what to save. `checkpoint()` stores the follower's position (the identity and offset of the next
undelivered record; when nothing of the current file was delivered yet, the end of the last
record that was) plus an opaque ``extra`` dict atomically in the state directory, with what
finds its file again: the bytes before the place (`Checkpoint.tail`), the file's first bytes,
modification and birth times, and the first bytes of the other files read. `maybe_checkpoint()`
does so when ``checkpoint_every_records`` records or ``checkpoint_every_s`` seconds have passed
since the last one, but not within ``checkpoint_min_interval_s`` of it. Checkpoint after the
chunks were applied: a crash then re-delivers only what came after the last checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.log.birth import born_ns
from loadwatch.daemon.sources.log.checkpoint import (
    MAX_HEADS,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    tail_digest,
)
from loadwatch.daemon.sources.log.files import (
    FileIdentity,
    Position,
    fingerprint,
)
from loadwatch.daemon.sources.log.follow_files import FileSet
from loadwatch.daemon.sources.log.follow_state import TAIL_BYTES, Errors


class Checkpointer:
    """When to save, what, and the checkpoint loaded at start; see the module docstring.

    ``records`` passed to its methods is how many records were read in all."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None,
        path: Path,
        *,
        files: FileSet,
        position: Callable[[], Position | None],
        errors: Errors,
        every_records: int,
        every_s: float,
        min_interval_s: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        """Load the checkpoint of the path, if any (an unreadable one: an error in health)."""
        self._path = str(path)
        self._files = files
        self._position = position
        self._errors = errors
        self._every_records = every_records
        self._every_s = every_s
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._wall = wall_clock
        self._store = CheckpointStore(state_dir, path) if state_dir is not None else None
        self._extra: dict[str, Any] = {}
        self._records = 0  # records read at the last save (or save found needless)
        self._time = clock()  # ... and when
        self._saved: tuple[Position | None, dict[str, Any]] | None = None
        self._tried = False  # a save was tried with a position (so the first is done)
        self.saves = 0
        self.loaded: Checkpoint | None = None
        if self._store is not None:
            try:
                self.loaded = self._store.load()
            except CheckpointError as e:
                self._errors.fail(e, state=True)
        if self.loaded is not None:
            self._extra = dict(self.loaded.extra)

    def checkpoint(self, records: int, extra: Mapping[str, Any] | None = None) -> bool:
        """Save the position and `extra` (kept for later saves when None) now; False on
        failure."""
        if self._store is None:
            return False
        if extra is not None:
            self._extra = dict(extra)
        pos = self._position()
        self._records = records
        self._time = self._clock()
        if pos is None:
            return False
        self._tried = True
        cp = Checkpoint(
            self._path,
            pos.file_id,
            pos.offset,
            dict(self._extra),
            self._wall(),
            self._tail(pos),
            *self._seen(pos),
            self._known_heads(),
        )
        try:
            self._store.save(cp)
        except CheckpointError as e:
            self._errors.fail(e, state=True)
            return False
        self._errors.save_works()
        self.saves += 1
        self._saved = (pos, dict(self._extra))
        return True

    def due(self, records: int) -> bool:
        """`maybe_checkpoint` would save now (when something changed)."""
        if self._store is None:
            return False
        elapsed = self._clock() - self._time
        # The first one at once: a daemon killed before it saved any would leave its successor
        # without the file it read, which may have been rotated away by then.
        first = not self._tried and self.loaded is None
        return first or (
            elapsed >= self._min_interval_s
            and (records - self._records >= self._every_records or elapsed >= self._every_s)
        )

    def maybe_checkpoint(self, records: int, extra: Mapping[str, Any] | None = None) -> bool:
        """`checkpoint` once `due` and something changed since the last save.

        Never more often than ``checkpoint_min_interval_s`` (after the first): each save costs
        two fsyncs.
        """
        if self._store is None:
            return False
        due = self.due(records)
        if extra is not None:
            self._extra = dict(extra)
        if not due:
            return False
        if self._saved == (self._position(), self._extra):
            self._records, self._time = records, self._clock()
            return False
        return self.checkpoint(records)

    def _tail(self, pos: Position) -> str | None:
        """`Checkpoint.tail` of a position in a file still open."""
        n = min(TAIL_BYTES, pos.offset)
        for src in self._files.sources:
            if src.ident == pos.file_id and n > 0:
                try:
                    tail = os.pread(src.fd, n, pos.offset - n)
                    # cut back (copytruncate) since our last read: its bytes are not ours
                    ours = len(tail) == n and _still_begins(src.fd, pos.file_id)
                    return tail_digest(tail) if ours else None
                except OSError:
                    return None
        return None

    def _known_heads(self) -> dict[str, str]:
        """`Checkpoint.heads`: the first bytes of the files read that their identity lacks."""
        out: dict[str, str] = {}
        for ident, prefix in self._files.first_bytes_seen():
            if ident is None or ident in out:
                continue
            try:
                short = FileIdentity.parse(ident).fp_len < len(prefix)
            except ValueError:
                continue
            if short:
                out[ident] = f"{len(prefix)}:{fingerprint(prefix)}"
        cp = self.loaded  # what the last daemon knew and this one has not read
        for ident, head in cp.heads.items() if cp is not None else ():
            out.setdefault(ident, head)
        return dict(list(out.items())[:MAX_HEADS])

    def _seen(self, pos: Position) -> tuple[int | None, str | None, int | None]:
        """`Checkpoint.file_mtime_ns`, `.head` and `.file_born_ns`: of the file being read (the
        position's, or the one after the last record delivered); before any is open (the start
        position not looked up yet, or its file not found), the loaded checkpoint's own."""
        files = self._files
        if not files.sources:
            cp = self.loaded
            if cp is not None and cp.file_id == pos.file_id:
                return cp.file_mtime_ns, cp.head, cp.file_born_ns
            return None, None, None
        src = files.sources[0]
        try:
            mtime = os.fstat(src.fd).st_mtime_ns
            if src.ident is None and files.last_end is not None:
                # the position is the end of the file before this one: what was written after
                # it is this file and what came later; its own first bytes are not this one's
                return mtime, None, None
            # the first bytes we saw, not what it holds now: copytruncated since our last
            # read, its first bytes are another content's and would name no file of ours
            prefix = src.first_bytes()
            if src.ident is not None and not _names(src.ident, prefix):
                return mtime, None, born_ns(src.fd)
            return mtime, f"{len(prefix)}:{fingerprint(prefix)}", born_ns(src.fd)
        except OSError:
            return None, None, None


def _names(file_id: str, prefix: bytes) -> bool:
    """The identity `file_id` names a file whose first bytes are `prefix`."""
    try:
        ident = FileIdentity.parse(file_id)
    except ValueError:
        return False
    return len(prefix) >= ident.fp_len and fingerprint(prefix[: ident.fp_len]) == ident.fp


def _still_begins(fd: int, file_id: str) -> bool:
    """The open file still begins with the first bytes its identity names."""
    try:
        ident = FileIdentity.parse(file_id)
    except ValueError:
        return False
    return _names(file_id, os.pread(fd, ident.fp_len, 0))
