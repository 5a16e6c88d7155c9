"""The input of `loadwatch analyze` and `loadwatch events`: a vLLM log read once, as the daemon
reads it (`LogFollower`: records cut at ``max_record_bytes``, bounded reads, then `ChunkScanner`),
into events and the facts of the read (`LogFacts`: sizes, records, cuts, read errors).

A plain file is read in place. A gzip file (a rotated log that logrotate compressed) is read
through a temporary file it is inflated into, deleted at the end; the facts give the log's own
size and the compressed one. Data that ends early (cut short, or corrupt further on) is read up to
there and counted as a read error. A container log (the kubelet's CRI format, docker's json-file;
daemon/sources/log/container.py) and stdin (`-`) are read the same way, through a temporary file
of their content. The last record is taken even without a terminator (a post-mortem). Stdin
leaves out loadwatch's own event lines: `kubectl logs POD` of a loadwatch with `[vllm] output =
"file+stdout"` has them between vLLM's lines, one in a traceback, say, which would split it.

Input faults raise `InputError` with one line and its exit code: 66 when the path is missing or
unreadable, 74 on a read error, 65 when it is not a log at all (a directory or other non-regular
file, an empty file, gzip data with no log in it), 64 for a bad ``--max-record-bytes``.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from loadwatch.daemon.sources.inputs import Chunk, joined
from loadwatch.daemon.sources.log.container import spool_if_container
from loadwatch.daemon.sources.log.follower import DEFAULT_MAX_READ_BYTES, FollowerError, LogFollower
from loadwatch.daemon.sources.log.gzipped import GZIP_MAGIC, inflate_into
from loadwatch.daemon.sources.log.inputs import StdinInput
from loadwatch.exporters.eventlog import is_event_line
from loadwatch.exporters.report import LogFacts
from loadwatch.parsers import ChunkScanner, Event
from loadwatch.parsers.grammar import load as load_grammar
from loadwatch.parsers.scan import count_lines
from loadwatch.parsers.vllm.process_names import ProcessNames

EX_DATAERR = 65
EX_NOINPUT = 66
EX_USAGE = 64
EX_IOERR = 74

DEFAULT_RECORD_BYTES = 64 * 1024
MIN_RECORD_BYTES = 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
SNIFF_BYTES = 8192
_TERMINATORS = (b"\n", b"\r")
_LINE_BLOCK = 1 << 20


class InputError(Exception):
    """An input fault: one line for the user and the exit code that goes with it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def reason_of(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _looks_binary(sample: bytes) -> bool:
    """NUL bytes, or many control bytes that no text log holds (ESC, tab, CR, LF excepted)."""
    if not sample:
        return False
    if b"\0" in sample:
        return True
    control = sum(1 for b in sample if b < 0x20 and b not in (0x09, 0x0A, 0x0D, 0x1B))
    return control > len(sample) // 10


@dataclass(frozen=True, slots=True)
class _Opened:
    size_bytes: int
    mtime: float
    binary: bool
    gzip: bool = False
    compressed_bytes: int | None = None  # the gzip file's own size, when it was one


def check_input(path: Path) -> _Opened:
    """Stat and sniff the path; an InputError for anything that cannot be a readable log."""
    shown = str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{shown}: no such file", EX_NOINPUT) from None
    except NotADirectoryError:
        raise InputError(
            f"{shown}: no such file (a part of the path is not a directory)", EX_NOINPUT
        ) from None
    except OSError as exc:
        raise InputError(f"{shown}: cannot read: {reason_of(exc)}", EX_NOINPUT) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{shown}: is a directory, not a log file", EX_DATAERR)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{shown}: not a regular file, not a log file", EX_DATAERR)
    try:
        with open(path, "rb") as fh:
            sample = fh.read(SNIFF_BYTES)
    except PermissionError as exc:
        raise InputError(f"{shown}: cannot read: {reason_of(exc)}", EX_NOINPUT) from None
    except OSError as exc:
        raise InputError(f"{shown}: read error: {reason_of(exc)}", EX_IOERR) from None
    if not sample:
        raise InputError(f"{shown}: empty file, nothing to analyze", EX_DATAERR)
    if sample.startswith(GZIP_MAGIC):
        return _Opened(st.st_size, st.st_mtime, False, gzip=True)
    return _Opened(st.st_size, st.st_mtime, _looks_binary(sample))


