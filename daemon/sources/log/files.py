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
import hashlib
import os
import stat
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

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

    def first_bytes(self) -> bytes:
        """Its first bytes as far as they are known: those seen (`prefix`), grown to what it
        holds now when it still begins with them (a file given a known identity saw none)."""
        if len(self.prefix) >= FINGERPRINT_BYTES:
            return self.prefix
        try:
            now = os.pread(self.fd, FINGERPRINT_BYTES, 0)
        except OSError:
            return self.prefix
        return now if now.startswith(self.prefix) else self.prefix

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

    def recent_tail(self, n: int) -> bytes:
        """The last `n` bytes of those delivered lately (fewer when fewer are kept), without
        joining all of them: it runs at every read that finds the file grown."""
        parts: list[bytes] = []
        size = 0
        for _, data in reversed(self.recent):
            parts.append(data)
            size += len(data)
            if size >= n:
                break
        return b"".join(reversed(parts))[-n:] if n > 0 else b""

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
