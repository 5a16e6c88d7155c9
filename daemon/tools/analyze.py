"""`loadwatch analyze` and `loadwatch events`: one pass over a finished or live vLLM log.

The log is read as the daemon reads it, so the report says what the daemon would have said:
`LogFollower` (records cut at a cap, bounded reads) -> `ChunkScanner` -> `LoadState`. Each event
is folded at its own time (the last known time when it has none), so phase durations are the
log's own. The state keeps only a summary of earlier sessions, so the state is snapshotted just
before a new session replaces the current one, and once at the end; the report (report.py) is
built from those snapshots. Memory stays bounded: reads of at most a few MiB, records cut at
``max_record_bytes``, and the last `MAX_SESSIONS_KEPT` sessions kept in full.

A gzip file (a rotated log that logrotate compressed) is read through a temporary file it is
inflated into, deleted at the end; the report gives the log's own size and the compressed one.
Data that ends early (cut short, or corrupt further on) is read up to there and counted as a read
error. A container log (the kubelet's CRI format, docker's json-file; daemon/sources/log/
container.py) and stdin (`-`) are read the same way, through a temporary file of their content.

Input faults end in one line on stderr: 66 when the path is missing or unreadable, 74 on a read
error, 65 when it is not a log at all (a directory or other non-regular file, an empty file,
binary data that holds no vLLM record, gzip data with no log in it), 64 for a bad
``--max-record-bytes``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
import sys
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.sources.log.container import spool, spool_if_container
from loadwatch.daemon.sources.log.files import GZIP_MAGIC, inflate_into
from loadwatch.daemon.sources.log.follower import DEFAULT_MAX_READ_BYTES, FollowerError, LogFollower
from loadwatch.daemon.sources.model.model_info import model_named_in_log, read_model_dir
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.snapshot import Snapshot
from loadwatch.exporters.report import (
    LogFacts,
    Report,
    SessionCapture,
    build_report,
)
from loadwatch.exporters.terminal.report_text import print_report
from loadwatch.parsers import ChunkScanner, Event, Failure
from loadwatch.parsers.grammar import load as load_grammar
from loadwatch.parsers.vllm.lines import ProcessNames

EX_DATAERR = 65
EX_NOINPUT = 66
EX_USAGE = 64
EX_IOERR = 74

DEFAULT_RECORD_BYTES = 64 * 1024
MIN_RECORD_BYTES = 1024
MAX_RECORD_BYTES = 64 * 1024 * 1024
MAX_SESSIONS_KEPT = 100
SNIFF_BYTES = 8192
# Untimed events before the first timed one wait for its time (a log that starts with a bar);
# past this many they take the file's mtime instead.
MAX_UNTIMED_HELD = 10_000
MAX_FAILURE_OFFSETS = 256  # per session; the state keeps 32 distinct failures anyway
_TERMINATORS = (b"\n", b"\r")
_LINE_BLOCK = 1 << 20


class InputError(Exception):
    """An input fault: one line for the user and the exit code that goes with it."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _reason(exc: OSError) -> str:
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
        raise InputError(f"{shown}: cannot read: {_reason(exc)}", EX_NOINPUT) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{shown}: is a directory, not a log file", EX_DATAERR)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{shown}: not a regular file, not a log file", EX_DATAERR)
    try:
        with open(path, "rb") as fh:
            sample = fh.read(SNIFF_BYTES)
    except PermissionError as exc:
        raise InputError(f"{shown}: cannot read: {_reason(exc)}", EX_NOINPUT) from None
    except OSError as exc:
        raise InputError(f"{shown}: read error: {_reason(exc)}", EX_IOERR) from None
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
        raise InputError(f"{path}: read error: {_reason(exc)}", EX_IOERR) from None
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