def inflate_log(path: Path) -> tuple[IO[bytes], str | None]:
    """A gzip file's content in a named temporary file (deleted when closed), and a line when
    the data ended early: what came before that point is there."""
    tmp = tempfile.NamedTemporaryFile(prefix="loadwatch-", suffix=".log")  # noqa: SIM115
    try:
        why = inflate_into(str(path), tmp)
    except OSError as exc:
        tmp.close()
        raise InputError(f"{path}: read error: {reason_of(exc)}", EX_IOERR) from None
    size = os.fstat(tmp.fileno()).st_size
    if size == 0:
        tmp.close()
        raise InputError(f"{path}: gzip data with no log in it ({why or 'empty'})", EX_DATAERR)
    if why is None:
        return tmp, None
    return tmp, f"{path}: gzip data {why} after {size} bytes of log: read up to there"


def check_record_cap(max_record_bytes: int) -> None:
    if not MIN_RECORD_BYTES <= max_record_bytes <= MAX_RECORD_BYTES:
        raise InputError(
            f"--max-record-bytes must be between {MIN_RECORD_BYTES} and {MAX_RECORD_BYTES}",
            EX_USAGE,
        )


class WithoutEventLines:
    """A stream read through ``read(n)`` with loadwatch's event lines left out (whole lines
    only: a line longer than a block is passed on, as no event line is that long)."""

    def __init__(self, src: IO[bytes]) -> None:
        self._src = src
        self._out = bytearray()
        self._open = b""  # the line begun and not yet ended
        self._inside = False  # `_open` goes on a line already passed on: no event line
        self.dropped = 0

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._out) < n:
            block = self._src.read(_LINE_BLOCK)
            if not block:
                self._out += self._open
                self._open = b""
                break
            *lines, self._open = (self._open + block).split(b"\n")
            for line in lines:
                if not self._inside and is_event_line(line):
                    self.dropped += 1
                else:
                    self._out += line + b"\n"
                self._inside = False
            if len(self._open) > _LINE_BLOCK:
                self._out += self._open
                self._open, self._inside = b"", True
        size = len(self._out) if n < 0 else min(n, len(self._out))
        out = bytes(self._out[:size])
        del self._out[:size]
        return out


class LineMarks:
    """The lines before places in the file read, counted as it was read: after each chunk of the
    file's own bytes, back to back from its start (a cut record's chunk is not those bytes, and
    the marks stop there). A line number asked for later reads again only the bytes from the
    mark before it (`line_numbers`), not the file up to it."""

    def __init__(self) -> None:
        self.at = [0]  # offsets, ascending
        self.lines = [0]  # the `\n` before each
        self._whole = True

    def add(self, chunk: Chunk) -> None:
        if self._whole and not chunk.cut and chunk.offset == self.at[-1]:
            self.lines.append(self.lines[-1] + count_lines(chunk.data))
            self.at.append(chunk.next_offset)
        else:
            self._whole = False


