"""Noticing what happened to the files being read: rotations and truncations.

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
- a record left without its terminator in a file we leave is delivered with ``b"\n"`` appended
  and ``cut=True`` (counted as unterminated).
"""

from __future__ import annotations

import os

from loadwatch.daemon.sources.log.files import FINGERPRINT_BYTES, OpenFile, open_file
from loadwatch.daemon.sources.log.follow_state import (
    LEFT_KEPT,
    TAIL_BYTES,
    FollowerState,
)


class FollowerChanges(FollowerState):
    """A file at the path that is another one (rotated), or one that shrank (truncated)."""

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
