"""The structured event log: one JSON object per parsed event and per state transition.

Written to stdout (journald keeps one line per object) and optionally to a file, each object as
structlog's JSON chain would render it (the fields, then `event`, then `time`: ISO 8601 UTC),
built directly: a load's thousands of lines are the event log's whole cost. structlog's console
renderer gives the human-readable rendering that replaces JSON on stdout when it is a terminal. The file gets every
object; stdout gets what `[events] stdout` says: `transitions` (the default: everything but the
parsed log events, failures excepted: about 20 lines for a load that writes 1,300 events, so
journald's rate limit never drops a `daemon.problem`), `all`, or `none`. `reopen()` (SIGHUP) closes
and reopens the file so logrotate can move it. Every string passes through the redactor first.
A line goes to a regular file whole or not at all (linefile.py), to a pipe without waiting
(nbwrite.py). Lines are compact JSON (no blanks after `,` and `:`), encoded by orjson: a load's
lines cost ten times less to encode than with the standard library's encoder, which is kept for
what orjson refuses or would write as other than ASCII (below).

While a run of log records has its effects written (`held()`), the file's lines are kept and
written together when it ends, in one write: a load's backlog is thousands of lines a second,
and a write each was a tenth of reading it. A line is still whole in the file or not there.

`passthrough()` puts a line of the supervised vLLM's output on stdout too (`[vllm] output =
"file+stdout"`), under the same lock, so each line there is whole: an event line or one of
vLLM's. A reader tells them apart as event lines are the JSON objects, each with an "event" key,
and the only lines that start with `{`: a line of vLLM's output that starts with one (after
blanks; a client's text can make vLLM print a forged event) is kept off stdout (the log file
has it), and said once in a `daemon.problem` line.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, TextIO

import orjson

from loadwatch.exporters.linefile import LineFile
from loadwatch.exporters.nbwrite import NonBlockingWriter, for_stream
from loadwatch.parsers.vllm.argv_secrets import Redactor


class _Clock:
    """The `time` of a line, ISO 8601 UTC to the microsecond; the part up to the second is made
    once per second (a load writes thousands of lines a second while a backlog is read)."""

    def __init__(self) -> None:
        self._second = -1
        self._head = ""

    def now(self) -> str:
        micros = time.time_ns() // 1000
        second = micros // 1_000_000
        if second != self._second:
            self._second = second
            self._head = datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        # (the microseconds zero-padded to six digits: the digits of 1,000,000 more, less the
        # leading 1, cost a third of a format spec)
        return self._head + str(micros - second * 1_000_000 + 1_000_000)[1:] + "Z"


def _fallback(obj: Any) -> Any:
    """A value JSON has no type for: its `__structlog__()`, else its repr (structlog's rule)."""
    method = getattr(obj, "__structlog__", None)
    return method() if callable(method) else repr(obj)


def _regular_file(stream: object) -> LineFile | None:
    """Whole-line writes for a stream on a regular file; None for anything else."""
    try:
        fd = stream.fileno()  # type: ignore[attr-defined]
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        flush = getattr(stream, "flush", None)
        if flush is not None:
            flush()  # what was printed before goes first
    except (AttributeError, OSError, ValueError):
        return None
    return LineFile(fd, own=False)


# dataclasses and datetimes go to `_fallback`, as with the standard encoder
_ORJSON_OPTIONS: Final = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_json_encode = json.JSONEncoder(default=_fallback, separators=(",", ":")).encode


def _encode(doc: dict[str, Any]) -> bytes:
    """One line of JSON, printable ASCII only. orjson writes text as UTF-8 and DEL as it is,
    where a C1 control character (U+009B is a terminal's CSI) would reach a terminal that shows
    the log as it is: a line that is not ASCII or holds a DEL, and anything orjson refuses (an
    int past 64 bits, a lone surrogate, a key that is not a string), is encoded by the standard
    library's encoder, which writes those as `\\uXXXX`.
    (NaN, which that encoder writes as a bare `NaN`, comes out as `null` from orjson.)"""
    try:
        line = orjson.dumps(doc, default=_fallback, option=_ORJSON_OPTIONS)
    except TypeError:  # (orjson.JSONEncodeError is one)
        return _json_encode(doc).encode()
    return line if line.isascii() and b"\x7f" not in line else _json_encode(doc).encode()


HELD_MAX_BYTES: Final = 1 << 20  # held lines are written once they are this many bytes
# stdout's held lines, sooner: a pipe takes 64 KiB, and what it cannot take of one write is
# sent before anything else (nbwrite.py)
HELD_OUT_MAX_BYTES = 1 << 16

StdoutLevel = Literal["transitions", "all", "none"]
STDOUT_LEVELS: tuple[StdoutLevel, ...] = ("transitions", "all", "none")


def could_pass_for_an_event(line: bytes) -> bool:
    """A line that starts as the event lines do, with `{` (after blanks, which a JSON reader
    skips): a reader of stdout, strict or lenient, could take it for one of them."""
    return line.lstrip()[:1] == b"{"


def is_event_line(line: bytes) -> bool:
    """One of the event log's own lines as written on stdout: a JSON object with "event" and
    "time" (for a reader of the two streams, `loadwatch analyze -` of `kubectl logs`)."""
    if not line.startswith(b"{"):
        return False
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and "event" in doc and "time" in doc


_WITHHELD = (
    "a line of vLLM's output starts with '{', as only the event lines may on stdout: kept off "
    "stdout (this one and any after it; the vLLM log file has them)"
)


def wanted_on_stdout(event: str, level: StdoutLevel) -> bool:
    """`transitions`: what the daemon decided (transitions, supervisor, GPU and daemon lines) and
    the failures it read; the many parsed log events (bars, warnings, milestones) stay in the
    file."""
    if level == "all":
        return True
    if level == "none":
        return False
    return not event.startswith("log.") or event == "log.failure"


def _has_room(fd: int) -> bool:
    """Whether the file system of `fd` has a free block for this process: on a full disk a
    few lines still fit in the file's last, partly used block, which is not a recovery."""
    try:
        st = os.fstatvfs(fd)
    except OSError:
        return True
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) > 0


