"""The files behind a followed path: who a file is, and where it went after a rotation.

A file is known by device + inode and a fingerprint of its first bytes (`FileIdentity`). The
path's rotated names are ``PATH.1`` (newest) to ``PATH.<keep>``, then logrotate's ``dateext``
names (``PATH-20261130``, ``PATH-2026-11-30-1764460800``: a dash and a date), newest first;
`Generations` looks among them for a file by identity (renamed: same inode) or by first bytes (a
copytruncate copy), and opens the files that came after it. A rotated name may hold its file
compressed (``PATH.2.gz``, logrotate's ``compress``): found by its first bytes, it is read from a
temporary file it is inflated into (only its first bytes and what lies after the place to read
from take disk space).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import stat
import tempfile
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

FINGERPRINT_BYTES = 256
RECENT_BYTES = 256 * 1024  # delivered bytes kept to find where a file that shrank was cut
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a FIFO must not hang us

Found = Literal["exact", "rotated", "changed"]  # at the path, at a rotated name, cut back


def fingerprint(prefix: bytes) -> str:
    return hashlib.blake2b(prefix, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """Device, inode and a fingerprint of the first ``fp_len`` bytes of one file."""

    dev: int
    ino: int
    fp_len: int
    fp: str

    def __str__(self) -> str:
        return f"{self.dev}:{self.ino}:{self.fp_len}:{self.fp}"

    @classmethod
    def parse(cls, text: str) -> FileIdentity:
        parts = text.split(":")
        try:
            if len(parts) != 4:
                raise ValueError
            dev, ino, fp_len = int(parts[0]), int(parts[1]), int(parts[2])
            if min(dev, ino, fp_len) < 0 or len(parts[3]) != 16:
                raise ValueError
            int(parts[3], 16)
        except ValueError:
            raise ValueError(f"not a file identity: {text!r}") from None
        return cls(dev, ino, fp_len, parts[3])


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record starts: the file (`FileIdentity` as text) and the byte offset in it."""

    file_id: str
    offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"file_id": self.file_id, "offset": self.offset}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Position:
        file_id, offset = doc.get("file_id"), doc.get("offset")
        if not isinstance(file_id, str) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"not a position: {dict(doc)!r}")
        FileIdentity.parse(file_id)
        return cls(file_id, offset)


