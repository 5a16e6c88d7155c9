"""The path and its rotated names (``PATH.1`` ..., logrotate's dated names, their compressed
forms): where a file of ours went after a rotation, and the files that came after it."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from loadwatch.daemon.sources.log.birth import born_ns_of
from loadwatch.daemon.sources.log.checkpoint import Checkpoint
from loadwatch.daemon.sources.log.files import (
    FileIdentity,
    Found,
    OpenFile,
    fingerprint,
    open_file,
    stat_file,
)
from loadwatch.daemon.sources.log.gzipped import GZ, gz_head, gz_reaches, inflate, open_rotated

_DIGITS = "0123456789"


def _date_suffix(rest: str) -> bool:
    """`rest` reads as a logrotate dateformat's output: a digit first, then digits and `-_.`."""
    return rest != "" and rest[0] in _DIGITS and all(c in _DIGITS or c in "-_." for c in rest)


@dataclass(frozen=True, slots=True)
class Since:
    """When the file a checkpoint names was last seen written: a file last written at or after
    that (its filesystem's clock, `Checkpoint.file_mtime_ns`) came after it. A checkpoint saved
    without it has only the daemon's clock at the save, which a file written just after can
    precede by the kernel's timestamp granularity: then strictly after it."""

    mtime_ns: int
    inclusive: bool

    @staticmethod
    def of(cp: Checkpoint) -> Since | None:
        if cp.file_mtime_ns is not None:
            return Since(cp.file_mtime_ns, True)
        if cp.saved_at is not None:
            return Since(int(cp.saved_at * 1e9), False)
        return None

    def before(self, mtime_ns: int) -> bool:
        return mtime_ns >= self.mtime_ns if self.inclusive else mtime_ns > self.mtime_ns