class LogReader:
    """The events of one log file, read once with bounded memory; `facts()` after `events()`."""

    def __init__(self, path: Path, max_record_bytes: int = DEFAULT_RECORD_BYTES) -> None:
        check_record_cap(max_record_bytes)
        self.path = path
        self.cap = max_record_bytes
        self._inflated: IO[bytes] | None = None  # stdin, an inflated gzip file, or a decoded
        self._decoded: IO[bytes] | None = None  # container log: a temporary file read instead
        if str(path) == "-":  # stdin (`kubectl logs POD | loadwatch analyze -`)
            self._inflated = spool(sys.stdin.buffer, path)
            path = Path(self._inflated.name)
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

    def events(self) -> Iterator[Event]:
        grammar = load_grammar()
        scanner = ChunkScanner(grammar.new_stream(self.opened.mtime), grammar=grammar)
        names = self.processes
        try:
            follower = LogFollower(
                self.source,
                state_dir=None,
                mode="poll",
                cap_bytes=self.cap,
                max_read_bytes=max(DEFAULT_MAX_READ_BYTES, self.cap),
            )
        except FollowerError as exc:
            raise InputError(f"{self.path}: {exc}", EX_USAGE) from None
        try:
            while True:
                for chunk in follower.read():
                    names.feed(chunk.data)
                    for ev in scanner.feed(chunk.data, chunk.offset, chunk.file_id):
                        self.events_total += 1
                        yield ev
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
            follower.close(checkpoint=False)
        if tail is not None:
            data, offset = tail
            names.feed(data)
            for ev in scanner.feed(data, offset):
                self.events_total += 1
                yield ev
        for ev in scanner.stream.flush():
            self.events_total += 1
            yield ev

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
            self._last_error = f"{self.path}: {_reason(exc)}"
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


class SessionFolder:
    """Folds events into `LoadState` at the log's own times and keeps every session whole."""

    def __init__(self, fallback_ts: float, model: ModelInfo | None = None) -> None:
        self.state = LoadState()
        self.fallback_ts = fallback_ts
        self.now: float | None = None
        self.kept: deque[SessionCapture] = deque(maxlen=MAX_SESSIONS_KEPT)
        self.omitted = 0
        self._held: list[Event] = []
        self._start_offset: int | None = None
        self._failures: dict[tuple[str, str], int] = {}
        self._model_given = model is not None
        self._model_tried: str | None = None
        if model is not None:
            self.state = self.state.apply(model, fallback_ts)

    def add(self, ev: Event) -> None:
        if self.now is None:
            if ev.ts is None and len(self._held) < MAX_UNTIMED_HELD:
                self._held.append(ev)
                return
            self._release(ev.ts if ev.ts is not None else self.fallback_ts)
        self._apply(ev, ev.ts if ev.ts is not None else self.now)

    def _release(self, at: float) -> None:
        """The events that came before the first time: folded at that time, in order."""
        self.now = at
        held, self._held = self._held, []
        for h in held:
            self._apply(h, at)

    def _apply(self, ev: Event, at: float | None) -> None:
        t = at if at is not None else self.fallback_ts
        if ev.ts is not None:
            self.now = ev.ts
        prev = self.state
        nxt = prev.apply(ev, t)
        if any(tr.kind == "session_started" for tr in nxt.transitions):
            if prev.session is not None:
                self._capture(prev)
            self._start_offset = ev.offset
            self._failures = {}
        if isinstance(ev, Failure) and len(self._failures) < MAX_FAILURE_OFFSETS:
            self._failures.setdefault((ev.kind, ev.message[:300]), ev.offset)
        self.state = nxt
        self._read_logged_model(t)

    def _read_logged_model(self, at: float) -> None:
        """Without --model-dir, the directory the engine config names, when it is here (as the
        daemon reads it: the same verdicts)."""
        s = self.state.session
        path = s.kv.model_path if s is not None else None
        if self._model_given or path is None or path == self._model_tried:
            return
        self._model_tried = path
        info = model_named_in_log(path)
        if info is not None:
            self.state = self.state.apply(info, at)

    def _capture(self, st: LoadState) -> None:
        s = st.session
        assert s is not None
        at = max(s.last_event_at, s.phase_entered_at)
        if len(self.kept) == self.kept.maxlen:
            self.omitted += 1
        self.kept.append(SessionCapture(st.snapshot(at), self._start_offset, self._failures))

    def finish(self) -> None:
        if self.now is None:  # no event had a time of its own
            self._release(self.fallback_ts)
        if self.state.session is not None:
            self._capture(self.state)

    def final_snapshot(self) -> Snapshot:
        """The state at the end, for the log-wide parts (model, KV cache) with no session."""
        return self.state.snapshot(self.now if self.now is not None else self.fallback_ts)


