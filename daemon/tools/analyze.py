"""`loadwatch analyze` and `loadwatch events`: one pass over a finished or live vLLM log.

The log is read as the daemon reads it (analyze_input.py: plain, gzip, container formats, stdin),
so the report says what the daemon would have said: `LogReader` -> `SessionFolder` (`LoadState`).
Each event is folded at its own time (the last known time when it has none), so phase durations
are the log's own, and the daemon's tick comes once a second of the log's time. A load's
warnings and bar updates are held back, those of one time a run (with the tick that ends that
second), and the runs folded in one `apply_runs` call, each at its own time, until an event of
another kind comes (they can open no session: the state's own grouping does the rest). The
state keeps only a summary of earlier sessions, so the state is snapshotted
just before a new session replaces the current one, and once at the end; the report (report.py)
is built from those snapshots. Memory stays bounded: reads of at most a few MiB, records cut at
``max_record_bytes``, and the last `MAX_SESSIONS_KEPT` sessions kept in full.

Input faults end in one line on stderr with the exit code analyze_input.py gives them; a log
that holds binary data and no vLLM record is 65 (not a log), and so is a `--model-dir` whose
files the bounds refuse (sources/model/modelfiles.py).

The checkpoint is read from `--model-dir` only, never from the path the log's engine config
names: the log is untrusted text, and the daemon reads that path only under the roots its
operator allows (`[model] allowed_roots`, none by default in watch mode), so a log replayed by
the daemon in watch mode and analyzed here gives the same verdicts.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any

import orjson

from loadwatch.daemon.config import ForecastConfig
from loadwatch.daemon.sources.inputs import ModelInfo, Tick
from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.sources.model.modelfiles import ModelFileError
from loadwatch.daemon.state.loadstate import BULK_EVENTS, LoadState, StateConfig
from loadwatch.daemon.state.snapshot import Snapshot
from loadwatch.daemon.tools.analyze_input import (
    DEFAULT_RECORD_BYTES,
    EX_DATAERR,
    EX_IOERR,
    EX_NOINPUT,
    InputError,
    LogReader,
    check_input,
    line_numbers,
    reason_of,
)
from loadwatch.exporters.report import Report, SessionCapture, build_report
from loadwatch.exporters.terminal.clean import json_for_terminal, print_error
from loadwatch.exporters.terminal.report_text import print_report
from loadwatch.parsers import Event, Failure

MAX_SESSIONS_KEPT = 100
# Untimed events before the first timed one wait for its time (a log that starts with a bar);
# past this many they take the file's mtime instead.
MAX_UNTIMED_HELD = 10_000
MAX_FAILURE_OFFSETS = 256  # per session; the state keeps 32 distinct failures anyway
MAX_RUN_INPUTS = 4096  # the load's events held back before they are folded (memory stays bounded)


class SessionFolder:
    """Folds events into `LoadState` at the log's own times and keeps every session whole."""

    def __init__(self, fallback_ts: float, model: ModelInfo | None = None) -> None:
        # The daemon's hold for a crash's echoes, on the log's own time here.
        self.state = LoadState(config=StateConfig(failure_hold_s=ForecastConfig().failure_hold_s))
        self.fallback_ts = fallback_ts
        self.now: float | None = None
        self.kept: deque[SessionCapture] = deque(maxlen=MAX_SESSIONS_KEPT)
        self.omitted = 0
        self._held: list[Event] = []
        self._start_offset: int | None = None
        self._failures: dict[tuple[str, str], int] = {}
        self._bulk: list[Event | Tick] = []  # a load's events at `self._bulk_at`, not folded yet
        self._bulk_at = 0.0
        # the load's events of the seconds before, each second a run, folded in one call (while
        # runs are held, `self.state` lags them; it has a session all the same: once, always)
        self._runs: list[tuple[float, list[Event | Tick]]] = []
        self._runs_inputs = 0
        self._tick_at = -math.inf
        if model is not None:
            self.state = self.state.apply(model, fallback_ts)

    def add(self, ev: Event) -> None:
        if self.now is None:
            if ev.ts is None and len(self._held) < MAX_UNTIMED_HELD:
                self._held.append(ev)
                return
            self._release(ev.ts if ev.ts is not None else self.fallback_ts)
        at = ev.ts if ev.ts is not None else self.now
        prev = self.now
        if (
            at is not None
            and prev is not None
            and at > prev
            and prev - self._tick_at >= 1.0
            and self.state.session is not None
        ):
            # the daemon's tick, once a second of the log's time, when the second before is
            # over: a rank silent while its peers moved on is judged on ticks (state/ranks.py).
            # The load's events held back are at `prev` too: they and the tick are one run.
            if self._bulk_at != prev:
                self._close_bulk()
            self._tick_at = prev
            self._bulk.append(Tick())
            self._bulk_at = prev
            self._close_bulk()
        if isinstance(ev, BULK_EVENTS) and self.state.session is not None:
            t = at if at is not None else self.fallback_ts  # (as `_apply` takes it)
            if self._bulk and t != self._bulk_at:
                self._close_bulk()
            self._bulk.append(ev)
            self._bulk_at = t
            if ev.ts is not None:
                self.now = ev.ts
            return
        self._fold_held_runs()
        self._apply(ev, at)

    def _close_bulk(self) -> None:
        """The load's events held back at their one time are a run, folded with the others."""
        if self._bulk:
            self._runs.append((self._bulk_at, self._bulk))
            self._runs_inputs += len(self._bulk)
            self._bulk = []
            if self._runs_inputs >= MAX_RUN_INPUTS:
                self._fold_held_runs()

    def _fold_held_runs(self) -> None:
        """The runs held back, each at its own time, in one call (no session starts)."""
        self._close_bulk()
        if self._runs:
            self.state = self.state.apply_runs(self._runs)
            self._runs = []
            self._runs_inputs = 0

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

    def _capture(self, st: LoadState) -> None:
        s = st.session
        assert s is not None
        at = max(s.last_event_at, s.phase_entered_at)
        st = st.settle(at)  # the session ends here: a failure held for its echoes is decided
        s = st.session
        assert s is not None
        at = max(s.last_event_at, s.phase_entered_at)
        if len(self.kept) == self.kept.maxlen:
            self.omitted += 1
        self.kept.append(SessionCapture(st.snapshot(at), self._start_offset, self._failures))

    def finish(self) -> None:
        self._fold_held_runs()
        if self.now is None:  # no event had a time of its own
            self._release(self.fallback_ts)
        if self.state.session is not None:
            self._capture(self.state)

    def final_snapshot(self) -> Snapshot:
        """The state at the end, for the log-wide parts (model, KV cache) with no session."""
        return self.state.snapshot(self.now if self.now is not None else self.fallback_ts)