class EventLog:
    def __init__(
        self,
        stream: TextIO | None = None,
        path: Path | None = None,
        *,
        console: bool | None = None,
        redactor: Redactor | None = None,
        stdout: StdoutLevel = "all",
    ) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.stdout_level: StdoutLevel = stdout
        self.path = path
        self.redactor = redactor or Redactor()
        self.console = (
            bool(getattr(self.stream, "isatty", lambda: False)()) if console is None else console
        )
        self.write_errors = 0
        self.last_error: str | None = None
        self.withheld = 0  # lines of vLLM's output kept off stdout (they start with `{`)
        self._lock = threading.Lock()
        self._file: LineFile | None = None
        self._pipe: NonBlockingWriter | None = None  # the events file is a FIFO: never wait on it
        self._out = for_stream(self.stream)  # stdout on a pipe or socket: never wait on it
        # stdout on a regular file (`loadwatch run >> events.jsonl`): whole lines, as the file
        self._out_file = _regular_file(self.stream) if self._out is None else None
        self._open_file()
        self._console_renderer: Callable[..., Any] | None = None  # made when first wanted
        self._clock = _Clock()
        self._held: list[bytes] | None = None  # the file's lines while `held()`, unwritten
        # while `held()`: the time of every line, written together (a run's thousands)
        self._held_time: str | None = None
        self._held_bytes = 0
        self._held_out: list[bytes] | None = None  # stdout's, the same
        self._held_out_bytes = 0

    # -- writing ----------------------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> None:
        """Write one object: `{...fields, "event": event, "time": ...}`, every value redacted."""
        self.emit_fields(event, fields)

    def emit_fields(self, event: str, fields: dict[str, Any]) -> None:
        """`emit` of a dict the caller gives away (a run's thousands of lines: no copy each)."""
        if self.redactor.active:
            value = self.redactor.value
            doc = {k: value(v) for k, v in fields.items()}
            doc["event"] = value(event)
        else:
            doc = fields  # (a dict given away)
            doc["event"] = event
        held_time = self._held_time
        doc["time"] = held_time if held_time is not None else self._clock.now()
        self._write(_encode(doc), wanted_on_stdout(event, self.stdout_level))

    def _write(self, line: bytes, to_stdout: bool) -> None:
        with self._lock:
            if self._pipe is not None:
                if self._pipe.write(line + b"\n"):
                    self.last_error = None
                else:
                    self._fault(
                        f"the event log {self.path} is a pipe its reader does not empty: "
                        "lines are dropped until it does"
                    )
            if self._file is not None:
                held = self._held
                if held is None:
                    self._to_file(line + b"\n")
                else:
                    held.append(line + b"\n")
                    self._held_bytes += len(line) + 1
                    if self._held_bytes >= HELD_MAX_BYTES:
                        self._write_held()
            if to_stdout:
                text = self._render_console(line).encode() if self.console else line
                self._out_line(text + b"\n")

    def _out_line(self, data: bytes) -> None:
        """Under the lock: a line for stdout, held with the file's while `held()`."""
        out = self._held_out
        if out is None:
            self._to_stdout(data)
            return
        out.append(data)
        self._held_out_bytes += len(data)
        if self._held_out_bytes >= HELD_OUT_MAX_BYTES:
            self._write_held_out()

    def _to_file(self, data: bytes) -> None:
        """Under the lock: whole lines to the file."""
        assert self._file is not None
        try:
            self._file.write(data)
        except OSError as exc:  # no part of a line is left (a size limit, a full disk)
            self._fault(f"cannot write the event log {self.path}: {exc.strerror or exc}")
            return
        if self.last_error is not None and _has_room(self._file.fd):
            self.last_error = None  # written again (a full disk was emptied)

    def _write_held(self) -> None:
        """Under the lock: the held lines, in one write to the file and one to stdout."""
        held = self._held
        if held:
            self._held, self._held_bytes = [], 0
            if self._file is not None:
                self._to_file(b"".join(held))
        self._write_held_out()

    def _write_held_out(self) -> None:
        out = self._held_out
        if out:
            self._held_out, self._held_out_bytes = [], 0
            self._to_stdout(b"".join(out))

    @contextmanager
    def held(self) -> Iterator[None]:
        """The file's lines written when this ends (or the position is asked), together, with
        one time: when the hold began. Lines of any thread meanwhile are held too, so the
        file keeps the order they came in."""
        with self._lock:
            outer = self._held is not None
            if not outer:
                self._held, self._held_bytes = [], 0
                self._held_out, self._held_out_bytes = [], 0
                self._held_time = self._clock.now()
        try:
            yield
        finally:
            if not outer:
                with self._lock:
                    self._write_held()
                    self._held = self._held_out = self._held_time = None

    def passthrough(self, line: bytes) -> None:
        """One line of vLLM's output (ending in a newline) to stdout, never to the events file:
        the bytes as they came, but for the secrets the redactor knows; a line that could pass
        for an event line is kept off (module docstring). Any thread."""
        text = line.decode("utf-8", "surrogateescape")
        masked = self.redactor.text(text)
        if masked != text:
            line = masked.encode("utf-8", "surrogateescape")
        if could_pass_for_an_event(line):
            self.withheld += 1
            if self.withheld == 1:
                self.emit("daemon.problem", error=_WITHHELD)
            return
        with self._lock:
            self._out_line(line)  # (after the event lines held before it)

    def _to_stdout(self, data: bytes) -> None:
        """Under the lock."""
        try:
            if self._out is not None:
                if not self._out.write(data):
                    self.write_errors += 1  # nobody reads stdout: dropped, never waited on
                return
            if self._out_file is not None:
                self._out_file.write(data)
                return
            self.stream.write(data.decode("utf-8", "replace"))
            self.stream.flush()
        except (OSError, ValueError):
            self.write_errors += 1  # stdout closed: nothing more to do about it

    def position(self) -> tuple[str, int] | None:
        """The event log file ("dev:ino") and its size: where the next line goes; None when
        there is no file. (Lines held are written first, so the size is exact.)"""
        with self._lock:
            self._write_held()
            if self._file is None:
                return None
            try:
                st = os.fstat(self._file.fd)
            except OSError:
                return None
            if not stat.S_ISREG(st.st_mode):  # a pipe or a terminal: nothing to read back
                return None
            return f"{st.st_dev}:{st.st_ino}", st.st_size

    def _render_console(self, line: bytes) -> str:
        render = self._console_renderer
        if render is None:
            # (structlog, and the rich it brings, imported for a console only: `analyze` and a
            # daemon writing to a file or a pipe start without them)
            import structlog.dev

            render = self._console_renderer = structlog.dev.ConsoleRenderer(
                colors=False, event_key="event"
            )
        data = json.loads(line)
        return str(render(None, "info", data))

    def _fault(self, message: str) -> None:
        self.write_errors += 1
        self.last_error = message

    # -- file handling ----------------------------------------------------------------------

    def _open_file(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)  # as the file: 0640
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a FIFO (or a device): written, never waited on
                self._pipe = NonBlockingWriter(fd, own=True)
                return
            self._file = LineFile(fd, own=True)  # a line a killed writer left torn stays apart
        except OSError as exc:
            self._file = None
            self._fault(f"cannot open the event log {self.path}: {exc.strerror or exc}")

    def _close_pipe(self) -> None:
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    def reopen(self) -> None:
        with self._lock:
            self._write_held()  # (to the file they were held for)
            self._close_pipe()
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
            self._open_file()

    def close(self) -> None:
        with self._lock:
            self._write_held()
            self._close_pipe()
            if self._out is not None:
                self._out.close()
                self._out = None
            self._out_file = None  # the descriptor is the stream's
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
