"""Writes that never wait: for outputs a reader may stop reading (a pipe, a FIFO, a socket).

The daemon's loop writes the event log as it goes; a stdout pipe nobody drains or a FIFO with no
reader would block it after 64 KiB and stop everything. Here a line goes out whole or not at
all: when the reader has no room for it, it is dropped and counted, and the rest of a line a
full pipe took only in part goes out before anything else, so no reader sees a torn line.

A pipe, FIFO or terminal inherited as stdout is opened again through /proc/self/fd (Linux), so
that O_NONBLOCK is set on a file description of our own, not on the one the shell or the
supervisor shares; a socket (journald's stdout) is sent to with MSG_DONTWAIT.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket


class NonBlockingWriter:
    def __init__(self, fd: int, *, own: bool = False) -> None:
        """`own`: `fd` is ours alone (we opened it) and is made non-blocking in place; else a
        descriptor of our own is made for it. Raises OSError when neither can be done."""
        self._sock: socket.socket | None = None
        self._fd: int | None = None
        mode = os.fstat(fd).st_mode
        if stat.S_ISSOCK(mode):
            import socket  # (here: only journald's stdout is one; `analyze` writes to none)

            self._sock = socket.socket(fileno=os.dup(fd))
        elif own:
            os.set_blocking(fd, False)
            self._fd = fd
        else:
            flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
            self._fd = os.open(f"/proc/self/fd/{fd}", flags)
        self._rest = b""
        self.dropped = 0  # lines not written: the reader had no room

    def write(self, data: bytes) -> bool:
        """Write `data` (whole lines: one, or those held together) now or drop it; False when
        dropped."""
        if self._rest and not self._send_rest():
            self.dropped += data.count(b"\n") or 1
            return False
        try:
            n = self._send(data)
        except BlockingIOError:
            self.dropped += data.count(b"\n") or 1
            return False
        self._rest = data[n:]
        return True

    def _send_rest(self) -> bool:
        try:
            n = self._send(self._rest)
        except BlockingIOError:
            return False
        self._rest = self._rest[n:]
        return not self._rest

    def _send(self, data: bytes) -> int:
        if self._sock is not None:
            import socket

            return self._sock.send(data, socket.MSG_DONTWAIT)
        assert self._fd is not None
        try:
            return os.write(self._fd, data)
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                raise BlockingIOError(exc.errno, exc.strerror) from None
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def for_stream(stream: object) -> NonBlockingWriter | None:
    """A writer for a stream on a pipe, FIFO, socket or terminal; None for a regular file (a
    write there does not wait on a reader) or a stream with no descriptor (a StringIO)."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    try:
        flush = getattr(stream, "flush", None)
        if flush is not None:
            flush()  # what was printed before goes first
        return NonBlockingWriter(fd)
    except OSError:
        return None
