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
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.sources.model.modelfiles import ModelFileError
from loadwatch.daemon.tools.analyze_fold import MAX_SESSIONS_KEPT, SessionFolder
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
        for events in reader.batches():
            folder.add_all(events)
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
        lines = line_numbers(reader.source, offsets, reader.marks)
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
            # (the text report's rich, imported for it alone: `--json` starts without it)
            from loadwatch.exporters.terminal.report_text import print_report

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
