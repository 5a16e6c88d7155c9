"""Finding a file of ours again: at a restart (the checkpoint's), on `seek`, and for `where`.

At start, or on
`seek(position)`, the position's file is looked for at the path, then among ``PATH.1`` ...
``PATH.<rotated_keep>`` and the newest ``rotated_keep`` of logrotate's ``dateext`` names
(``PATH-20261130``; renamed, a copy, or compressed there: ``PATH.2.gz``, read from a temporary
file it is inflated into); reading resumes there and continues through the newer files. When
it is gone, the rotated files last written after the checkpoint was saved (they came after its
file; `recovered` names them) and then the path are read from 0; when it was cut back while we
were away, the path is read from 0 (`health().start` says which: "gone", "changed").
"""

from __future__ import annotations

import os

from loadwatch.daemon.sources.log.checkpoint import Checkpoint, tail_digest
from loadwatch.daemon.sources.log.files import (
    FINGERPRINT_BYTES,
    FileIdentity,
    Found,
    OpenFile,
    Position,
)
from loadwatch.daemon.sources.log.follow_state import FollowerState, longer
from loadwatch.daemon.sources.log.generations import Since


class FollowerPlacing(FollowerState):
    """Where reading starts, and where a remembered position's file is now."""

    def _init_start(self, start_at: Position | None) -> None:
        """Where the first read starts: `start_at`, else the loaded checkpoint's place."""
        cp = self.loaded_checkpoint
        if cp is not None:
            for file_id, head in [(cp.file_id, cp.head), *cp.heads.items()]:
                named = longer(file_id, head)
                if named is not None:
                    self._heads.setdefault(file_id, named)
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

    @property
    def rotated_keep(self) -> int:
        """How many rotated names (PATH.1 ..., and as many dated ones) are searched for a file
        of ours."""
        return self._gens.keep

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