def line_numbers(path: Path, offsets: set[int]) -> dict[int, int]:
    """1-based line numbers (counting ``\\n``) of byte offsets, in one bounded pass."""
    out: dict[int, int] = {}
    if not offsets:
        return out
    wanted = sorted(offsets)
    lines = 1
    pos = 0
    i = 0
    try:
        with open(path, "rb") as fh:
            while i < len(wanted):
                block = fh.read(_LINE_BLOCK)
                if not block:
                    break
                end = pos + len(block)
                while i < len(wanted) and wanted[i] < end:
                    out[wanted[i]] = lines + block.count(b"\n", 0, max(wanted[i] - pos, 0))
                    i += 1
                lines += block.count(b"\n")
                pos = end
    except OSError:
        return out
    return out


def analyze_log(
    path: Path, *, model_dir: Path | None = None, max_record_bytes: int = DEFAULT_RECORD_BYTES
) -> Report:
    """Read, fold and report; raises InputError for input faults."""
    model = None
    if model_dir is not None:
        if not model_dir.is_dir():
            what = "not a directory" if model_dir.exists() else "no such directory"
            raise InputError(f"--model-dir {model_dir}: {what}", EX_NOINPUT)
        model = read_model_dir(model_dir)
    reader = LogReader(path, max_record_bytes)
    try:
        folder = SessionFolder(reader.opened.mtime, model)
        for ev in reader.events():
            folder.add(ev)
        folder.finish()
        facts = reader.facts()
        if facts.events == 0 and reader.opened.binary:
            raise InputError(
                f"{path}: not a vLLM log (binary data, no vLLM record in {facts.bytes_read} bytes)",
                EX_DATAERR,
            )
        offsets: set[int] = set()
        for cap in folder.kept:
            if cap.start_offset is not None:
                offsets.add(cap.start_offset)
            offsets.update(cap.failure_offsets.values())
            view = cap.snapshot.session
            for f in view.failures if view is not None else ():
                offsets.update(e.offset for e in f.evidence)
                if f.offset is not None:
                    offsets.add(f.offset)
        lines = line_numbers(reader.source, offsets)
    finally:
        reader.close()
    return build_report(
        list(folder.kept),
        facts=facts,
        final=folder.final_snapshot(),
        model=model,
        omitted=folder.omitted,
        lines=lines,
    )


def _quiet_stdout() -> None:
    """After a broken pipe, send what Python still flushes at exit to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _fail(message: str, code: int) -> int:
    print(f"loadwatch: {message}", file=sys.stderr)
    return code


def analyze_command(
    log: Path, *, model_dir: Path | None, as_json: bool, max_record_bytes: int
) -> int:
    """`loadwatch analyze`: 0 ready, 1 failed, 2 incomplete; 64+ for input faults."""
    try:
        report = analyze_log(log, model_dir=model_dir, max_record_bytes=max_record_bytes)
    except InputError as exc:
        return _fail(str(exc), exc.code)
    try:
        if as_json:
            sys.stdout.write(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
            sys.stdout.flush()
        else:
            print_report(report, sys.stdout)
    except BrokenPipeError:
        _quiet_stdout()
    return report.verdict.exit_code


def events_command(log: Path, *, max_record_bytes: int) -> int:
    """`loadwatch events`: every parsed event as one JSON object a line."""
    try:
        reader = LogReader(log, max_record_bytes)
    except InputError as exc:
        return _fail(str(exc), exc.code)
    try:
        out = sys.stdout
        for ev in reader.events():
            out.write(json.dumps(ev.to_dict(), ensure_ascii=False) + "\n")
        out.flush()
    except InputError as exc:
        return _fail(str(exc), exc.code)
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            _quiet_stdout()
            return 0
        return _fail(f"{log}: {_reason(exc)}", EX_IOERR)
    finally:
        reader.close()
    if reader.events_total == 0 and reader.opened.binary:
        return _fail(f"{log}: not a vLLM log (binary data, no vLLM record)", EX_DATAERR)
    return 0


__all__ = [
    "MAX_SESSIONS_KEPT",
    "InputError",
    "LogReader",
    "SessionCapture",
    "SessionFolder",
    "analyze_command",
    "analyze_log",
    "check_input",
    "events_command",
    "line_numbers",
]
