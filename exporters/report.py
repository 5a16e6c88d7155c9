"""The `loadwatch analyze` report: what a log says about each vLLM start, and a verdict.

`build_report` turns one `Snapshot` per session (taken just before the next session replaced it,
and at the end of the log) into a `Report`; `Report.to_dict()` is the `--json` document (schema
in docs/analyze.md), report_text.py draws it for the terminal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.state.records import plain
from loadwatch.daemon.state.snapshot import (
    MemoryPlanView,
    MilestoneView,
    SessionView,
    Snapshot,
    StartupStepView,
    WarningView,
)
from loadwatch.exporters.report_crashloop import CrashLoopReport, crash_loop_of
from loadwatch.exporters.report_ranks import ProcessReport
from loadwatch.exporters.terminal.fmt import clock, duration

SCHEMA = 1
Status = Literal["ready", "failed", "incomplete"]
EXIT_CODES: dict[str, int] = {"ready": 0, "failed": 1, "incomplete": 2}


# -- the report's parts -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionCapture:
    """One session's last state, and where in the file it and its failures began."""

    snapshot: Snapshot
    start_offset: int | None
    failure_offsets: Mapping[tuple[str, str], int]  # (kind, message[:300]) -> byte offset


@dataclass(frozen=True, slots=True)
class LogFacts:
    path: str
    size_bytes: int
    mtime: float
    bytes_read: int
    records: int
    events: int
    cut_records: int  # records longer than max_record_bytes, read up to the cap
    unterminated_last_record: bool  # the file ends without a line terminator
    max_record_bytes: int
    read_errors: int
    last_error: str | None
    compressed_bytes: int | None = None  # the gzip file's own size, when the log was one
    processes: tuple[str, ...] = ()  # every distinct process prefix, in order of first appearance


@dataclass(frozen=True, slots=True)
class PhaseStep:
    phase: str
    started_at: float
    duration_s: float  # up to the next phase, or to the session's last event when open
    open: bool  # the phase the session ended in
    failure_kind: str | None


@dataclass(frozen=True, slots=True)
class BarReport:
    desc: str
    kind: str
    process: str | None
    done: int
    total: int
    started_at: float
    finished_at: float | None
    duration_s: float
    rate_per_s: float | None
    longest_gap_s: float | None
    updates: int
    unit: str = "items"  # what done/total count: files, tensors, bytes, items


# A warning code as the report shows it: the snapshot's view, verdict included (decided there).
WarningGroup = WarningView


@dataclass(frozen=True, slots=True)
class FailureReport:
    kind: str
    exc_type: str | None
    message: str
    first_line: str
    count: int
    fatal: bool
    first_at: float
    last_at: float
    processes: tuple[str, ...]
    line: int | None  # 1-based line of its first record (the anchor)
    offset: int | None  # byte offset of its first record
    echoes: int = 0  # records folded in besides the root's first one
    evidence: tuple[EchoReport, ...] = ()  # the records, the root's own first (bounded)


@dataclass(frozen=True, slots=True)
class EchoReport:
    """One record of a root cause: the root, an echo, a wrapper or a re-raise."""

    line: int | None
    offset: int
    exc_type: str | None
    message: str
    process: str | None


@dataclass(frozen=True, slots=True)
class LastProgress:
    desc: str
    done: int
    total: int
    at: float
    bytes_done: int | None
    bytes_total: int | None


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    text: str  # "ready", "failed: <kind>", "incomplete: <phase>, last progress N/M at T"
    exit_code: int
    session: int | None
    phase: str | None  # the furthest phase reached
    failure_kind: str | None
    last_progress: LastProgress | None
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProgressReport:
    shards_done: int | None
    shards_total: int | None
    bytes_done: int | None
    bytes_total: int | None
    ratio: float | None
    last_progress_at: float | None


@dataclass(frozen=True, slots=True)
class KvReport:
    dtype: str | None
    quantized: bool | None
    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class SessionReport:
    id: int
    reason: str
    line: int | None
    version: str | None
    started_at: float
    last_event_at: float
    duration_s: float
    phase: str
    reached: str
    failure_kind: str | None
    stop_requested: bool
    ready_at: float | None
    time_to_ready_s: float | None
    weights_load_s: float | None
    verdict: Verdict
    phases: tuple[PhaseStep, ...]
    bars: tuple[BarReport, ...]
    progress: ProgressReport
    kv_cache: KvReport
    memory_plan: MemoryPlanView | None
    warnings: tuple[WarningGroup, ...]
    warnings_total: int
    failures: tuple[FailureReport, ...]
    failures_total: int
    stalls_total: int
    stall_hints: int
    milestones: tuple[MilestoneView, ...]
    timeline: tuple[StartupStepView, ...] = ()  # the start-up's steps (daemon/state/timeline.py)
    processes: tuple[ProcessReport, ...] = ()  # every process that logged (state/ranks.py)


