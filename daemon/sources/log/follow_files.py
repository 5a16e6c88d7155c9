"""The files behind the followed path and what happened to them: `FileSet`.

A `FileSet` owns the files being read, oldest first (the first is the one read now, the last the
path's), the files left after a rotation (by inode, for one that comes back), the identities
given before (`know`: a file one of them names gets exactly it), and where the last delivered
record ended. Each read begins with `refresh`, which stats the path and compares it with the
newest open file:

- rename + create, delete + recreate: the old file stays open and is drained to its end once the
  new file at the path has data (an empty new file means the writer has not moved yet), then the
  new one is read from 0. Files rotated in between (``PATH.1``, ``PATH.2``... newer than ours)
  are read first, oldest first. A log deleted and not recreated stays open: a process may still
  be writing to it. A symlinked path is followed to its target, and a retargeted link is a
  rotation. A file left that comes back to the path (a symlink flipped back, a rotation undone)
  is read on from where we were, when it still holds what we read.
- copytruncate, truncation: the path's file got smaller than our place, or its first bytes
  changed. A rotated file that begins with our bytes and reaches our place is the copy: its rest
  is read (with our identity), then the truncated file from 0. Without a copy, a file that still
  begins with our bytes was cut back: reading goes on where it first differs from the bytes we
  delivered last (the last 256 KiB are kept for this), from the start of that record; when the
  cut lies further back, or the bytes differ, from 0.
"""

from __future__ import annotations

import errno
import os
import stat

from loadwatch.daemon.sources.log.files import (
    FINGERPRINT_BYTES,
    FileIdentity,
    OpenFile,
    Position,
    open_file,
)
from loadwatch.daemon.sources.log.follow_state import TAIL_BYTES
from loadwatch.daemon.sources.log.generations import Generations

LEFT_KEPT = 16  # files left that are remembered, for one that comes back

# A file left: its identity, first bytes, where we were, whether it ended in "\r", and the bytes
# before that place.
Left = tuple[str, bytes, int, bool, bytes]