class OpenFile:
    """One open file being read; `rs` is the start of its first undelivered record."""

    __slots__ = (
        "cr_end",
        "fd",
        "head",
        "ident",
        "key",
        "last_size",
        "name",
        "prefix",
        "recent",
        "recent_bytes",
        "rs",
        "skip_pos",
        "skipping",
    )

    def __init__(self, fd: int, key: tuple[int, int], name: str, size: int) -> None:
        self.fd = fd
        self.key = key
        self.name = name
        self.rs = 0
        self.skipping = False  # inside a record longer than the cap
        self.skip_pos = 0
        self.head = b""  # that record's first cap bytes
        self.ident: str | None = None  # fixed at the first delivery
        self.prefix = b""  # first bytes seen, grown up to FINGERPRINT_BYTES
        self.last_size = size
        self.cr_end = False  # last chunk ended in "\r": a leading "\n" is not a new record
        self.recent: deque[tuple[int, bytes]] = deque()  # the last chunks, contiguous, to `rs`
        self.recent_bytes = 0

    def reset(self) -> None:
        """Its content was replaced: start over, as a new file."""
        self.rs = 0
        self.skipping = False
        self.skip_pos = 0
        self.head = b""
        self.ident = None
        self.prefix = b""
        self.cr_end = False
        self.forget()

    def forget(self) -> None:
        self.recent.clear()
        self.recent_bytes = 0

    def remember(self, offset: int, data: bytes) -> None:
        recent = self.recent
        recent.append((offset, data))
        self.recent_bytes += len(data)
        while self.recent_bytes > RECENT_BYTES and len(recent) > 1:
            self.recent_bytes -= len(recent.popleft()[1])

    def fix_identity(self, known: Sequence[FileIdentity] = (), copy: bool = False) -> str:
        """The identity, taken at the first delivery from this file (see `identity`)."""
        prefix = os.pread(self.fd, FINGERPRINT_BYTES, 0)
        if len(prefix) > len(self.prefix):
            self.prefix = prefix
        self.ident = self.identity(known, self.prefix, copy)
        return self.ident

    def provisional_identity(self, known: Sequence[FileIdentity] = (), copy: bool = False) -> str:
        """An identity for a file nothing was delivered from yet (offset 0 fits any file)."""
        return self.identity(known, os.pread(self.fd, FINGERPRINT_BYTES, 0), copy)

    def identity(self, known: Sequence[FileIdentity], prefix: bytes, copy: bool = False) -> str:
        """This file's identity, its first bytes being `prefix`: the one of `known` that names
        it (`known_as`), else a new one."""
        dev, ino = self.key
        name = self.known_as(known, prefix, copy)
        return name or str(FileIdentity(dev, ino, len(prefix), fingerprint(prefix)))

    def known_as(
        self, known: Sequence[FileIdentity], prefix: bytes, copy: bool = False
    ) -> str | None:
        """The first of `known` that names this file, whose first bytes are `prefix`: the same
        inode and the same first bytes over its length; with `copy` (the file is at a rotated
        name), failing that, another inode with those first bytes: the copy a copytruncate
        rotation made, as `Generations.locate` takes it. So a file keeps the identity it was
        given before, whatever its length was then, and identities compare as strings (one
        taken of an empty file names whatever its inode holds now, as for `locate`). A file cut
        back and written again in place keeps its inode, not its first bytes: no match."""
        dev, ino = self.key

        def same_bytes(k: FileIdentity) -> bool:
            return k.fp_len <= len(prefix) and fingerprint(prefix[: k.fp_len]) == k.fp

        for k in known:
            if (k.dev, k.ino) == (dev, ino) and same_bytes(k):
                return str(k)
        if copy:
            for k in known:
                if (k.dev, k.ino) != (dev, ino) and k.fp_len > 0 and same_bytes(k):
                    return str(k)
        return None

    def matches(self, ident: FileIdentity) -> bool:
        prefix = os.pread(self.fd, ident.fp_len, 0)
        if len(prefix) != ident.fp_len or fingerprint(prefix) != ident.fp:
            return False
        self.prefix = prefix
        return True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


_DIGITS = "0123456789"


def _date_suffix(rest: str) -> bool:
    """`rest` reads as a logrotate dateformat's output: a digit first, then digits and `-_.`."""
    return rest != "" and rest[0] in _DIGITS and all(c in _DIGITS or c in "-_." for c in rest)


def stat_file(path: str) -> os.stat_result | None:
    """The path's stat when it is a regular file, else None."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def open_file(path: str) -> OpenFile | None:
    """Open for reading; None when missing. Raises OSError when it is not a regular file."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return OpenFile(fd, (st.st_dev, st.st_ino), path, st.st_size)


GZ = ".gz"
GZIP_MAGIC = b"\x1f\x8b"
_GZ_ERRORS = (OSError, EOFError, zlib.error)  # not gzip, cut short, corrupt
_INFLATE_MARGIN = 64 * 1024  # bytes kept before the place to read from
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib's gzip format


