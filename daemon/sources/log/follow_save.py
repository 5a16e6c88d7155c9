"""Checkpoints: where the follower stands, saved so that a restart resumes exactly.

Restart. `checkpoint()` stores `position()` (the identity and offset of the next undelivered
record; when nothing of the current file was delivered yet, the end of the last record that was)
plus an opaque ``extra`` dict atomically in the state directory; `maybe_checkpoint()` does so
when ``checkpoint_every_records`` records or ``checkpoint_every_s`` seconds have passed since the
last one, but not within ``checkpoint_min_interval_s`` of it. Checkpoint after the chunks were
applied: a crash then re-delivers only what came after the last checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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
from loadwatch.daemon.sources.log.follow_state import TAIL_BYTES, FollowerState


class FollowerSaving(FollowerState):
    """`checkpoint`, `maybe_checkpoint`, and the loading of the last checkpoint."""

    def _init_saving(
        self,
        state_dir: str | os.PathLike[str] | None,
        every_records: int,
        every_s: float,
        min_interval_s: float,
    ) -> None:
        """Load the checkpoint of the path, if any (an unreadable one: an error in health)."""
        self._every_records = every_records
        self._every_s = every_s
        self._min_interval_s = min_interval_s
        self._store = CheckpointStore(state_dir, self.path) if state_dir is not None else None
        self._extra: dict[str, Any] = {}
        self._cp_records = 0
        self._cp_time = self._clock()
        self._cp_saved: tuple[Position | None, dict[str, Any]] | None = None
        self._cp_tried = False  # a save was tried with a position (so the first is done)
        if self._store is not None:
            try:
                self.loaded_checkpoint = self._store.load()
            except CheckpointError as e:
                self._fail(e, state=True)
        if self.loaded_checkpoint is not None:
            self._extra = dict(self.loaded_checkpoint.extra)

    def checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool:
        """Save `position()` and `extra` (kept for later saves when None) now; False on failure."""
        if self._store is None:
            return False
        if extra is not None:
            self._extra = dict(extra)
        pos = self.position()
        self._cp_records = self._reader.records
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
            self._known_heads(),
        )
        try:
            self._store.save(cp)
        except CheckpointError as e:
            self._fail(e, state=True)
            return False
        self._errors.save_works()
        self._checkpoints += 1
        self._cp_saved = (pos, dict(self._extra))
        return True

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
        cp = self.loaded_checkpoint  # what the last daemon knew and this one has not read
        for ident, head in cp.heads.items() if cp is not None else ():
            out.setdefault(ident, head)
        return dict(list(out.items())[:MAX_HEADS])

    def _seen(self, pos: Position) -> tuple[int | None, str | None, int | None]:
        """`Checkpoint.file_mtime_ns`, `.head` and `.file_born_ns`: of the file being read (the
        position's, or the one after the last record delivered); before any is open, the loaded
        checkpoint's own."""
        if self._placer.pending() is not None or not self._files.sources:
            cp = self.loaded_checkpoint
            if cp is not None and cp.file_id == pos.file_id:
                return cp.file_mtime_ns, cp.head, cp.file_born_ns
            return None, None, None
        src = self._files.sources[0]
        try:
            mtime = os.fstat(src.fd).st_mtime_ns
            if src.ident is None and self._files.last_end is not None:
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

    def checkpoint_due(self) -> bool:
        """`maybe_checkpoint` would save now (when something changed): a caller may skip
        making its `extra` until then."""
        if self._store is None:
            return False
        elapsed = self._clock() - self._cp_time
        first = not self._cp_tried and self.loaded_checkpoint is None
        return first or (
            elapsed >= self._min_interval_s
            and (
                self._reader.records - self._cp_records >= self._every_records
                or elapsed >= self._every_s
            )
        )

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
                self._reader.records - self._cp_records >= self._every_records
                or elapsed >= self._every_s
            )
        )
        if not due:
            if extra is not None:
                self._extra = dict(extra)
            return False
        if extra is not None:
            self._extra = dict(extra)
        if self._cp_saved == (self.position(), self._extra):
            self._cp_records, self._cp_time = self._reader.records, self._clock()
            return False
        return self.checkpoint()


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