class FileSet:
    """The open files of one path, oldest first; see the module docstring."""

    def __init__(self, path: str, rotated_keep: int) -> None:
        self.path = path
        self.gens = Generations(path, rotated_keep)  # the path's rotated names
        self.sources: list[OpenFile] = []  # read oldest first: the first is read now
        self.known: list[FileIdentity] = []  # identities given before: see `know`
        self.last_end: Position | None = None  # after the last record delivered
        self.exists = False  # the path named a file at the last `refresh`
        self.at_path = False  # ... and that file is the newest open one
        self.rotations = 0  # files switched to (rename, delete + recreate, copytruncate copies)
        self.truncations = 0
        self.rewrites = 0  # files found rewritten in place (same first bytes, longer)
        self._left: dict[tuple[int, int], Left] = {}  # files left, by inode

    # -- what the other parts ask ---------------------------------------------------------------

    def know(self, ident: FileIdentity) -> None:
        """An identity given before: a file it names gets exactly it (`OpenFile.known_as`)."""
        if ident not in self.known:
            self.known.append(ident)

    def fix_identity(self, src: OpenFile) -> str:
        """`src`'s identity, taken at its first delivery."""
        return src.fix_identity(self.known, copy=src.name != self.path)

    def position(self) -> Position | None:
        """Where the next undelivered record starts; None when no file is open."""
        if not self.sources:
            return None
        src = self.sources[0]
        if src.ident is not None:
            return Position(src.ident, src.rs)
        if self.last_end is not None:
            # Nothing delivered from this file yet (new at the path, or cut back in place): after
            # the last record delivered, which names its file by its first bytes. This file may
            # be empty, and an identity of no bytes would name whatever its inode holds later.
            return self.last_end
        try:
            return Position(src.provisional_identity(self.known, src.name != self.path), src.rs)
        except OSError:
            return None

    def first_bytes_seen(self) -> list[tuple[str | None, bytes]]:
        """The files read, open or left, by identity with their first bytes as far as known."""
        seen = [(src.ident, src.first_bytes()) for src in self.sources]
        return seen + [(ident, prefix) for ident, prefix, *_ in self._left.values()]

    # -- what reading changes -------------------------------------------------------------------

    def delivered(self, end: Position) -> None:
        """A read delivered records up to `end`."""
        self.last_end = end

    def begin(self, sources: list[OpenFile]) -> None:
        """Read these first: the files where a start position was found (none are open)."""
        self.sources = sources

    def switch(self, sources: list[OpenFile]) -> None:
        """Read these instead of the files open now (a `seek`)."""
        self.close()
        self.sources = sources
        self.last_end = None

    def leave(self, src: OpenFile, rs: int) -> None:
        """Done with the first file, `src`, read to `rs`: remembered, closed, and dropped."""
        self._remember(src, rs)
        src.close()
        self.sources.pop(0)

    def close(self) -> None:
        for src in self.sources:
            src.close()
        self.sources = []

    # -- noticing rotations and truncations -----------------------------------------------------

    def refresh(self) -> None:
        """Look at the path: a file to read, another file (rotated), or one that shrank."""
        try:
            st: os.stat_result | None = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", self.path)
        self.exists = st is not None
        self.at_path = False
        if not self.sources:
            src = open_file(self.path) if st is not None else None
            if src is not None:
                self.sources.append(src)
                self.at_path = True
            return
        newest = self.sources[-1]
        if st is not None and (st.st_dev, st.st_ino) == newest.key:
            self.at_path = True
            self._check_truncation(newest, st.st_size)
        elif st is not None and st.st_size > 0:
            # The file we read may have been cut (copytruncate) before it was renamed away:
            # that is seen at its own size, not at the path's.
            self._check_truncation(newest, os.fstat(newest.fd).st_size)
            self._rotate(newest)
            self.at_path = True

    def replaced_while_reading(self, src: OpenFile) -> bool:
        """The file was truncated (and grew again) under a read: that read is not ours.

        Checked after every read, not only once per `read()`, because a copytruncate can happen
        and the file regrow past our place while a large backlog is being read. True when a copy
        of it now goes first (stop reading `src`).
        """
        size = os.fstat(src.fd).st_size
        src.last_size = size
        self._truncated(src, size)
        return self.sources[0] is not src

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
            tail = src.recent_tail(TAIL_BYTES)
            if os.pread(src.fd, len(tail), src.rs - len(tail)) != tail:
                self.rewrites += 1
                self.truncations += 1
                end = _kept_end(src, size)
                if end is not None and end > src.recent[0][0]:  # it differs in our window
                    src.rs, src.skipping, src.head = end, False, b""
                    src.forget()
                else:  # before it: read it all again, as a new file
                    src.reset()

    def _truncated(self, src: OpenFile, size: int) -> None:
        self.truncations += 1
        if src.prefix:  # we saw its first bytes, so a copy of it can be recognised
            names = self.gens.names()
            found = self.gens.find_copy(names, src.prefix, src.rs, {s.key for s in self.sources})
            if found is not None:
                j, copy = found
                copy.rs, copy.ident, copy.prefix, copy.cr_end = (
                    src.rs,
                    src.ident,
                    src.prefix,
                    src.cr_end,
                )
                known = {s.key for s in self.sources} | {copy.key}
                newer = self.gens.open_newer(names, j - 1, known)
                i = self.sources.index(src)
                self.sources[i:i] = [copy, *newer]
                self.rotations += 1 + len(newer)
                src.reset()
                return
            if size >= len(src.prefix) and os.pread(src.fd, len(src.prefix), 0) == src.prefix:
                end = _kept_end(src, size)
                if end is not None:  # cut back, and we can tell where: go on from there
                    src.rs, src.skipping, src.head = end, False, b""
                    src.forget()
                    return
        src.reset()

    def _rotate(self, newest: OpenFile) -> None:
        """The path holds another file with data: queue the files newer than `newest`."""
        known = {s.key for s in self.sources}
        names = self.gens.names()
        newer = self.gens.open_newer(names, self.gens.index_of(names, newest.key) - 1, known)
        current = open_file(self.path)
        if current is not None and current.key not in known:
            self._resume_known(current)
            newer.append(current)
        elif current is not None:
            current.close()
        self.sources.extend(newer)
        self.rotations += len(newer)

    def _remember(self, src: OpenFile, rs: int) -> None:
        """A file we leave may come back to the path (a symlink flipped back to a target read
        before, a rotation undone): kept by inode with where we were, to resume there."""
        if src.ident is None:
            return
        tail = src.recent_tail(TAIL_BYTES)
        if rs != src.rs:
            tail = b""  # (an unterminated last record was delivered: its bytes are not kept)
        self._left[src.key] = (src.ident, src.first_bytes(), rs, src.cr_end, tail)
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


def _kept_end(src: OpenFile, size: int) -> int | None:
    """Where the file stops matching the bytes we delivered, when that lies in our window.

    The file still begins with our bytes but is shorter than our place: it was cut back to some
    point, and lines may have been appended since. Where it first differs from what we delivered
    last, new lines began; we go back to the start of that record, since a new line may well
    begin with the same bytes as the old one there (timestamps). Earlier than our window we
    cannot tell (then: from 0).
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
