"""When a file was created (its birth time, `statx(2)`'s ``stx_btime``): what tells a file from a
later one that got its freed inode.

An inode freed by logrotate's `compress` (the plain file removed) is soon given to the next file
created in that directory, often the new log at the path. A file known by its inode alone (it was
empty when the follower first saw it: no first bytes to compare) would then be taken for the new
one. Their birth times differ. Python has no `os.statx` before 3.13, so glibc's is called through
ctypes; where the call, the kernel or the filesystem gives no birth time, `born_ns` is None and
nothing is decided by it.
"""

from __future__ import annotations

import functools
import os
import struct

_AT_EMPTY_PATH = 0x1000
_STATX_BTIME = 0x800
_STATX_SIZE = 256  # struct statx, with its spare words
_MASK = struct.Struct("=I")  # stx_mask, at offset 0
_BTIME = struct.Struct("=qI")  # stx_btime: tv_sec, tv_nsec, at offset 80


@functools.cache
def _statx() -> object | None:
    """glibc's `statx`, found when first asked for (`analyze` reads a file without asking when
    it was born): in the process's own symbols, which hold libc's."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def born_ns(fd: int) -> int | None:
    """The birth time of the open file `fd` in nanoseconds, or None when it cannot be known."""
    statx = _statx()
    if statx is None:
        return None
    import ctypes

    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if statx(fd, b"", _AT_EMPTY_PATH, _STATX_BTIME, buf) != 0:  # type: ignore[operator]
        return None
    raw = buf.raw
    if not _MASK.unpack_from(raw, 0)[0] & _STATX_BTIME:
        return None
    sec, nsec = _BTIME.unpack_from(raw, 80)
    return int(sec) * 1_000_000_000 + int(nsec)


def born_ns_of(path: str) -> int | None:
    """`born_ns` of the file at `path`, or None (also when it cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return born_ns(fd)
    finally:
        os.close(fd)
