"""inotify(7) through libc: one non-blocking descriptor that its owner reads in its own thread.

Why not watchdog's observer: it hands every event through three threads of its own (the reader,
the move-event grouper's delayed queue, the dispatcher) before our handler runs, and each
hand-over costs the interpreter lock and a wake-up; beside a busy serving log that was most of
the daemon's cost. Here the descriptor is read where it is waited on: an asyncio loop's reader
(`loop.add_reader`), or `select` for a blocking wait, so a wake-up costs one system call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from dataclasses import dataclass

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED  # about the watched directory itself

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_READ = 64 * 1024


@dataclass(frozen=True, slots=True)
class InotifyEvent:
    wd: int  # -1 for a queue overflow
    mask: int
    name: str  # the entry's name in the watched directory ("" for the directory itself)


_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    return _libc


def _error(what: str, path: str | None = None) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}", path)


class Inotify:
    """An inotify descriptor (non-blocking, close-on-exec) and its watches."""

    def __init__(self) -> None:
        try:
            lib = _lib()
        except (OSError, AttributeError) as exc:  # no libc with inotify (not Linux)
            raise OSError(errno.ENOSYS, f"inotify is not available: {exc}") from None
        fd = lib.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            raise _error("inotify_init1")
        self.fd: int = fd

    def add(self, path: str, mask: int) -> int:
        """Watch `path` for the events in `mask`; the watch descriptor."""
        wd = _lib().inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise _error("inotify_add_watch", path)
        return int(wd)

    def remove(self, wd: int) -> None:
        _lib().inotify_rm_watch(self.fd, wd)  # (gone already when its directory was deleted)

    def read(self) -> list[InotifyEvent]:
        """The distinct events queued now, in the order first seen; none when nothing is (it
        never blocks). A file written 30 times since the last read raised 30 IN_MODIFY events
        (the kernel merges only an event equal to the one queued just before it, so two files
        written in turn merge nothing): one of them says all they say, and each costs the
        reader its decoding and its test, per line a serving vLLM writes."""
        out: list[InotifyEvent] = []
        seen: set[tuple[int, int, bytes]] = set()
        while True:
            try:
                buf = os.read(self.fd, _READ)
            except BlockingIOError:
                return out
            at, end = 0, len(buf)
            while at + _HEADER.size <= end:
                wd, mask, _, n = _HEADER.unpack_from(buf, at)
                at += _HEADER.size
                key = (wd, mask, buf[at : at + n])
                at += n
                if key not in seen:
                    seen.add(key)
                    out.append(InotifyEvent(wd, mask, os.fsdecode(key[2].rstrip(b"\0"))))
            if end < _READ // 2:  # a short read took all there was
                return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
