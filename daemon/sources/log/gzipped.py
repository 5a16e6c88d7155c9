"""Rotated files that logrotate compressed (``PATH.2.gz``): read through a temporary file their
content is inflated into, at its own offsets (only the first bytes and what lies after the place
to read from take disk space)."""

from __future__ import annotations

import gzip
import os
import tempfile
import zlib
from typing import IO

from loadwatch.daemon.sources.log.files import FINGERPRINT_BYTES, OpenFile, open_file, stat_file

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


def gz_head(path: str, size: int) -> bytes | None:
    """The first `size` bytes of a gzip file's content; None when it is not one (or unreadable)."""
    try:
        with gzip.open(path, "rb") as z:
            return z.read(size)
    except _GZ_ERRORS:
        return None


def gz_reaches(path: str, offset: int) -> bool:
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