@dataclass(frozen=True, slots=True)
class ModelReport:
    path: str
    shards: int
    total_bytes: int | None
    architecture: str | None
    quant_algo: str | None
    checkpoint_kv_dtype: str | None
    errors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Report:
    schema: int
    log: LogFacts
    model: ModelReport | None
    verdict: Verdict
    sessions_total: int
    sessions_omitted: int
    sessions: tuple[SessionReport, ...]
    crash_loop: CrashLoopReport | None = None  # the failed starts the log ends with (2 or more)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = plain(self)
        return out


# -- building -----------------------------------------------------------------------------------


def _last_progress(view: SessionView) -> LastProgress | None:
    weights = [b for b in view.bars if b.kind == "weights"]
    pool = weights or [b for b in view.bars if b.kind != "prefetch"] or list(view.bars)
    if not pool:
        return None
    b = max(pool, key=lambda x: (x.last_update_at, x.index))
    p = view.progress
    by_bytes = weights and p.shards_total == b.total
    return LastProgress(
        desc=b.desc,
        done=b.done,
        total=b.total,
        at=b.last_progress_at if b.last_progress_at is not None else b.last_update_at,
        bytes_done=p.bytes_done if by_bytes else None,
        bytes_total=p.bytes_total if by_bytes else None,
    )


def _progress_text(lp: LastProgress | None) -> str:
    if lp is None:
        return "no progress logged"
    return f"last progress {lp.done}/{lp.total} at {clock(lp.at)}"


def session_verdict(view: SessionView, last: bool = True) -> Verdict:
    """ready, failed: <kind>, or incomplete: <phase reached>, last progress N/M at T. `last`:
    the log's last session (the log ends with it; else the next start ends it)."""
    reached = view.reached
    lp = _last_progress(view)
    notes: list[str] = []
    status: Status = view.verdict  # type: ignore[assignment]  # decided in the snapshot
    tail = view.reason == "first_event"  # the log begins after this vLLM started
    if status == "failed":
        kind = view.failure_kind or "unknown"
        text = f"failed: {kind}"
        step = failed_step(view)
        if view.ready_at is not None:
            notes.append(f"after it was ready at {clock(view.ready_at)}")
        elif tail and step is None and lp is None:
            notes.append(
                "in a phase the log does not show: it begins after vLLM started (its start, "
                "the phases before and the time to the failure are not in it)"
            )
        else:
            where = f"{step} ({reached})" if step is not None else reached
            notes.append(f"in {where}, {_progress_text(lp)}")
            if tail:
                notes.append("the log begins after this vLLM started")
    elif status == "ready":
        kind, text = None, "ready"
        ttr = view.time_to_ready_s
        if tail:
            notes.append(
                f"ready at {clock(view.ready_at)}; the log begins after vLLM started, so the "
                "time from its start is not known"
            )
        else:
            notes.append(
                f"ready at {clock(view.ready_at)}"
                + (f", {duration(ttr)} after start" if ttr else "")
            )
        if view.phase == "stopped":
            how = "on request" if view.stop_requested else "afterwards"
            notes.append(f"vLLM shut down {how} at {clock(view.phase_entered_at)}")
        elif view.phase == "ready":
            # What a SIGKILL or the OOM killer leave: nothing (live, the process watch calls it
            # a failure, `vanished`; the log alone cannot tell it from a vLLM still serving).
            end = "the log ends" if last else "vLLM started again"
            notes.append(
                f"{end} while it was ready, with no shutdown line: "
                + ("still serving, or " if last else "")
                + "killed (SIGKILL and the OOM killer leave no line)"
            )
    else:
        kind = None
        if tail and reached == "starting" and lp is None:
            text = "incomplete: no vLLM start in the log"
            notes.append("the log begins after vLLM started (a rotated or partial log?)")
        else:
            text = f"incomplete: {reached}, {_progress_text(lp)}"
            if tail:
                notes.append("the log begins after this vLLM started")
        if view.phase == "stalled" and view.stall.reason:
            notes.append(f"stalled: {view.stall.reason}")
        if view.phase == "stopped":
            notes.append(f"vLLM shut down at {clock(view.phase_entered_at)} before it was ready")
    return Verdict(
        status=status,
        text=text,
        exit_code=EXIT_CODES[status],
        session=view.id,
        phase=reached,
        failure_kind=kind,
        last_progress=lp,
        notes=tuple(notes),
    )


def failed_step(view: SessionView) -> str | None:
    """The start-up step the session ended in, when the log says which (timeline.py)."""
    if not view.timeline:
        return None
    phase = view.timeline[-1].phase
    return None if phase == "unknown" else phase


