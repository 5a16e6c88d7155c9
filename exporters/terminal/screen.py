"""The `loadwatch status` screen: one `/status` document drawn with rich.

`render_status(doc)` is a pure function of the `/status` JSON (schema in daemon/state/snapshot.py): it
reads nothing else, takes every age from the document's own `at`, and tolerates missing or
mistyped keys (an older or newer daemon), so `loadwatch demo` can draw its live screen with it.
`status_text` gives the same as plain text.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from loadwatch.exporters.terminal.clean import clean_values
from loadwatch.exporters.terminal.console import plain_text
from loadwatch.exporters.terminal.docread import (
    amount,
    count,
    integer,
    items,
    mapping,
    number,
    string,
    strings,
    yes,
)
from loadwatch.exporters.terminal.fmt import clip, duration, few, hms, ranges, size
from loadwatch.exporters.terminal.plan_line import plan_line
from loadwatch.exporters.terminal.ready_line import ready_line

BAR_CELLS = 32
MEMORY_CELLS = 24

PHASE_STYLE = {
    "starting": "cyan",
    "loading_weights": "bold cyan",
    "post_load": "bold blue",
    "ready": "bold green",
    "failed": "bold red",
    "stalled": "bold yellow",
    "stopped": "dim",
}
VERDICT_STYLE = {"benign": "green", "flagged": "red", "unknown": "yellow", "unrated": "dim"}


# -- drawing ------------------------------------------------------------------------------------


def _ago(at: float | None, now: float | None) -> str:
    if at is None or now is None:
        return ""
    return f"{duration(now - at)} ago"


def _bar(ratio: float | None, cells: int = BAR_CELLS, style: str = "cyan") -> Text:
    r = min(max(ratio or 0.0, 0.0), 1.0)
    full = int(r * cells)
    t = Text("█" * full, style)
    if full < cells:
        frac = r * cells - full
        t.append("▌", style) if frac >= 0.5 else t.append("░", "dim")
        t.append("░" * (cells - full - 1), "dim")
    return t


def _memory_bar(
    used: float, total: float, proj: float | None, oom: bool, cells_n: int = MEMORY_CELLS
) -> Text:
    """Used memory, the growth the projection expects, and a mark where it ends; an arrow past
    the right edge when the projection does not fit."""
    u = min(max(used / total, 0.0), 2.0)
    p = min(max(proj / total, 0.0), 2.0) if proj is not None else None
    fill = "red" if u > 0.95 or oom else ("yellow" if u > 0.85 else "green")
    mark = None
    if p is not None:
        mark = min(max(round(p * cells_n) - 1, 0), cells_n - 1)
    cells: list[tuple[str, str]] = []
    for i in range(cells_n):
        pos = (i + 0.5) / cells_n
        if i == mark and p is not None:
            cells.append(("▶", "bold red") if p > 1.0 else ("│", "bold red" if oom else "bold"))
        elif pos <= u:
            cells.append(("█", fill))
        elif p is not None and pos <= min(p, 1.0):
            cells.append(("▒", "red" if oom else "dim"))
        else:
            cells.append(("░", "dim"))
    t = Text()
    for (char, style), run in groupby(cells):
        t.append(char * len(list(run)), style)
    return t


def _header(doc: Mapping[str, Any]) -> Text:
    s = mapping(doc.get("session"))
    phase = string(doc.get("phase"))
    t = Text("loadwatch ", "bold")
    if phase is None:
        t.append("waiting for vLLM", "dim")
    else:
        t.append(phase.replace("_", " ").upper(), PHASE_STYLE.get(phase, "bold"))
    sid = integer(s.get("id"))
    if sid is not None:
        t.append(f"  session {sid}")
        restarts = count(doc.get("restarts")) or 0
        if restarts:
            t.append(f" ({restarts} restart{'s' if restarts != 1 else ''})", "yellow")
    version = string(s.get("version"))
    if version:
        t.append(f"  vLLM {version}", "dim")
    pid = integer(s.get("pid"))
    if pid is not None:
        t.append(f"  pid {pid}", "dim")
    t.append(f"  at {hms(number(doc.get('at')))}", "dim")
    return t


def _progress_rows(doc: Mapping[str, Any], grid: Table) -> None:
    s = mapping(doc.get("session"))
    if not s:
        return
    now = number(doc.get("at"))
    p = mapping(s.get("progress"))
    done, total = count(p.get("shards_done")), count(p.get("shards_total"))
    ratio = amount(p.get("ratio"))
    if total:
        if ratio is None and done is not None:
            ratio = done / total
        line = _bar(ratio)
        line.append(f" {100 * (ratio or 0):5.1f}%", "bold")
        bd, bt = amount(p.get("bytes_done")), amount(p.get("bytes_total"))
        # the count in what the weights bar counts; a bar in bytes shows its sizes alone
        unit = next(
            (
                string(mapping(b).get("unit"))
                for b in items(s.get("bars"))
                if mapping(b).get("kind") == "weights"
            ),
            None,
        )
        if unit != "bytes" or not bt:
            line.append(f"  {done or 0}/{total} {'tensors' if unit == 'tensors' else 'shards'}")
        if bt:
            line.append(f"  {size(bd)} / {size(bt)}")
        stage = count(p.get("stage")) or 0
        if stage:
            line.append(f"  (stage {stage + 1})", "dim")
        grid.add_row(Text("weights"), line)
        eta = mapping(p.get("eta"))
        rem = amount(eta.get("remaining_s"))
        if rem is not None and s.get("phase") in ("loading_weights", "stalled", "starting"):
            e = Text(duration(rem), "bold")
            low, high = amount(eta.get("low_s")), amount(eta.get("high_s"))
            if low is not None and high is not None:
                e.append(f" ({duration(low)} – {duration(high)})")
            fin = number(eta.get("finish_at"))
            if fin is not None:
                e.append(f", done about {hms(fin)}", "dim")
            rate = amount(eta.get("rate_per_s"))
            if rate:
                units = string(eta.get("units")) or "items"
                rtxt = f"{size(rate)}/s" if units == "bytes" else f"{rate:.2f} shards/s"
                e.append(f" · {rtxt}", "dim")
            grid.add_row(Text("ETA"), e)
    phase = string(s.get("phase")) or "-"
    line = Text(phase, PHASE_STYLE.get(phase, ""))
    age = amount(s.get("phase_age_s"))
    if age is not None:
        line.append(f" for {duration(age)}")
    last = number(p.get("last_progress_at"))
    if last is not None:
        line.append(f"; last progress {hms(last)} ({_ago(last, now)})", "dim")
    ttr = amount(s.get("time_to_ready_s"))
    if ttr is not None:
        line.append(f"; ready {duration(ttr)} after start", "green")
    grid.add_row(Text("phase"), line)
    if (ready := ready_line(s)) is not None:
        grid.add_row(Text("ready"), ready)
    st = mapping(s.get("stall"))
    if yes(st.get("active")):
        msg = string(st.get("reason")) or "no progress"
        thr = amount(st.get("threshold_s"))
        extra = f" (threshold {duration(thr)})" if thr is not None else ""
        grid.add_row(Text("STALLED", "bold yellow"), Text(msg + extra, "yellow"))
    elif count(st.get("hints")):
        grid.add_row(
            Text("hints"),
            Text(f"{count(st.get('hints'))} 'no shared memory broadcast block' message(s)", "dim"),
        )


def _gib(n: float | None) -> str:
    return f"{n / 2**30:.1f}" if n is not None else "?"


def _memory_cells(width: int | None) -> int:
    """The memory bar takes what the other columns leave (about 64 cells of them), so nothing
    is cut at 80 columns and a wide terminal gets a finer bar."""
    if width is None:
        return MEMORY_CELLS
    return min(max(width - 65, 8), 48)


def _folded(notes: list[tuple[int | None, str, str]]) -> list[Text]:
    """One line per distinct note: eight GPUs predicting the same OOM read `GPUs 0-7: ...`."""
    order: dict[tuple[str, str], list[int | None]] = {}
    for idx, text, style in notes:
        order.setdefault((text, style), []).append(idx)
    out = []
    for (text, style), idxs in order.items():
        known = sorted(i for i in idxs if i is not None)
        if len(idxs) == 1:
            who = f"GPU {idxs[0] if idxs[0] is not None else '?'}"
        else:
            who = f"GPUs {ranges(known)}" if len(known) == len(idxs) else f"{len(idxs)} GPUs"
        out.append(Text(f"{who}: {text}", style))
    return out


def _gpus(doc: Mapping[str, Any], width: int | None = None) -> list[RenderableType]:
    gpus = [g for g in items(doc.get("gpus")) if isinstance(g, Mapping)]
    if not gpus:
        return []
    cells = _memory_cells(width)
    names = sorted({n for g in gpus if (n := string(g.get("name")))})
    title = Text("GPUs", "bold")
    if names:
        title.append(f"  {len(gpus)} × {', '.join(names)}", "dim")
    t = Table(box=None, pad_edge=False, header_style="dim", padding=(0, 2, 0, 0))
    for name, just in (
        ("#", "right"),
        ("memory, │ = projected end" if cells >= 26 else "memory", "left"),
        ("used / total GiB" if cells >= 26 else "GiB used/total", "right"),
        ("projected GiB", "left"),
        ("temp", "right"),
        ("power", "right"),
        ("util", "right"),
    ):
        t.add_column(name, justify=just, no_wrap=True)  # type: ignore[arg-type]
    notes: list[tuple[int | None, str, str]] = []
    for g in gpus:
        idx = integer(g.get("index"))
        health = string(g.get("health")) or "unknown"
        used, total = amount(g.get("memory_used_bytes")), amount(g.get("memory_total_bytes"))
        label = Text(str(idx) if idx is not None else "?")
        xids = count(g.get("xids_total")) or 0
        if xids:
            notes.append(
                (idx, f"{xids} Xid error(s), last Xid {integer(g.get('last_xid'))}", "bold red")
            )
        if health != "ok" or used is None or not total:
            err = string(g.get("error")) or "no reading"
            t.add_row(
                label,
                Text(f"{health}: {clip(err, max(cells + 20, 30))}", "red"),
                *(Text("") for _ in range(5)),
            )
            continue
        oom = yes(g.get("oom_predicted"))
        proj = amount(g.get("projected_final_bytes"))
        low, high = amount(g.get("projected_low_bytes")), amount(g.get("projected_high_bytes"))
        if proj is None:
            ptext = Text("-", "dim")
        else:
            ptext = Text(_gib(proj), "bold red" if oom else "")
            if low is not None and high is not None and high - low >= 0.05 * 2**30:
                ptext.append(f" ({_gib(low)}–{_gib(high)})", "dim")
            if oom:
                ptext.append(" OOM", "bold red")
                short = amount(g.get("shortfall_bytes"))
                since = number(g.get("oom_predicted_since"))
                note = (
                    f"out of memory predicted: {_gib(proj)} GiB projected at "
                    f"the end of the load, the GPU has {_gib(total)} GiB"
                )
                if short is not None:
                    note += f" (short {_gib(short)} GiB)"
                if since is not None:
                    note += f", since {hms(since)}"
                notes.append((idx, note, "bold red"))
        temp = number(g.get("temperature_celsius"))
        power = amount(g.get("power_watts"))
        util = amount(g.get("utilization_ratio"))
        t.add_row(
            label,
            _memory_bar(used, total, proj, oom, cells),
            Text(f"{_gib(used)} / {_gib(total)}"),
            ptext,
            Text(f"{temp:.0f}°C" if temp is not None else "-"),
            Text(f"{power:.0f} W" if power is not None else "-"),
            Text(f"{100 * util:.0f}%" if util is not None else "-"),
        )
    return [title, t, *_folded(notes)]


def _warnings_line(s: Mapping[str, Any]) -> Text | None:
    ws = [w for w in items(s.get("warnings")) if isinstance(w, Mapping)]
    if not ws:
        return None
    by: dict[str, list[Mapping[str, Any]]] = {}
    for w in ws:
        by.setdefault(string(w.get("verdict")) or "unrated", []).append(w)
    total = count(s.get("warnings_total")) or sum(count(w.get("count")) or 0 for w in ws)
    t = Text(f"{total}: ")
    first = True
    for verdict in ("flagged", "unknown", "benign", "unrated"):
        group = by.get(verdict)
        if not group:
            continue
        if not first:
            t.append(" · ", "dim")
        first = False
        n = sum(count(w.get("count")) or 0 for w in group)
        t.append(f"{verdict} {n}", VERDICT_STYLE[verdict])
        if verdict != "unrated":
            named = []
            for w in group[:3]:
                code = string(w.get("code")) or "?"
                layers = [c for x in items(w.get("layers")) if (c := count(x)) is not None]
                where = f", layers {ranges(layers, 3)}" if layers else ""
                named.append(f"{code} ×{count(w.get('count')) or 0}{where}")
            t.append(f" ({'; '.join(named)})")
    flagged = by.get("flagged") or by.get("unknown")
    if flagged:
        reason = string(flagged[0].get("reason"))
        if reason:
            t.append(f"\n{clip(reason, 160)}", "dim")
    return t


def _failures(s: Mapping[str, Any]) -> RenderableType | None:
    fs = [f for f in items(s.get("failures")) if isinstance(f, Mapping)]
    if not fs:
        return None
    rows: list[RenderableType] = []
    for f in fs[:3]:
        fatal = yes(f.get("fatal"))
        kind = string(f.get("kind")) or "other"
        t = Text("✗ " if fatal else "• ", "red" if fatal else "yellow")
        t.append(kind, "bold red" if fatal else "yellow")
        times = count(f.get("count")) or 1
        if times > 1:
            t.append(f" ×{times}")
        procs = strings(f.get("processes"))
        t.append(f"  {hms(number(f.get('first_at')))}  {few(procs)}", "dim")
        exc, msg = string(f.get("exc_type")), string(f.get("message")) or ""
        t.append("\n  " + clip(f"{exc}: {msg}" if exc else msg, 200))
        rows.append(t)
    if len(fs) > 3:
        rows.append(Text(f"… {len(fs) - 3} more", "dim"))
    return Group(*rows)


def _sessions_line(doc: Mapping[str, Any]) -> Text | None:
    past = [x for x in items(doc.get("sessions")) if isinstance(x, Mapping)]
    restarts = count(doc.get("restarts")) or 0
    if not past and not restarts:
        return None
    t = Text(f"{restarts}", "yellow" if restarts else "")
    for x in past[-4:]:
        t.append("  ·  " if t.plain != str(restarts) else ": ", "dim")
        phase = string(x.get("phase")) or "?"
        kind = string(x.get("failure_kind"))
        what = f"failed: {kind}" if phase == "failed" and kind else phase
        t.append(f"#{integer(x.get('id'))} ")
        t.append(what, PHASE_STYLE.get(phase, ""))
        done, total = count(x.get("shards_done")), count(x.get("shards_total"))
        if total:
            t.append(f" at {done}/{total}", "dim")
    if len(past) > 4:
        t.append(f"  (+{len(past) - 4} earlier)", "dim")
    return t


def _supervisor_line(doc: Mapping[str, Any]) -> Text | None:
    sup = mapping(doc.get("supervisor"))
    if not sup:
        return None
    state = string(sup.get("state")) or "?"
    t = Text(state, "green" if state == "started" else ("red" if state == "fatal" else ""))
    pid = integer(sup.get("pid"))
    if pid is not None:
        t.append(f", pid {pid}")
    at = number(sup.get("at"))
    if at is not None:
        t.append(f", since {hms(at)}", "dim")
    code, sig = integer(sup.get("exit_code")), integer(sup.get("signal"))
    if sig is not None:
        t.append(f", signal {sig}", "red")
    elif code is not None:
        t.append(f", exit code {code}", "red" if code else "")
    backoff = amount(sup.get("backoff_s"))
    if backoff is not None:
        t.append(f", next start in {duration(backoff)}", "yellow")
    reason = string(sup.get("reason"))
    if reason:
        t.append(f" ({clip(reason, 80)})", "dim")
    return t


def _health_line(doc: Mapping[str, Any]) -> Text | None:
    h = mapping(doc.get("health"))
    if not h:
        return None
    ok = yes(h.get("ok"))
    status = integer(h.get("status"))
    t = Text(f"/health {status if status is not None else 'no answer'}", "green" if ok else "red")
    err = string(h.get("error"))
    if err and not ok:
        t.append(f": {clip(err, 80)}", "red")
    fails = count(h.get("consecutive_failures")) or 0
    if fails:
        t.append(f" ({fails} failure{'s' if fails != 1 else ''} in a row)", "dim")
    at = number(h.get("at"))
    if at is not None:
        t.append(f" at {hms(at)}", "dim")
    return t


def render_status(doc: Mapping[str, Any], width: int | None = None) -> RenderableType:
    """The whole screen for one `/status` document, laid out for `width` columns when known.
    Pure: reads nothing but `doc`. Its strings are cleaned of control sequences first, so the
    layout measures the text as shown (the console cleans whatever is drawn anyway)."""
    doc = clean_values(doc)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    _progress_rows(doc, grid)
    s = mapping(doc.get("session"))
    parts: list[RenderableType] = [_header(doc), grid]
    gpus = _gpus(doc, width)
    parts.extend(gpus)
    if not gpus and doc.get("gpu_source_up") is False:
        parts.append(Text(f"GPUs: source down: {string(doc.get('gpu_error')) or '?'}", "red"))
    lower = Table.grid(padding=(0, 2))
    lower.add_column(style="bold", no_wrap=True)
    lower.add_column()
    if doc.get("gpu_source_up") is False and gpus:
        lower.add_row(
            Text("GPUs"), Text(f"source down: {string(doc.get('gpu_error')) or '?'}", "red")
        )
    for label, part in (
        ("failures", _failures(s)),
        ("warnings", _warnings_line(s)),
        ("restarts", _sessions_line(doc)),
        ("supervisor", _supervisor_line(doc)),
        ("health", _health_line(doc)),
    ):
        if part is not None:
            lower.add_row(Text(label), part)
    kv = mapping(doc.get("kv_cache"))
    if string(kv.get("dtype")) or isinstance(kv.get("quantized"), bool):
        q = yes(kv.get("quantized"))
        lower.add_row(
            Text("KV cache"),
            Text(
                f"{string(kv.get('dtype')) or '?'}: {string(kv.get('reason')) or ''}",
                "yellow" if q else "dim",
            ),
        )
    if (plan := plan_line(doc.get("memory_plan"))) is not None:
        lower.add_row(Text("KV plan"), plan)
    m = mapping(doc.get("model"))
    if m:
        line = Text(
            f"{string(m.get('path')) or '?'}: {count(m.get('shards')) or 0} shards, "
            f"{size(amount(m.get('total_bytes')))}"
        )
        ckpt = string(m.get("checkpoint_kv_dtype"))
        if ckpt:
            line.append(f", checkpoint KV {ckpt}")
        for e in items(m.get("errors"))[:2]:
            if isinstance(e, str):
                line.append(f"\n{clip(e, 100)}", "yellow")
        lower.add_row(Text("model"), line)
    if lower.row_count:
        parts.append(lower)
    return Group(*parts)


def status_text(doc: Mapping[str, Any], width: int = 100) -> str:
    """`render_status` as plain text (tests, logs)."""
    return plain_text(render_status(doc, width), width)


__all__ = ["render_status", "status_text"]