def inflate_into(path: str, dst: IO[bytes], keep_from: int = 0, head: int = 0) -> str | None:
    """Write a gzip file's content (every member) into `dst` at its own offsets, leaving out
    the bytes from `head` to `keep_from` (a hole in `dst`). Returns None when the data ended
    where it should, else why it ended early ("cut short", "corrupt: ..."): what came before
    is written all the same. Raises OSError when `path` cannot be read."""
    pos = 0
    lo = max(keep_from, head)
    fed = False  # the current member got data
    z = zlib.decompressobj(_GZIP_WBITS)
    why: str | None = None
    with open(path, "rb") as src:
        while why is None:
            raw = src.read(1 << 16)
            if not raw:
                break
            while raw and why is None:
                try:
                    out = z.decompress(raw)
                except zlib.error as exc:
                    why = f"corrupt: {exc}"
                    break
                fed = True
                end = pos + len(out)
                if pos < head:
                    dst.seek(pos)
                    dst.write(out[: min(end, head) - pos])
                if end > lo:
                    at = max(pos, lo)
                    dst.seek(at)
                    dst.write(out[at - pos :])
                pos = end
                raw = b""
                if z.eof:  # a member ends: another may follow, or zeros of padding
                    rest = z.unused_data
                    z, fed = zlib.decompressobj(_GZIP_WBITS), False
                    if rest.strip(b"\0") and not rest.startswith(GZIP_MAGIC[: len(rest)]):
                        why = "corrupt: data after the end of the gzip stream"
                    elif rest.strip(b"\0"):
                        raw = rest
    if why is None and fed:
        why = "cut short"
    dst.truncate(pos)  # its size, holes included
    dst.flush()
    return why


def _gz_head(path: str, size: int) -> bytes | None:
    """The first `size` bytes of a gzip file's content; None when it is not one (or unreadable)."""
    try:
        with gzip.open(path, "rb") as z:
            return z.read(size)
    except _GZ_ERRORS:
        return None


def _gz_reaches(path: str, offset: int) -> bool:
    """Whether a gzip file's content is at least `offset` bytes long (inflated, not kept)."""
    try:
        with gzip.open(path, "rb") as z:
            got = 0
            while got < offset:
                n = len(z.read(min(1 << 20, offset - got)))
                if n == 0:
                    return False
                got += n
        return True
    except _GZ_ERRORS:
        return False


def inflate(path: str, offset: int = 0) -> OpenFile | None:
    """A gzip file's content in an unlinked temporary file, open as an `OpenFile` named `path`:
    its first bytes, then what lies from a little before `offset` on (the bytes between are a
    hole: no disk); of data that ends early (cut short, corrupt further on), what it holds.
    None when it cannot be read or holds nothing. It is known by the gzip file's device and
    inode (its `key`), as a plain rotated file is by its own: inflated again, it is the same."""
    try:
        gz = os.stat(path)
        with tempfile.TemporaryFile() as tmp:
            why = inflate_into(path, tmp, offset - _INFLATE_MARGIN, FINGERPRINT_BYTES)
            if why is not None and os.fstat(tmp.fileno()).st_size == 0:
                return None
            fd = os.dup(tmp.fileno())
    except OSError:
        return None
    return OpenFile(fd, (gz.st_dev, gz.st_ino), path, os.fstat(fd).st_size)


def open_rotated(name: str) -> OpenFile | None:
    """The file at a rotated name, or else its compressed form (`name` + ``.gz``) inflated."""
    f = open_file(name)
    if f is None and stat_file(name + GZ) is not None:
        f = inflate(name + GZ)
    return f


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

    def written_after(self, t: float) -> list[OpenFile]:
        """The rotated files (plain or compressed) last written after `t`, open, oldest first:
        when the file a checkpoint saved at `t` names is gone, these came after it."""
        names = self.names()
        found: dict[tuple[int, int], tuple[float, str]] = {}
        for name in names[1:]:
            st = stat_file(name) or stat_file(name + GZ)
            if st is not None and st.st_mtime > t:
                found.setdefault((st.st_dev, st.st_ino), (st.st_mtime, name))
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
            head = _gz_head(gz, ident.fp_len)
            if head is None or len(head) != ident.fp_len or fingerprint(head) != ident.fp:
                continue
            if not opened:
                if _gz_reaches(gz, offset):
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