class LogReader:
    """The events of one log file, read once with bounded memory; `facts()` after `events()`."""

    def __init__(self, path: Path, max_record_bytes: int = DEFAULT_RECORD_BYTES) -> None:
        check_record_cap(max_record_bytes)
        self.path = path
        self.cap = max_record_bytes
        self._inflated: IO[bytes] | None = None  # stdin, an inflated gzip file, or a decoded
        self._decoded: IO[bytes] | None = None  # container log: a temporary file read instead
        self._stdin: StdinInput | None = None
        if str(path) == "-":  # stdin (`kubectl logs POD | loadwatch analyze -`): the log input
            self._stdin = StdinInput(
                WithoutEventLines(sys.stdin.buffer), path, **self._follow()
            )  # (inputs.py: spooled, decoded, into a temporary file read once)
            path = self._stdin.path
        self.opened = check_input(path)
        self.source = path  # what is read: the path, or the file a gzip file is inflated into
        early: str | None = None
        if self.opened.gzip:
            self._inflated, early = inflate_log(path)
            self.source = Path(self._inflated.name)
            with open(self.source, "rb") as fh:
                sample = fh.read(SNIFF_BYTES)
            self.opened = dataclasses.replace(
                self.opened,
                size_bytes=os.fstat(self._inflated.fileno()).st_size,
                binary=_looks_binary(sample),
                compressed_bytes=self.opened.size_bytes,
            )
        if not self.opened.binary and str(self.path) != "-":  # CRI or docker json-file
            self._decoded = spool_if_container(self.source, self.path)
            if self._decoded is not None:
                self.source = Path(self._decoded.name)
        self.events_total = 0
        self._end: int | None = None  # where the unterminated last record ends
        self._tail_cut = False
        self._unterminated = False
        self.processes = ProcessNames()
        self.marks = LineMarks()
        self._health_records = 0
        self._health_bytes = 0
        self._health_cuts = 0
        self._errors = 0
        self._last_error: str | None = None
        self._early = early  # the gzip data ended early: one more read error

    def close(self) -> None:
        """Delete the temporary files read instead of the input, if any."""
        for tmp in (self._inflated, self._decoded):
            if tmp is not None:
                tmp.close()
        self._inflated = self._decoded = None
        if self._stdin is not None:
            self._stdin.close()
            self._stdin = None

    def _follow(self) -> dict[str, Any]:
        """The follower's settings for a read once: records cut at the cap, bounded reads."""
        return {
            "mode": "poll",
            "cap_bytes": self.cap,
            "max_read_bytes": max(DEFAULT_MAX_READ_BYTES, self.cap),
        }

    def _reader(self) -> LogFollower:
        """What reads `source`: stdin's input when it is its spool, else a follower of its own."""
        stdin = self._stdin
        if stdin is not None and Path(stdin.path) == Path(os.path.abspath(self.source)):
            return stdin
        return LogFollower(self.source, state_dir=None, **self._follow())

    def events(self) -> Iterator[Event]:
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[Event]]:
        """The log's events, a chunk's at a time (none empty)."""
        grammar = load_grammar()
        scanner = ChunkScanner(grammar.new_stream(self.opened.mtime), grammar=grammar)
        names = self.processes
        marks = self.marks
        try:
            follower = self._reader()
        except FollowerError as exc:
            raise InputError(f"{self.path}: {exc}", EX_USAGE) from None
        try:
            while True:
                for chunk in joined(follower.read()):
                    marks.add(chunk)
                    names.feed(chunk.data)
                    batch = scanner.feed(chunk.data, chunk.offset, chunk.file_id)
                    if batch:
                        self.events_total += len(batch)
                        yield batch
                if not follower.backlog:
                    break
            h = follower.health()
            self._health_records, self._health_bytes = h.records_total, h.bytes_total
            self._health_cuts, self._errors, self._last_error = (
                h.cuts_total,
                h.errors_total,
                h.last_error,
            )
            if h.errors_total and h.bytes_total == 0:
                raise InputError(f"{self.path}: read error: {h.last_error}", EX_IOERR)
            tail = self._tail(h.offset)
        finally:
            if follower is not self._stdin:  # (stdin's spool is read again: `close` ends it)
                follower.close(checkpoint=False)
        last: list[Event] = []
        if tail is not None:
            data, offset = tail
            names.feed(data)
            last = scanner.feed(data, offset)
        last += scanner.stream.flush()
        if last:
            self.events_total += len(last)
            yield last

    def _tail(self, offset: int | None) -> tuple[bytes, int] | None:
        """The last record when it has no terminator: the follower waits for one, a post-mortem
        takes it as it is (cut to the cap)."""
        if offset is None:
            return None
        try:
            with open(self.source, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size <= offset:
                    return None
                fh.seek(offset)
                head = fh.read(self.cap)
        except OSError as exc:
            self._errors += 1
            self._last_error = f"{self.path}: {reason_of(exc)}"
            return None
        if not head or any(t in head for t in _TERMINATORS):
            return None  # more was written since the last read: this pass ends before it
        self._unterminated = True
        self._end = size
        self._tail_cut = size - offset > self.cap
        return head + b"\n", offset

    def facts(self) -> LogFacts:
        return LogFacts(
            path=str(self.path),
            size_bytes=self.opened.size_bytes,
            mtime=self.opened.mtime,
            # the follower counts the start of a record it is still skipping; the tail ends it
            bytes_read=self._end if self._end is not None else self._health_bytes,
            records=self._health_records + (1 if self._unterminated else 0),
            events=self.events_total,
            cut_records=self._health_cuts + (1 if self._tail_cut else 0),
            unterminated_last_record=self._unterminated,
            max_record_bytes=self.cap,
            read_errors=self._errors + (self._early is not None),
            last_error=self._last_error or self._early,
            compressed_bytes=self.opened.compressed_bytes,
            processes=tuple(self.processes.names),
        )


def line_numbers(path: Path, offsets: set[int], marks: LineMarks | None = None) -> dict[int, int]:
    """1-based line numbers (counting ``\\n``) of byte offsets: from the nearest of `marks` (the
    file's start when none) before each, the bytes up to it read once."""
    out: dict[int, int] = {}
    at, before = (marks.at, marks.lines) if marks is not None else ([0], [0])
    pos = lines = 0  # `lines` breaks before `pos`, where reading stands
    try:
        with open(path, "rb") as fh:
            for offset in sorted(offsets):
                k = bisect.bisect_right(at, offset) - 1
                if at[k] > pos:  # a mark nearer than where reading stands: go on from there
                    pos, lines = at[k], before[k]
                    fh.seek(pos)
                while pos < offset:
                    block = fh.read(min(_LINE_BLOCK, offset - pos))
                    if not block:
                        return out
                    lines += count_lines(block)
                    pos += len(block)
                out[offset] = lines + 1
    except OSError:
        return out
    return out
