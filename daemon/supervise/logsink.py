"""vLLM's output to the log file: a pump that copies bytes as they come, and size-based rotation.

The pump reads the pipe with ``os.read``, which returns whatever is there, so a tqdm ``\\r``
update reaches the file at once, never held back waiting for a newline. It runs in its own
thread so that vLLM never blocks on a full pipe while the event loop is busy.

Rotation renames ``PATH`` to ``PATH.1`` (``PATH.1`` to ``PATH.2``, ..., keeping N) and reopens
``PATH``, which is what the follower expects. It happens only at a record boundary (after ``\\n``,
or after a ``\\r`` not followed by ``\\n``), so no record is split across two files; a file can
thus exceed the limit by at most the rest of one record. The concatenation ``PATH.N ... PATH.1
PATH`` is byte for byte what vLLM wrote.

With ``[vllm] output = "file+stdout"`` the pump also hands each chunk to a ``LineCopy``, which
passes vLLM's output on as whole lines (to loadwatch's stdout, between the event log's lines).
"""

from __future__ import annotations

import os
import select
import stat
import threading
from collections.abc import Callable

_DRAIN_AFTER_STOP_BYTES = 1 << 20
_LF = 0x0A
_CR = 0x0D


def _last_boundary(data: bytes, limit: int) -> int:
    """The largest b in 1..limit where a record ends at data[b-1]; 0 if none."""
    lf = data.rfind(b"\n", 0, limit)
    cr = data.rfind(b"\r", 0, limit)
    while cr > lf and (cr + 1 >= len(data) or data[cr + 1] == _LF):
        cr = data.rfind(b"\r", 0, cr)
    return max(lf, cr) + 1


def _first_boundary(data: bytes, start: int) -> int | None:
    """The smallest b > start where a record ends at data[b-1]; None if none is known yet."""
    lf = data.find(b"\n", start)
    cr = data.find(b"\r", start, lf if lf >= 0 else len(data))
    while cr >= 0 and (cr + 1 >= len(data) or data[cr + 1] == _LF):
        nxt = data.find(b"\r", cr + 1, lf if lf >= 0 else len(data))
        cr = nxt
    ends = [i for i in (lf, cr) if i >= 0]
    return min(ends) + 1 if ends else None


class RotatingLog:
    """Append-only byte sink with size-based rotation; thread-safe; never raises on write.

    The files are mode 0600, an existing one is narrowed to it: the copy is vLLM's output as it
    wrote it, secrets included (older vLLM builds print `--api-key` and `--hf-token` in their
    `non-default args:` line; with request logging on, it holds prompts). It is not redacted:
    the follower, `loadwatch analyze` and whoever debugs vLLM read it as vLLM wrote it, and a
    secret can be split between two reads of the pipe.
    """

    def __init__(self, path: str, max_bytes: int, backups: int, mode: int = 0o600) -> None:
        if max_bytes < 1 or backups < 1:
            raise ValueError("log rotation needs max_bytes >= 1 and backups >= 1")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._mode = mode
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._last = _LF  # the last byte written; a fresh file starts at a boundary
        self.bytes_total = 0
        self.rotations_total = 0
        self.errors_total = 0
        self.last_error: str | None = None
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, self._mode)
        self._fd = fd
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) & ~self._mode:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & self._mode)  # made wider before: narrowed
        self._size = st.st_size

    def write(self, data: bytes) -> None:
        with self._lock:
            try:
                if self._fd is None:
                    self._open()
                self._write_locked(data)
            except OSError as exc:
                # Disk full, file removed from under us, ...: count it and go on, or vLLM stalls.
                self.errors_total += 1
                self.last_error = f"writing {self.path}: {exc.strerror or exc}"
                self._close_fd()

    def _write_locked(self, data: bytes) -> None:
        while data:
            room = self.max_bytes - self._size
            if len(data) <= room:
                self._emit(data)
                return
            cut = _last_boundary(data, max(room, 0))
            if cut > 0:
                self._emit(data[:cut])
                data = data[cut:]
                self._rotate()
                continue
            at_boundary = self._last == _LF or (self._last == _CR and data[:1] != b"\n")
            if self._size > 0 and at_boundary:
                self._rotate()
                continue
            cut2 = _first_boundary(data, max(room, 0))
            if cut2 is None:
                self._emit(data)
                return
            self._emit(data[:cut2])
            data = data[cut2:]
            self._rotate()

    def _emit(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._size += len(data)
        self.bytes_total += len(data)
        self._last = data[-1]

    def _rotate(self) -> None:
        assert self._fd is not None
        # Someone may have truncated the file (copytruncate): trust the file, not the counter.
        actual = os.fstat(self._fd).st_size
        if actual < self._size and actual < self.max_bytes:
            self._size = actual
            return
        self._close_fd()
        for i in range(self.backups - 1, 0, -1):
            src = f"{self.path}.{i}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")
        self.rotations_total += 1
        self._open()
        self._last = _LF

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self._close_fd()