def analyze_log(
    path: Path, *, model_dir: Path | None = None, max_record_bytes: int = DEFAULT_RECORD_BYTES
) -> Report:
    """Read, fold and report; raises InputError for input faults."""
    model = None
    if model_dir is not None:
        if not model_dir.is_dir():
            what = "not a directory" if model_dir.exists() else "no such directory"
            raise InputError(f"--model-dir {model_dir}: {what}", EX_NOINPUT)
        try:
            model = read_model_dir(model_dir)
        except ModelFileError as exc:
            raise InputError(f"--model-dir: {exc}", EX_DATAERR) from None
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
            for p in view.processes if view is not None else ():
                offsets.update((p.first_offset, p.last_offset))
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
    print_error(message)
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
            sys.stdout.write(json_for_terminal(report_json(report.to_dict())) + "\n")
            sys.stdout.flush()
        else:
            print_report(report, sys.stdout)
    except BrokenPipeError:
        _quiet_stdout()
    return report.verdict.exit_code


def report_json(doc: dict[str, Any]) -> str:
    """`json.dumps(doc, indent=2, ensure_ascii=False)`, by orjson (the same text, about fifteen
    times sooner: the report of a long log holds every session kept); what orjson refuses (an
    int past 64 bits, a key that is not a string) by the standard encoder."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # (orjson.JSONEncodeError is one)
        return json.dumps(doc, indent=2, ensure_ascii=False)


def events_command(log: Path, *, max_record_bytes: int) -> int:
    """`loadwatch events`: every parsed event as one JSON object a line."""
    try:
        reader = LogReader(log, max_record_bytes)
    except InputError as exc:
        return _fail(str(exc), exc.code)
    try:
        out = sys.stdout
        for ev in reader.events():
            out.write(json_for_terminal(json.dumps(ev.to_dict(), ensure_ascii=False)) + "\n")
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
        return _fail(f"{log}: {reason_of(exc)}", EX_IOERR)
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