def _session(cap: SessionCapture, lines: Mapping[int, int], last: bool) -> SessionReport:
    snap = cap.snapshot
    view = snap.session
    assert view is not None
    kv = snap.kv_cache
    end = max(snap.at, view.started_at)
    phases = tuple(
        PhaseStep(h.phase, h.entered_at, h.duration_s, h.left_at is None, h.failure_kind)
        for h in view.history
    )
    bars = tuple(
        BarReport(
            desc=b.desc,
            kind=b.kind,
            process=b.process,
            done=b.done,
            total=b.total,
            started_at=b.started_at,
            finished_at=b.finished_at,
            duration_s=max((b.finished_at or b.last_update_at) - b.started_at, 0.0),
            rate_per_s=b.rate_per_s,
            longest_gap_s=b.longest_gap_s,
            updates=b.updates,
            unit=b.unit,
        )
        for b in view.bars
    )
    failures = []
    for f in view.failures:
        off = (
            f.offset if f.offset is not None else cap.failure_offsets.get((f.kind, f.message[:300]))
        )
        evidence = tuple(
            EchoReport(lines.get(e.offset), e.offset, e.exc_type, e.message, e.process)
            for e in sorted(f.evidence, key=lambda e: e.offset)
        )
        failures.append(
            FailureReport(
                kind=f.kind,
                exc_type=f.exc_type,
                message=f.message,
                first_line=f.first_line,
                count=f.count,
                fatal=f.fatal,
                first_at=f.first_at,
                last_at=f.last_at,
                processes=f.processes,
                line=lines.get(off) if off is not None else None,
                offset=off,
                echoes=f.echoes,
                evidence=evidence,
            )
        )
    p = view.progress
    ln = lines.get  # (a record's offset -> its line number)
    return SessionReport(
        id=view.id,
        reason=view.reason,
        line=lines.get(cap.start_offset) if cap.start_offset is not None else None,
        version=view.version,
        started_at=view.started_at,
        last_event_at=end,
        duration_s=end - view.started_at,
        phase=view.phase,
        reached=view.reached,
        failure_kind=view.failure_kind,
        stop_requested=view.stop_requested,
        ready_at=view.ready_at,
        # a session the log begins inside: its start is not in it, nor the time to ready
        time_to_ready_s=view.time_to_ready_s if view.reason != "first_event" else None,
        weights_load_s=view.weights_load_s,
        verdict=session_verdict(view, last),
        phases=phases,
        bars=bars,
        progress=ProgressReport(
            p.shards_done, p.shards_total, p.bytes_done, p.bytes_total, p.ratio, p.last_progress_at
        ),
        kv_cache=KvReport(kv.dtype, kv.quantized, kv.source, kv.reason),
        memory_plan=snap.memory_plan,
        warnings=view.warnings,
        warnings_total=view.warnings_total,
        failures=tuple(failures),
        failures_total=view.failures_total,
        stalls_total=view.stall.stalls_total,
        stall_hints=view.stall.hints,
        milestones=view.milestones,
        timeline=view.timeline,
        processes=tuple(
            ProcessReport(**plain(p), first_line=ln(p.first_offset), last_line=ln(p.last_offset))
            for p in view.processes
        ),
    )


NO_SESSION = Verdict(
    status="incomplete",
    text="incomplete: no vLLM start in the log",
    exit_code=EXIT_CODES["incomplete"],
    session=None,
    phase=None,
    failure_kind=None,
    last_progress=None,
    notes=("no record of a vLLM start-up, progress, warning or failure was found",),
)


def build_report(
    captures: Sequence[SessionCapture],
    *,
    facts: LogFacts,
    final: Snapshot,
    model: ModelInfo | None,
    omitted: int,
    lines: Mapping[int, int],
) -> Report:
    sessions = tuple(_session(c, lines, i == len(captures) - 1) for i, c in enumerate(captures))
    verdict = sessions[-1].verdict if sessions else NO_SESSION
    mr = None
    if model is not None:
        mr = ModelReport(
            path=model.path,
            shards=len(model.shards),
            total_bytes=model.total_bytes,
            architecture=model.architecture,
            quant_algo=model.quant_algo,
            checkpoint_kv_dtype=model.checkpoint_kv_dtype,
            errors=model.errors,
        )
    return Report(
        schema=SCHEMA,
        log=facts,
        model=mr,
        verdict=verdict,
        sessions_total=final.sessions_total,
        sessions_omitted=omitted,
        sessions=sessions,
        crash_loop=crash_loop_of(sessions),
    )


__all__ = [
    "SCHEMA",
    "BarReport",
    "FailureReport",
    "KvReport",
    "LastProgress",
    "LogFacts",
    "ModelReport",
    "PhaseStep",
    "ProcessReport",
    "Report",
    "SessionCapture",
    "SessionReport",
    "Verdict",
    "WarningGroup",
    "build_report",
    "session_verdict",
]
