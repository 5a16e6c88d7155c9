"""The `loadwatch analyze` report as text: compact, for an operator after a failed load.

Every string that came from the log is drawn as plain text (`Text`), never parsed as markup,
and cleaned of control sequences: the report's strings before the layout (so it measures what
is shown), and whatever is drawn by the clean console (clean.py) in any case.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from loadwatch.daemon.state.kvdtype import FP8_PATH_CODES, KV_SCALE_CODES
from loadwatch.exporters.report import ProcessReport, Report, SessionReport, WarningGroup
from loadwatch.exporters.report_crashloop import crash_loop_text
from loadwatch.exporters.terminal.clean import clean_values
from loadwatch.exporters.terminal.console import plain_text, show
from loadwatch.exporters.terminal.fmt import clip, clock, duration, few, hms, ranges, size

TRACEBACK_HEAD = "Traceback (most recent call last):"
STATUS_STYLE = {"ready": "bold green", "failed": "bold red", "incomplete": "bold yellow"}
VERDICT_STYLE = {"benign": "green", "flagged": "red", "unknown": "yellow", "unrated": "dim"}


def _header(r: Report) -> list[RenderableType]:
    f = r.log
    out: list[RenderableType] = [Text.assemble(("loadwatch analyze ", "bold"), (f.path, ""))]
    n = r.sessions_total
    line = (
        f"{size(f.size_bytes)}"
        f"{'' if f.compressed_bytes is None else f' (gzip, {size(f.compressed_bytes)})'}, "
        f"{f.records:,} records, {f.events:,} events, "
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


# A step went quiet when its own lines ended this long before its end (and this share of it).
QUIET_S = 5.0
QUIET_SHARE = 0.25


def _timeline_table(s: SessionReport) -> Table:
    """The start-up's steps: when each began, how long it took, and what the log says of it.
    The steps are contiguous, so the durations add up (the title says to what)."""
    t = _table(("step", "left"), ("from", "left"), ("took", "right"), ("", "left"))
    t.columns[3].no_wrap = False
    last = len(s.timeline) - 1
    for i, step in enumerate(s.timeline):
        notes: list[str] = []
        start = hms(step.started_at)
        if step.began_before_log:
            start = "≤" + start
            notes.append("began before the log: its start is not in it")
        if step.detail:
            notes.append(step.detail)
        notes.extend(step.bars)
        end = step.ended_at
        if end is not None and step.last_line_at is not None:
            quiet = end - step.last_line_at
            if quiet >= QUIET_S and quiet >= QUIET_SHARE * step.duration_s:
                notes.append(f"its last line {duration(quiet)} before the next step")
        took = duration(step.duration_s)
        style = ""
        if end is None:
            took += "…"
            notes.append("under way when the log ends")
        elif i == last and s.verdict.status == "failed" and s.ready_at is None:
            style = "red"
            notes.append(f"failed here: {s.failure_kind or 'unknown'}")
        elif i == last and s.phase == "stopped" and s.ready_at is None:
            notes.append("vLLM shut down here")
        if step.phase == "unknown":
            what = "which step this was" if step.began_before_log else "what came next"
            notes.insert(0, f"the log does not say {what}")
        t.add_row(
            Text(step.phase, style=style), Text(start), Text(took), Text("; ".join(notes), "dim")
        )
    return t


def _timeline_title(s: SessionReport) -> Text:
    first, end = s.timeline[0].started_at, s.timeline[-1].ended_at
    title = Text("Start-up timeline", style="bold")
    if end is not None:
        what = "to ready" if s.ready_at is not None and end <= s.ready_at else "in all"
        title.append(f"  {duration(end - first)} {what}", style="dim")
    return title


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
    t.columns[0].max_width = 38
    t.columns[1].overflow = "ellipsis"
    t.columns[1].max_width = 16
    for i, least in ((2, 7), (3, 9), (4, 11), (5, 6)):
        t.columns[i].min_width = least
    for b in s.bars:
        count = f"{size(b.done)}/{size(b.total)}" if b.unit == "bytes" else f"{b.done}/{b.total}"
        done = Text(count, "green" if b.done >= b.total > 0 else "yellow")
        took = duration(b.duration_s) if b.duration_s > 0 or b.updates > 1 else "-"
        t.add_row(
            Text(b.desc),
            Text(b.process or "-"),
            done,
            Text(f"{size(b.rate_per_s)}/s" if b.unit == "bytes" else _rate(b.rate_per_s)),
            Text(duration(b.longest_gap_s)),
            Text(took),
        )
    return t


def _warnings_table(warnings: Sequence[WarningGroup], limit: int) -> Table:
    t = _table(
        ("warning", "left"),
        ("count", "right"),
        ("layers", "left"),
        ("processes", "left"),
        ("verdict", "left"),
    )
    t.columns[0].overflow = "ellipsis"
    t.columns[0].max_width = 50
    for i, least in ((1, 5), (2, 6), (4, 7)):
        t.columns[i].min_width = least
    t.columns[3].max_width = 20
    t.columns[3].overflow = "ellipsis"
    for w in warnings[:limit]:
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
        )
    if len(warnings) > limit:
        rest = sum(w.count for w in warnings[limit:])
        t.add_row(Text(f"… {len(warnings) - limit} more kinds", "dim"), Text(str(rest), "dim"))
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
        if f.echoes:
            at = [str(e.line) for e in f.evidence if e.line is not None and e.line != f.line]
            at_lines = f" (lines {clip(', '.join(at), 60)})" if at else ""
            noun = "echo" if f.echoes == 1 else "echoes"
            lines.append(Text(f"{f.echoes} {noun} folded in{at_lines}", style="dim"))
        grid.add_row(mark, Group(*lines))
    if len(s.failures) > limit:
        rest = s.failures[limit:]
        kinds: dict[str, int] = {}
        for f in rest:
            kinds[f.kind] = kinds.get(f.kind, 0) + f.count
        more = ", ".join(f"{k} ×{n}" for k, n in kinds.items())
        grid.add_row(Text(""), Text(f"… and {len(rest)} related: {more}", style="dim"))
    return grid


def _gib(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


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
        parts.append(f"model {_gib(gib)} GiB")
    kv = num("kv_cache.available_memory", "gib")
    tokens = num("kv_cache.size", "tokens")
    if kv is not None or tokens is not None:
        bits = [
            f"{_gib(kv)} GiB" if kv is not None else "",
            f"{tokens:,.0f} tokens" if tokens else "",
        ]
        parts.append("KV cache " + ", ".join(b for b in bits if b))
    if (sec := num("torch_compile.total", "seconds")) is not None:
        parts.append(f"compile {duration(sec)}")
    if (sec := num("graph_capture", "seconds")) is not None:
        gib = num("graph_capture", "gib")
        parts.append(f"graphs {duration(sec)}" + (f", {_gib(gib)} GiB" if gib is not None else ""))
    if (sec := num("engine_init", "seconds")) is not None:
        parts.append(f"engine init {duration(sec)}")
    if (m := ms.get("api_server_start")) is not None and m.value:
        parts.append(f"API {m.value}")
    return Text(" · ".join(parts)) if parts else None


def _indent(r: RenderableType) -> Padding:
    return Padding(r, (0, 0, 0, 2))


def _silent(p: ProcessReport) -> str:
    """A process silent while its peers moved on, where its lines stop."""
    where = f"line {p.last_line}" if p.last_line is not None else f"offset {p.last_offset}"
    at = f"shard {p.shard}" if p.shard is not None else p.phase
    who = f"{p.name} pid={p.pid}" if p.pid is not None else p.name
    return f"{who}: its last line {where} at {clock(p.last_at)} ({at}); its peers logged on"


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
        start = f"before the log; its first line {start}"
    grid.add_row(Text("started"), Text(start))
    if s.phases:
        grid.add_row(Text("phases"), _phases_line(s))
    for note in s.verdict.notes:
        grid.add_row(Text(""), Text(note, style="dim"))
    if s.stalls_total or s.stall_hints:
        hint = f"{s.stall_hints} 'no available shared memory broadcast block' hint(s)"
        grid.add_row(Text("stalls"), Text(f"{s.stalls_total} stall(s); {hint}"))
    for p in s.processes:
        if p.silent_while_peers_moved_on:
            grid.add_row(Text("silent rank", style="yellow"), Text(_silent(p)))
    kv = s.kv_cache
    rated = [w for w in s.warnings if w.code in KV_SCALE_CODES | FP8_PATH_CODES]
    if kv.quantized or rated:
        grid.add_row(Text("KV cache"), Text(f"{kv.dtype or 'unknown'}: {kv.reason}"))
        said = f" ({kv.reason})"
        for reason in dict.fromkeys(
            f"{w.code}: {w.verdict}, {w.reason.replace(said, '')}" for w in rated
        ):
            grid.add_row(Text(""), Text(reason, style="dim"))
    plan = s.memory_plan
    if plan is not None and plan.actual_vs_plan != "pending":
        grid.add_row(Text("KV vs plan"), Text(f"{plan.actual_vs_plan}: {plan.explain}"))
    facts = _facts(s) if last else None
    if facts is not None:
        grid.add_row(Text("facts"), facts)
    out.append(_indent(grid))
    if s.timeline:
        out.append(_indent(_timeline_title(s)))
        out.append(_indent(_timeline_table(s)))
    if s.failures:
        out.append(_indent(Text("Failures", style="bold")))
        out.append(_indent(_failures(s, 5 if last else 1)))
    # Earlier sessions: the sessions table has their progress; only what went wrong is repeated.
    if s.bars and last:
        out.append(_indent(Text("Progress bars", style="bold")))
        out.append(_indent(_bars_table(s)))
    shown = s.warnings if last else [w for w in s.warnings if w.verdict in ("flagged", "unknown")]
    if shown:
        out.append(_indent(Text(f"Warnings ({s.warnings_total})", style="bold")))
        out.append(_indent(_warnings_table(shown, 8 if last else 4)))
    return out


def render_report(report: Report) -> RenderableType:
    report = clean_values(report)
    parts: list[RenderableType] = _header(report)
    if report.crash_loop is not None:
        parts.append(Text(crash_loop_text(report.crash_loop), style="red"))
    if len(report.sessions) > 1 or report.sessions_omitted:
        parts.append(Text(""))
        parts.append(_sessions_table(report))
    for i, s in enumerate(report.sessions):
        parts.append(Text(""))
        parts.extend(_session_block(s, last=i == len(report.sessions) - 1))
    return Group(*parts)


def report_text(report: Report, width: int = 100) -> str:
    """The text report without colour, as a pipe gets it (tests, logs)."""
    return plain_text(render_report(report), width)


def print_report(report: Report, file: IO[str]) -> None:
    show(render_report(report), file)


__all__ = ["print_report", "render_report", "report_text"]
