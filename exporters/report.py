"""The `loadwatch analyze` report: built from the state's snapshots, shown as text or JSON.

`build_report` turns one `Snapshot` per session (taken just before the next session replaced it,
and at the end of the log) into a `Report`; `Report.to_dict()` is the `--json` document
(schema in docs/analyze.md) and `render_report` the text an operator reads after a failed load.
Every string that came from the log is shown as plain text, never as markup.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from loadwatch.daemon.inputs import ModelInfo
from loadwatch.daemon.kvdtype import (
    FP8_PATH_CODES,
    KV_SCALE_CODES,
    KvDtype,
    effective_kv_dtype,
    warning_verdict,
)
from loadwatch.daemon.snapshot import KvCacheView, MilestoneView, SessionView, Snapshot, plain

SCHEMA = 1
ORDER = ("starting", "loading_weights", "post_load", "ready")
Status = Literal["ready", "failed", "incomplete"]
EXIT_CODES: dict[str, int] = {"ready": 0, "failed": 1, "incomplete": 2}
TRACEBACK_HEAD = "Traceback (most recent call last):"
PIPE_WIDTH = 100  # text width when stdout is not a terminal (COLUMNS overrides)


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


@dataclass(frozen=True, slots=True)
class WarningGroup:
    code: str
    severity: str
    count: int
    verdict: str  # benign | flagged | unknown | unrated
    reason: str
    layers: tuple[int, ...]
    layer_count: int
    scales: tuple[str, ...]
    processes: tuple[str, ...]
    first_at: float
    last_at: float
    sample: str


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
    line: int | None  # 1-based line of its first record
    offset: int | None  # byte offset of its first record


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
    warnings: tuple[WarningGroup, ...]
    warnings_total: int
    failures: tuple[FailureReport, ...]
    failures_total: int
    stalls_total: int
    stall_hints: int
    milestones: tuple[MilestoneView, ...]


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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = plain(self)
        return out


# -- building -----------------------------------------------------------------------------------


def _kv(view: SessionView, seen: KvCacheView, model: ModelInfo | None) -> KvDtype:
    """The KV-cache dtype for this session's verdicts. The state knows it from the launch
    arguments or an FP8 line in the log; a post-mortem has no arguments, but a log that shows
    the start-up settles it: vLLM logs `Using fp8... data type to store kv cache` while it
    builds its configuration, before the model loads, whenever the KV cache is FP8."""
    if seen.quantized is not None:
        return KvDtype(seen.dtype, seen.quantized, seen.source, seen.reason)  # type: ignore[arg-type]
    keys = {m.key for m in view.milestones}
    loaded = "model_load_start" in keys or any(b.kind == "weights" for b in view.bars)
    if "version" in keys and loaded:
        return KvDtype(
            "model dtype",
            False,
            "log",
            "no FP8 KV-cache line at start-up (vLLM logs one when it stores the KV cache in FP8)",
        )
    if model is not None and not model.errors:
        kv = effective_kv_dtype((), model, view.version)
        if kv.quantized is not None:
            return KvDtype(
                kv.dtype,
                kv.quantized,
                kv.source,
                kv.reason + "; the log does not show the start-up, assuming no --kv-cache-dtype",
            )
    return KvDtype(seen.dtype, seen.quantized, seen.source, seen.reason)  # type: ignore[arg-type]


def _reached(view: SessionView) -> str:
    best = 0
    for p in (*(h.phase for h in view.history), view.phase):
        if p in ORDER:
            best = max(best, ORDER.index(p))
    return ORDER[best]


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


def session_verdict(view: SessionView) -> Verdict:
    """ready, failed: <kind>, or incomplete: <phase reached>, last progress N/M at T."""
    reached = _reached(view)
    lp = _last_progress(view)
    notes: list[str] = []
    status: Status
    if view.phase == "failed":
        status = "failed"
        kind = view.failure_kind or "unknown"
        text = f"failed: {kind}"
        if view.ready_at is not None:
            notes.append(f"after it was ready at {clock(view.ready_at)}")
        else:
            notes.append(f"in {reached}, {_progress_text(lp)}")
    elif view.ready_at is not None:
        status, kind, text = "ready", None, "ready"
        ttr = view.time_to_ready_s
        notes.append(
            f"ready at {clock(view.ready_at)}" + (f", {duration(ttr)} after start" if ttr else "")
        )
        if view.phase == "stopped":
            how = "on request" if view.stop_requested else "afterwards"
            notes.append(f"vLLM shut down {how} at {clock(view.phase_entered_at)}")
    else:
        status, kind = "incomplete", None
        if view.reason == "first_event" and reached == "starting" and lp is None:
            text = "incomplete: no vLLM start in the log"
            notes.append("the log begins after vLLM started (a rotated or partial log?)")
        else:
            text = f"incomplete: {reached}, {_progress_text(lp)}"
            if view.reason == "first_event":
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


def _session(
    cap: SessionCapture, model: ModelInfo | None, lines: Mapping[int, int]
) -> SessionReport:
    snap = cap.snapshot
    view = snap.session
    assert view is not None
    kv = _kv(view, snap.kv_cache, model)
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
        )
        for b in view.bars
    )
    warnings = []
    for w in view.warnings:
        verdict, reason = warning_verdict(w.code, kv)
        warnings.append(
            WarningGroup(
                code=w.code,
                severity=w.severity,
                count=w.count,
                verdict=verdict,
                reason=reason,
                layers=w.layers,
                layer_count=w.layer_count,
                scales=w.scales,
                processes=w.processes,
                first_at=w.first_at,
                last_at=w.last_at,
                sample=w.sample,
            )
        )
    failures = []
    for f in view.failures:
        off = cap.failure_offsets.get((f.kind, f.message[:300]))
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
            )
        )
    p = view.progress
    return SessionReport(
        id=view.id,
        reason=view.reason,
        line=lines.get(cap.start_offset) if cap.start_offset is not None else None,
        version=view.version,
        started_at=view.started_at,
        last_event_at=end,
        duration_s=end - view.started_at,
        phase=view.phase,
        reached=_reached(view),
        failure_kind=view.failure_kind,
        stop_requested=view.stop_requested,
        ready_at=view.ready_at,
        time_to_ready_s=view.time_to_ready_s,
        weights_load_s=view.weights_load_s,
        verdict=session_verdict(view),
        phases=phases,
        bars=bars,
        progress=ProgressReport(
            p.shards_done, p.shards_total, p.bytes_done, p.bytes_total, p.ratio, p.last_progress_at
        ),
        kv_cache=KvReport(kv.dtype, kv.quantized, kv.source, kv.reason),
        warnings=tuple(warnings),
        warnings_total=view.warnings_total,
        failures=tuple(failures),
        failures_total=view.failures_total,
        stalls_total=view.stall.stalls_total,
        stall_hints=view.stall.hints,
        milestones=view.milestones,
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
    sessions = tuple(_session(c, model, lines) for c in captures)
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
    )


# -- formatting helpers -------------------------------------------------------------------------


def clock(ts: float | None) -> str:
    """A log-style local time, `MM-DD HH:MM:SS`, the form vLLM prints (easy to grep for)."""
    if ts is None:
        return "-"
    return time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def hms(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ts))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def ranges(values: Sequence[int], limit: int = 6) -> str:
    """`0-60` or `1-2, 5, 9-11`: layer numbers, compactly."""
    if not values:
        return "-"
    spans: list[tuple[int, int]] = []
    for v in sorted(values):
        if spans and v == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit]]
    if len(spans) > limit:
        parts.append("…")
    return ", ".join(parts)


def few(names: Sequence[str], limit: int = 3) -> str:
    if not names:
        return "-"
    shown = ", ".join(names[:limit])
    return shown + (f" +{len(names) - limit}" if len(names) > limit else "")


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


STATUS_STYLE = {"ready": "bold green", "failed": "bold red", "incomplete": "bold yellow"}
VERDICT_STYLE = {"benign": "green", "flagged": "red", "unknown": "yellow", "unrated": "dim"}


# -- text ---------------------------------------------------------------------------------------


def _header(r: Report) -> list[RenderableType]:
    f = r.log
    out: list[RenderableType] = [Text.assemble(("loadwatch analyze ", "bold"), (f.path, ""))]
    n = r.sessions_total
    line = (
        f"{size(f.size_bytes)}, {f.records:,} records, {f.events:,} events, "
        f"{n} session{'s' if n != 1 else ''}; file modified {clock(f.mtime)}"
    )
    out.append(Text(line, style="dim"))
    if f.cut_records:
        out.append(
            Text(
                f"{f.cut_records} record(s) longer than {size(f.max_record_bytes)} were read "
                "only up to that size",
                style="yellow",
            )
        )
    if f.read_errors:
        out.append(Text(f"{f.read_errors} read error(s): {f.last_error}", style="red"))
    m = r.model
    if m is not None:
        kv = m.checkpoint_kv_dtype or "none declared"
        out.append(
            Text(
                f"model {m.path}: {m.shards} shards, {size(m.total_bytes)}, "
                f"checkpoint KV dtype {kv}"
            )
        )
        for e in m.errors:
            out.append(Text(f"  {e}", style="yellow"))
    v = r.verdict
    verdict = Text.assemble(("Verdict: ", "bold"), (v.text, STATUS_STYLE[v.status]))
    if v.session is not None and r.sessions_total > 1:
        verdict.append(f"  (session {v.session})", style="dim")
    out.append(Text(""))
    out.append(verdict)
    for note in v.notes:
        out.append(Text(f"  {note}"))
    return out


def _sessions_table(r: Report) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for col, just in (
        ("#", "right"),
        ("started", "left"),
        ("vLLM", "left"),
        ("reached", "left"),
        ("weights", "right"),
        ("took", "right"),
        ("verdict", "left"),
    ):
        t.add_column(col, justify=just, no_wrap=col != "verdict")  # type: ignore[arg-type]
    if r.sessions_omitted:
        t.add_row(Text(""), Text(f"… {r.sessions_omitted} earlier sessions not kept", "dim"))
    for s in r.sessions:
        lp = s.verdict.last_progress
        weights = f"{lp.done}/{lp.total}" if lp is not None else "-"
        took = s.time_to_ready_s if s.time_to_ready_s is not None else s.duration_s
        t.add_row(
            Text(str(s.id)),
            Text(clock(s.started_at)),
            Text(s.version or "-"),
            Text(s.reached),
            Text(weights),
            Text(duration(took)),
            Text(s.verdict.text, STATUS_STYLE[s.verdict.status]),
        )
    return t


def _phases_line(s: SessionReport) -> Text:
    out = Text()
    for i, p in enumerate(s.phases):
        if i:
            out.append(" → ", style="dim")
        style = {"failed": "red", "stalled": "yellow", "ready": "green"}.get(p.phase, "")
        out.append(p.phase, style=style)
        out.append(f" {hms(p.started_at)}")
        if not p.open or p.phase not in ("failed", "stopped", "ready"):
            out.append(f" {duration(p.duration_s)}", style="dim")
    return out


def _rate(per_s: float | None) -> str:
    if not per_s:
        return "-"
    return f"{per_s:.2f}it/s" if per_s >= 1 else f"{1 / per_s:.2f}s/it"


def _table(*cols: tuple[str, str]) -> Table:
    t = Table(box=None, pad_edge=False, header_style="dim", show_edge=False, padding=(0, 2, 0, 0))
    for name, just in cols:
        t.add_column(name, justify=just, no_wrap=True)  # type: ignore[arg-type]
    return t


def _bars_table(s: SessionReport) -> Table:
    t = _table(
        ("bar", "left"),
        ("process", "left"),
        ("done", "right"),
        ("rate", "right"),
        ("longest gap", "right"),
        ("time", "right"),
    )
    t.columns[0].overflow = "ellipsis"
    for b in s.bars:
        done = Text(f"{b.done}/{b.total}", "green" if b.done >= b.total > 0 else "yellow")
        took = duration(b.duration_s) if b.duration_s > 0 or b.updates > 1 else "-"
        t.add_row(
            Text(b.desc),
            Text(b.process or "-"),
            done,
            Text(_rate(b.rate_per_s)),
            Text(duration(b.longest_gap_s)),
            Text(took),
        )
    return t


def _why(w: WarningGroup) -> str:
    """A few words; the full reason is in the KV-cache line and in the JSON."""
    if w.verdict == "benign":
        return "KV cache not FP8: scales unused"
    if w.verdict == "flagged":
        if w.code in FP8_PATH_CODES:
            return "FP8 path: a 1.0 scale can cost accuracy"
        return "FP8 KV cache: scales fall back to 1.0"
    if w.verdict == "unknown":
        return "KV-cache dtype not known"
    return ""


def _warnings_table(s: SessionReport, limit: int) -> Table:
    t = _table(
        ("warning", "left"),
        ("count", "right"),
        ("layers", "left"),
        ("processes", "left"),
        ("verdict", "left"),
        ("why", "left"),
    )
    t.columns[0].overflow = "ellipsis"
    t.columns[0].max_width = 42
    for i, least in ((1, 5), (2, 6), (4, 7)):
        t.columns[i].min_width = least
    t.columns[3].max_width = 20
    t.columns[3].overflow = "ellipsis"
    t.columns[5].overflow = "ellipsis"
    for w in s.warnings[:limit]:
        if w.code.startswith(("log.", "error.")):
            name = Text(" ".join(w.sample.split()), "red" if w.code.startswith("error.") else "")
        else:
            name = Text(w.code)
        t.add_row(
            name,
            Text(str(w.count)),
            Text(ranges(w.layers) if w.layer_count else "-"),
            Text(few(w.processes, 2)),
            Text(w.verdict, VERDICT_STYLE.get(w.verdict, "")),
            Text(_why(w), "dim"),
        )
    if len(s.warnings) > limit:
        rest = sum(w.count for w in s.warnings[limit:])
        t.add_row(Text(f"… {len(s.warnings) - limit} more kinds", "dim"), Text(str(rest), "dim"))
    return t


def _failures(s: SessionReport, limit: int) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for f in s.failures[:limit]:
        mark = Text("✗" if f.fatal else "•", "red" if f.fatal else "yellow")
        head = Text(f.kind, "bold red" if f.fatal else "yellow")
        if f.count > 1:
            head.append(f" ×{f.count}")
        where = ([f"line {f.line}"] if f.line is not None else []) + [clock(f.first_at)]
        head.append("  " + ", ".join(where) + "  " + few(f.processes), style="dim")
        if not f.fatal:
            head.append("  (not fatal)", style="dim")
        exc = f"{f.exc_type}: {f.message}" if f.exc_type else f.message
        lines: list[RenderableType] = [head, Text(clip(exc, 240))]
        first = f.first_line.strip()
        if first and first != f.message.strip() and first != TRACEBACK_HEAD:
            lines.append(Text("first line: " + clip(first, 160), style="dim"))
        grid.add_row(mark, Group(*lines))
    if len(s.failures) > limit:
        rest = s.failures[limit:]
        kinds: dict[str, int] = {}
        for f in rest:
            kinds[f.kind] = kinds.get(f.kind, 0) + f.count
        more = ", ".join(f"{k} ×{n}" for k, n in kinds.items())
        grid.add_row(Text(""), Text(f"… and {len(rest)} related: {more}", style="dim"))
    return grid


def _facts(s: SessionReport) -> Text | None:
    ms = {m.key: m for m in s.milestones}
    parts: list[str] = []

    def num(key: str, attr: str) -> float | None:
        m = ms.get(key)
        v = getattr(m, attr) if m is not None else None
        return v if isinstance(v, int | float) else None

    if (m := ms.get("attention_backend")) is not None and m.value:
        parts.append(f"backend {m.value}")
    if (sec := num("weights_loaded", "seconds")) is not None:
        parts.append(f"weights {duration(sec)}")
    if (gib := num("model_memory", "gib")) is not None:
        parts.append(f"model {gib:g} GiB")
    kv = num("kv_cache.available_memory", "gib")
    tokens = num("kv_cache.size", "tokens")
    if kv is not None or tokens is not None:
        bits = [f"{kv:g} GiB" if kv is not None else "", f"{tokens:,.0f} tokens" if tokens else ""]
        parts.append("KV cache " + ", ".join(b for b in bits if b))
    if (sec := num("torch_compile.total", "seconds")) is not None:
        parts.append(f"compile {duration(sec)}")
    if (sec := num("graph_capture", "seconds")) is not None:
        gib = num("graph_capture", "gib")
        parts.append(f"graphs {duration(sec)}" + (f", {gib:g} GiB" if gib is not None else ""))
    if (sec := num("engine_init", "seconds")) is not None:
        parts.append(f"engine init {duration(sec)}")
    if (m := ms.get("api_server_start")) is not None and m.value:
        parts.append(f"API {m.value}")
    return Text(" · ".join(parts)) if parts else None


def _indent(r: RenderableType) -> Padding:
    return Padding(r, (0, 0, 0, 2))


def _session_block(s: SessionReport, last: bool) -> list[RenderableType]:
    title = Text.assemble(
        (f"Session {s.id}: ", "bold"), (s.verdict.text, STATUS_STYLE[s.verdict.status])
    )
    out: list[RenderableType] = [Rule(title, align="left", style="dim")]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    start = f"{clock(s.started_at)}"
    if s.line is not None:
        start += f" (line {s.line})"
    if s.version:
        start += f", vLLM {s.version}"
    if s.reason == "first_event":
        start += "; the log begins after this start"
    grid.add_row(Text("started"), Text(start))
    if s.phases:
        grid.add_row(Text("phases"), _phases_line(s))
    for note in s.verdict.notes:
        grid.add_row(Text(""), Text(note, style="dim"))
    if s.stalls_total or s.stall_hints:
        hint = f"{s.stall_hints} 'no available shared memory broadcast block' hint(s)"
        grid.add_row(Text("stalls"), Text(f"{s.stalls_total} stall(s); {hint}"))
    kv = s.kv_cache
    if kv.quantized or any(w.code in KV_SCALE_CODES | FP8_PATH_CODES for w in s.warnings):
        grid.add_row(Text("KV cache"), Text(f"{kv.dtype or 'unknown'}: {kv.reason}"))
    facts = _facts(s)
    if facts is not None:
        grid.add_row(Text("facts"), facts)
    out.append(_indent(grid))
    if s.failures:
        out.append(_indent(Text("Failures", style="bold")))
        out.append(_indent(_failures(s, 5 if last else 2)))
    if s.bars:
        out.append(_indent(Text("Progress bars", style="bold")))
        out.append(_indent(_bars_table(s)))
    if s.warnings:
        out.append(_indent(Text(f"Warnings ({s.warnings_total})", style="bold")))
        out.append(_indent(_warnings_table(s, 8 if last else 4)))
    return out


def render_report(report: Report) -> RenderableType:
    parts: list[RenderableType] = _header(report)
    if len(report.sessions) > 1 or report.sessions_omitted:
        parts.append(Text(""))
        parts.append(_sessions_table(report))
    for i, s in enumerate(report.sessions):
        parts.append(Text(""))
        parts.extend(_session_block(s, last=i == len(report.sessions) - 1))
    return Group(*parts)


def report_text(report: Report, width: int = 100) -> str:
    """The text report without colour, as a pipe would get it (tests, logs)."""
    console = Console(
        file=io.StringIO(), width=width, record=True, force_terminal=False, color_system=None
    )
    console.print(render_report(report))
    return console.export_text()


def pipe_width() -> int:
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return PIPE_WIDTH


def make_console(file: IO[str]) -> Console:
    """Colour on a terminal; plain text, no escape codes, in a pipe."""
    tty = file.isatty()
    if tty:
        return Console(file=file, highlight=False)
    return Console(
        file=file, force_terminal=False, color_system=None, width=pipe_width(), highlight=False
    )


def print_report(report: Report, file: IO[str]) -> None:
    make_console(file).print(render_report(report))


__all__ = [
    "SCHEMA",
    "BarReport",
    "FailureReport",
    "KvReport",
    "LastProgress",
    "LogFacts",
    "ModelReport",
    "PhaseStep",
    "Report",
    "SessionCapture",
    "SessionReport",
    "Verdict",
    "WarningGroup",
    "build_report",
    "clock",
    "duration",
    "make_console",
    "print_report",
    "render_report",
    "report_text",
    "session_verdict",
]