class Generations:
    """The path and its rotated names, newest first: PATH, PATH.1, ..., PATH.<keep>, then the
    newest <keep> dateext names by modification time (a host uses one scheme or the other; with
    both, every dated name counts as older than the numbered ones); a rotated name stands for
    its compressed form too (``.gz``). An index names a place in one `names()` list; a method
    that takes an index takes the list it came from."""

    def __init__(self, path: str, keep: int) -> None:
        self.path = path
        self.keep = keep
        self._dir, self._base = os.path.split(path)

    def names(self) -> list[str]:
        out = [self.path, *(f"{self.path}.{i}" for i in range(1, self.keep + 1))]
        return out + self._dated() if self.keep > 0 else out

    def _dated(self) -> list[str]:
        """The newest <keep> names ``PATH-<date>``: digits first, then digits, `-`, `_`, `.`
        (logrotate's dateformat); a compressed one (``.gz``) by the name it stands for."""
        lead = self._base + "-"
        found: dict[str, int] = {}
        try:
            with os.scandir(self._dir or ".") as it:
                for entry in it:
                    name = entry.name.removesuffix(GZ)
                    if not name.startswith(lead) or not _date_suffix(name[len(lead) :]):
                        continue
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        path = os.path.join(self._dir, name)
                        found[path] = max(found.get(path, 0), st.st_mtime_ns)
        except OSError:
            return []
        # newest first; at one mtime, the later date first
        newest = sorted(((t, path) for path, t in found.items()), reverse=True)
        return [path for _, path in newest[: self.keep]]

    def index_of(self, names: Sequence[str], key: tuple[int, int]) -> int:
        """Which rotated name holds the file with this (dev, inode) now (its compressed form
        counts: see `inflate`); 0 when none."""
        for i in range(1, len(names)):
            st = stat_file(names[i]) or stat_file(names[i] + GZ)
            if st is not None and (st.st_dev, st.st_ino) == key:
                return i
        return 0

    def reborn(self, key: tuple[int, int], born: int) -> bool:
        """The (dev, inode) `key` is at the path or a rotated name, held by a file born at
        another time than `born` (a later file given the inode); False when that cannot be
        told."""
        for name in self.names():
            st = stat_file(name)
            if st is not None and (st.st_dev, st.st_ino) == key:
                now = born_ns_of(name)
                return now is not None and now != born
        return False

    def open_newer(
        self, names: Sequence[str], index: int, known: set[tuple[int, int]]
    ) -> list[OpenFile]:
        """Open names[index] down to names[1] (oldest first), leaving out files in `known`."""
        known = set(known)
        out: list[OpenFile] = []
        for i in range(index, 0, -1):
            f = open_rotated(names[i])
            if f is None:
                continue
            if f.key in known:
                f.close()
                continue
            known.add(f.key)
            out.append(f)
        return out

    def written_after(self, since: Since) -> list[OpenFile]:
        """The rotated files (plain or compressed) last written after `since`, open, oldest
        first: when the file a checkpoint names is gone, these came after it."""
        names = self.names()
        found: dict[tuple[int, int], tuple[int, str]] = {}
        for name in names[1:]:
            st = stat_file(name) or stat_file(name + GZ)
            if st is not None and since.before(st.st_mtime_ns):
                found.setdefault((st.st_dev, st.st_ino), (st.st_mtime_ns, name))
        out: list[OpenFile] = []
        for _, name in sorted(found.values()):
            f = open_rotated(name)
            if f is not None:
                out.append(f)
        return out

    def find_copy(
        self, names: Sequence[str], prefix: bytes, min_size: int, known: set[tuple[int, int]]
    ) -> tuple[int, OpenFile] | None:
        """A rotated file that begins with `prefix` and reaches `min_size`: a copytruncate copy."""
        for i in range(1, len(names)):
            st = stat_file(names[i])
            if st is None or (st.st_dev, st.st_ino) in known:
                continue
            if st.st_size < max(min_size, len(prefix)):
                continue
            f = open_file(names[i])
            if f is None:
                continue
            if os.pread(f.fd, len(prefix), 0) == prefix:
                return i, f
            f.close()
        return None

    def where(self, ident: FileIdentity, offset: int = 0) -> int | None:
        """Which name holds the file `ident` names now (its index in `names()`: 0 the path, a
        higher one an older file), found as `locate` finds it and reaching `offset` (not cut
        back below it); None when none does."""
        _, hit, shrunk = self._find(ident, offset, opened=False)
        for found in (hit, shrunk):
            if found is not None and found[1] is not None:
                found[1].close()
        return hit[0] if hit is not None else None

    def _find(
        self, ident: FileIdentity, offset: int, opened: bool = True
    ) -> tuple[list[str], tuple[int, OpenFile | None] | None, tuple[int, OpenFile] | None]:
        """(names, hit, shrunk), hit and shrunk each an index in `names` and the file open
        there: the file with the inode and first bytes `ident` names, or else a copy with those
        bytes at a rotated name (copytruncate), or compressed there, reaching `offset`;
        `shrunk`, that inode with those bytes but shorter than `offset` (cut back), when no
        hit. A compressed hit is inflated only when `opened` (else its file is None)."""
        names = self.names()
        stats = [stat_file(name) for name in names]
        hit: tuple[int, OpenFile | None] | None = None
        shrunk: tuple[int, OpenFile] | None = None
        for i, st in enumerate(stats):  # the same inode, still with our first bytes
            if st is None or (st.st_dev, st.st_ino) != (ident.dev, ident.ino):
                continue
            f = open_file(names[i])
            if f is not None and f.matches(ident):
                if f.last_size >= offset:
                    hit = (i, f)
                else:
                    shrunk = (i, f)
            elif f is not None:
                f.close()
            break
        if hit is None and ident.fp_len > 0:  # a copy (no bytes name no copy)
            for i in range(1, len(stats)):
                st = stats[i]
                if st is None or st.st_size < max(offset, ident.fp_len):
                    continue
                if (st.st_dev, st.st_ino) == (ident.dev, ident.ino):
                    continue
                f = open_file(names[i])
                if f is not None and f.matches(ident):
                    hit = (i, f)
                    break
                if f is not None:
                    f.close()
        if hit is None and ident.fp_len > 0:  # as a copy, before a file cut back
            hit = self._compressed(names, ident, offset, opened)
        return names, hit, shrunk

    @staticmethod
    def _compressed(
        names: Sequence[str], ident: FileIdentity, offset: int, opened: bool
    ) -> tuple[int, OpenFile | None] | None:
        """The rotated name whose compressed form holds the file `ident` names (its first bytes),
        reaching `offset`: inflated when `opened`."""
        for i in range(1, len(names)):
            gz = names[i] + GZ
            if stat_file(gz) is None:
                continue
            head = gz_head(gz, ident.fp_len)
            if head is None or len(head) != ident.fp_len or fingerprint(head) != ident.fp:
                continue
            if not opened:
                if gz_reaches(gz, offset):
                    return i, None
                continue
            f = inflate(gz, offset)
            if f is not None and f.last_size >= offset:
                return i, f
            if f is not None:
                f.close()
        return None

    def locate(self, ident: FileIdentity, offset: int) -> tuple[list[OpenFile], Found] | None:
        """Open the file `ident` names, set to read from `offset`, and the files after it.

        Looked for at the path and the rotated names by inode (with the same first bytes), then
        among the rotated names by first bytes alone (a copy), then among their compressed forms
        (inflated). A file still ours but shorter than `offset` was cut back while we were away:
        read from 0 ("changed"). None when gone.
        """
        names, hit, shrunk = self._find(ident, offset)
        found: Found = "exact"
        if hit is None and shrunk is not None:
            hit, offset, found = shrunk, 0, "changed"
        elif shrunk is not None:
            shrunk[1].close()
        if hit is None or hit[1] is None:
            return None
        i, first = hit[0], hit[1]
        first.rs, first.ident = offset, str(ident)
        files = [first]
        known = {first.key}
        for j in range(i - 1, -1, -1):
            f = open_rotated(names[j]) if j > 0 else open_file(names[j])
            if f is None or f.key in known:
                if f is not None:
                    f.close()
                continue
            known.add(f.key)
            files.append(f)
        if found == "exact" and i > 0:
            found = "rotated"
        return files, found
