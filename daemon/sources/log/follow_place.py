"""Finding a file of ours again: `Placer`, at a restart (the checkpoint's), on `seek`, for `where`.

At start, or on `seek(position)`, the position's file is looked for at the path, then among
``PATH.1`` ... ``PATH.<rotated_keep>`` and the newest ``rotated_keep`` of logrotate's
``dateext`` names (``PATH-20261130``; renamed, a copy, or compressed there: ``PATH.2.gz``, read
from a temporary file it is inflated into); reading resumes there and continues through the
newer files. When it is gone, the rotated files last written after the checkpoint was saved
(they came after its file; `recovered` names them) and then the path are read from 0; when it
was cut back while we were away, the path is read from 0 (`start` says which: "gone",
"changed"). The start position is looked up at the first read (`apply_pending`), so a file that
cannot be opened yet is looked for again at the next.
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
from loadwatch.daemon.sources.log.follow_files import FileSet
from loadwatch.daemon.sources.log.follow_state import Errors, StartKind, longer
from loadwatch.daemon.sources.log.generations import Since


class Placer:
    """Where reading starts, and where a remembered position's file is now; it hands the files
    found to the `FileSet`."""

    def __init__(
        self,
        files: FileSet,
        errors: Errors,
        checkpoint: Checkpoint | None,
        start_at: Position | None,
    ) -> None:
        """Reading starts at `start_at`, else at the checkpoint's place (looked up at the first
        read)."""
        self._files = files
        self._errors = errors
        self._pending: tuple[FileIdentity, int] | None = None  # a start position to look up
        self.start: StartKind = "fresh"
        self.recovered: tuple[str, ...] = ()  # see `LogFollower.recovered`
        self.rewrites = 0  # the checkpoint's file was rewritten in place while we were away
        self.truncations = 0  # ... or cut back below its place
        # after what the files that came after the checkpoint's were written (`written_after`)
        self._since: Since | None = None
        # the checkpoint's file by its first bytes at the save, when they are more than its
        # identity holds (`Checkpoint.head`): what looking for that file looks for
        self._heads: dict[str, FileIdentity] = {}
        self._born: dict[str, int] = {}  # and its birth time at the save (`Checkpoint`)
        self._rewritten: set[str] = set()  # identities whose file was rewritten in place
        cp = checkpoint
        if cp is not None:
            for file_id, head in [(cp.file_id, cp.head), *cp.heads.items()]:
                named = longer(file_id, head)
                if named is not None:
                    self._heads.setdefault(file_id, named)
            if cp.file_born_ns is not None:
                self._born[cp.file_id] = cp.file_born_ns
        start = start_at
        if start is None and cp is not None:
            start = Position(cp.file_id, cp.offset)
            self._since = Since.of(cp)
            if not self._tail_holds(cp):
                # same inode and first bytes, other bytes before our place: rewritten in place
                # (`> PATH` and a fixed banner) while we were away: not ours past byte 0
                self._rewritten.add(cp.file_id)
        if start is not None:
            try:
                self._pending = (FileIdentity.parse(start.file_id), start.offset)
                self._files.know(self._pending[0])
                self.start = "pending"
            except ValueError as e:
                self._errors.fail(e, state=True)

    def pending(self) -> Position | None:
        """The start position still to be looked up, if any."""
        if self._pending is None:
            return None
        ident, offset = self._pending
        return Position(str(ident), offset)

    def apply_pending(self) -> None:
        """Look up the start position, if one is pending (an OSError: again at the next read)."""
        if self._pending is None:
            return
        ident, offset = self._pending
        rewritten = str(ident) in self._rewritten
        found = self._locate(ident, 0 if rewritten else offset)  # an OSError: retried
        if found is not None and rewritten:
            found = (found[0], "changed")
            self.rewrites += 1
        self._pending = None
        since, self._since = self._since, None  # the checkpoint's time: for this start only
        if found is None:
            self.start = "gone"
            if since is not None:  # what was rotated away since then is newer than ours
                self._files.begin(self._files.gens.written_after(since))
                self.recovered = tuple(f.name for f in self._files.sources)
        else:
            self._files.begin(found[0])
            self.start = found[1]
            if self.start == "changed":
                self.truncations += 1  # cut back while we were away

    def look_again(self, position: Position | None) -> None:
        """The open files were dropped (a stale NFS handle): find `position` again by path."""
        if position is not None:
            self._pending = (FileIdentity.parse(position.file_id), position.offset)

    def where(self, position: Position) -> int | None:
        """Which name holds the position's file and reaches its offset, found as `seek` finds
        it: 0 the path, i PATH.i (renamed, or a copy); None when none does (gone or cut back
        below the offset, or an OSError)."""
        if position.file_id in self._rewritten and position.offset > 0:
            return None  # rewritten in place: what we read of it is not there any more
        try:
            ident = FileIdentity.parse(position.file_id)
            return self._files.gens.where(self._look(ident), position.offset)
        except (ValueError, OSError):
            return None

    def seek(self, position: Position) -> bool:
        """Re-read from a remembered position if its file is still here (the path or PATH.N).

        Returns False, and keeps the current place, when that file is gone.
        """
        try:
            ident = FileIdentity.parse(position.file_id)
            self._files.know(ident)
            found = self._locate(ident, position.offset)
            if found is not None:  # named as before when known (the checkpoint's file: as it)
                first = found[0][0]
                prefix = os.pread(first.fd, FINGERPRINT_BYTES, 0)
                first.ident = first.known_as(self._files.known, prefix) or first.ident
        except (ValueError, OSError) as e:
            self._errors.fail(e)
            return False
        if found is None:
            return False
        self._since = None  # a start of its own: the checkpoint's no longer applies
        self._files.switch(found[0])
        self._pending = None
        return True

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
        found = self._files.gens.locate(self._look(ident), offset)
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
        if born is not None and self._files.gens.reborn((look.dev, look.ino), born):
            look = FileIdentity(look.dev, 0, look.fp_len, look.fp)
        return look