class LineCopy:
    """vLLM's output as whole lines, for a sink that others write lines to as well.

    A line goes out once its ``\\n`` has come, its bytes as vLLM wrote them (a tqdm ``\\r``
    inside included): another writer of the same stream, the event log on stdout, then never
    lands in the middle of one. The only bytes of ours are a ``\\n`` after a piece of a line
    longer than ``max_line`` (cut so that memory stays bounded and the reader's lines too) and
    after the rest of a line still open when the output ends (``finish``). Runs in the pump's
    thread; a sink that raises is counted, never allowed to stop the pump (vLLM would block).
    """

    def __init__(self, write_line: Callable[[bytes], None], max_line: int = 64 * 1024) -> None:
        if max_line < 1:
            raise ValueError("max_line must be >= 1")
        self._write_line = write_line
        self._max = max_line
        self._open = bytearray()  # the line begun and not yet ended
        self.lines_total = 0
        self.errors_total = 0

    def feed(self, chunk: bytes) -> None:
        self._open += chunk
        while True:
            end = self._open.find(b"\n", 0, self._max)
            if end >= 0:
                self._out(bytes(self._open[: end + 1]))
                del self._open[: end + 1]
            elif len(self._open) >= self._max:
                self._out(bytes(self._open[: self._max]) + b"\n")
                del self._open[: self._max]
            else:
                return

    def finish(self) -> None:
        if self._open:
            self._out(bytes(self._open) + b"\n")
            self._open.clear()

    def _out(self, line: bytes) -> None:
        self.lines_total += 1
        try:
            self._write_line(line)
        except Exception:  # the pump goes on (vLLM must never block); the file has the line
            self.errors_total += 1


class OutputPump:
    """Copies one pipe into a sink from a thread, until EOF or ``stop()``; ``copy`` gets the
    same bytes after the sink, and its ``finish()`` when the pump ends."""

    def __init__(
        self,
        read_fd: int,
        sink: Callable[[bytes], None],
        name: str = "loadwatch-pump",
        copy: LineCopy | None = None,
    ) -> None:
        self._fd = read_fd
        self._sink = sink
        self._copy = copy
        self._stop = threading.Event()
        self.bytes_total = 0
        self.eof = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        drained = 0
        try:
            while True:
                stopping = self._stop.is_set()
                # The timeout only bounds how late a stop() is noticed; data wakes poll at once.
                if not poller.poll(0 if stopping else 200):
                    if stopping:
                        return
                    continue
                try:
                    chunk = os.read(self._fd, 1 << 16)
                except InterruptedError:
                    continue
                except OSError:
                    return
                if not chunk:
                    self.eof = True
                    return
                self.bytes_total += len(chunk)
                self._sink(chunk)
                if self._copy is not None:
                    self._copy.feed(chunk)
                if stopping:
                    drained += len(chunk)
                    if drained >= _DRAIN_AFTER_STOP_BYTES:  # a writer that never stops
                        return
        finally:
            os.close(self._fd)
            if self._copy is not None:
                self._copy.finish()

    def stop(self) -> None:
        """Finish after the data already in the pipe; for writers that never close it."""
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
