"""The writes of ``loadwatch patch-model`` (patch.py): each one whole or not at all.

A file is written to a temporary in the same directory, synced, given its mode and renamed over
the old one; a symbolic link is made at a temporary name and renamed into place. A rename
replaces a link itself, never writes through it, which is what keeps a Hugging Face cache's
blobs untouched when the links of a snapshot are replaced. The directory is synced after each,
so the rename reaches the disk.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory: fsync, chmod, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_symlink(path: Path, text: str) -> None:
    """Make ``path`` a symbolic link holding ``text``, replacing what is there in one rename."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            os.symlink(text, tmp)
            break
        except FileExistsError:
            continue
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_mode(path: Path) -> int:
    """The permission bits of ``path`` (of a link's target)."""
    return stat.S_IMODE(path.stat().st_mode)
