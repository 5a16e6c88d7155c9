"""The fold's handlers of log events: warnings, milestones, failures (see fold.py's `Fold`);
bars in fold_bars.py.

Each reads its event and calls the fold's verbs; k/v scale warnings back to back (most of a
load's records) are counted as a run, in one call (`on_kv_run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loadwatch.daemon.state.failures import (
    FailureTally,
    fold_failure,
    session_kind,
    shutdown_noise,
)
from loadwatch.daemon.state.fold import Fold
from loadwatch.daemon.state.fold_bars import on_progress_run
from loadwatch.daemon.state.nodefold import track_node
from loadwatch.daemon.state.session import (
    LOADING_MILESTONES,
    POST_LOAD_MILESTONES,
    TERMINAL,
    EpFilterSeen,
    MilestoneSeen,
    Session,
    WarningTally,
    failure_rank,
)
from loadwatch.daemon.state.snapshot import SessionSummary
from loadwatch.parsers.events import (
    ClientText,
    EpWeightFilter,
    Event,
    Failure,
    KvScaleWarning,
    LogError,
    LogWarning,
    Milestone,
    ScaleFactorWarning,
    ShardProgress,
    StallHint,
    message_code,
)

MAX_EVEN_FILES = 100_000  # a bar of more "files" than this is not one of checkpoint files


def _on_ep_filter(f: Fold, ev: EpWeightFilter) -> None:
    """`EP weight filter: ...`: this rank reads its own experts only (the ETA's inputs say so)."""
    t = f.at(ev.ts)
    f.ensure_session(t)
    f.activity(t)
    seen = EpFilterSeen(ev.ep_size, ev.ep_rank, ev.experts_loaded, ev.experts_total, t, ev.process)
    f.upd(ep_filter=seen)
    f.advance("loading_weights", t, "ep weight filter")


def _tally(
    f: Fold, evs: Sequence[Event], code: str, severity: str, message: str, kv: bool = False
) -> None:
    """Count the warnings `evs` of `code`: one record's, or a run of records back to back (a
    load's per-layer k/v scale warnings: `kv`, with their layers and scales), exactly as one at
    a time would, in one call."""
    t = f.at(evs[0].ts)
    s = f.ensure_session(t)
    if s.stall is not None and s.stall.kind == "quiet":
        f.activity(t)
    cfg = f.cfg
    warnings = f.mine("warnings")
    if code not in warnings and len(warnings) >= cfg.max_warning_codes:
        code = "other"
    w = warnings.get(code)
    if w is None:
        w = f.made(
            WarningTally(code, severity, 0, t, t, 0, 0, frozenset(), frozenset(), message[:300])
        )
    else:
        w = f.mine_record(w)
    warnings[code] = w
    mask, over, scales, procs = w.layers_mask, w.layers_over, w.scales, w.processes
    max_layer, max_procs = cfg.max_layer, cfg.max_processes
    replay, now, offset = f.replay, f.now, f.offset
    for i, ev in enumerate(evs):
        if replay and i:  # `Fold.at`, the session's last event being the one before
            ts = ev.ts
            if ts is not None:
                if ts + offset > t:
                    t = ts + offset
                if t > now:
                    t = now
        if kv:
            layer = ev.layer  # type: ignore[attr-defined]
            if layer is not None:
                if 0 <= layer < max_layer:
                    mask |= 1 << layer
                else:
                    over += 1
            scale = ev.scale  # type: ignore[attr-defined]
            if scale is not None and scale not in scales:
                scales = scales | {scale}
        p = ev.process
        if p and p not in procs and len(procs) < max_procs:
            procs = procs | {p}
    d = w.__dict__
    d["layers_mask"], d["layers_over"], d["scales"], d["processes"] = mask, over, scales, procs
    d["count"] = w.count + len(evs)
    d["last_at"] = t
    sd = f.sess.__dict__  # (the draft: `mine` made it)
    sd["warnings_total"] += len(evs)
    sd["last_event_at"] = t
    sd["log_seen"] = True


def on_kv_run(f: Fold, run: Sequence[KvScaleWarning]) -> None:
    """k/v scale warnings back to back (a load prints one per layer and worker): one tally;
    the node looks at each process once."""
    f.record = run[0].offset
    _tally(f, run, "kv_scale_missing", "warning", run[0].checkpoint_name or "", kv=True)
    seen: set[tuple[str | None, int | None]] = set()
    for ev in run:
        who = (ev.process, ev.pid)
        if who not in seen:  # (`track_node` would do nothing for it again)
            seen.add(who)
            track_node(f, ev)


def _on_scale_factor(f: Fold, ev: ScaleFactorWarning) -> None:
    _tally(f, (ev,), ev.code, "warning", ev.message)
    if ev.code == "kv_scale_default" and not f.s.kv.fp8_path:
        f.upd(kv=replace(f.s.kv, fp8_path=True))


def _on_log_warning(f: Fold, ev: LogWarning) -> None:
    _tally(f, (ev,), message_code("log", ev.message), "warning", ev.message)


def _on_log_error(f: Fold, ev: LogError) -> None:
    _tally(f, (ev,), message_code("error", ev.message), "error", ev.message)


def _on_client_text(f: Fold, ev: ClientText) -> None:
    """Text a client chose, echoed by vLLM: counted, and nothing else (not even activity: it
    says nothing of how vLLM's own work goes)."""
    counts = f.get("client_text")
    f.changes["client_text"] = {**counts, ev.kind: counts.get(ev.kind, 0) + 1}


def _on_stall_hint(f: Fold, ev: StallHint) -> None:
    t = f.at(ev.ts)
    f.ensure_session(t)
    f.activity(t)
    f.upd(stall_hints=f.s.stall_hints + 1, last_hint_s=ev.seconds)


def _on_milestone(f: Fold, ev: Milestone) -> None:
    t = f.at(ev.ts)
    s = f.sess
    if ev.kind == "version":
        seen = s.milestones.get("version") if s is not None else None
        fresh_start = s is not None and s.phase == "starting"
        duplicate = seen is not None and t - seen.last_at < 10.0
        if s is None or not fresh_start or (seen is not None and not duplicate):
            f.open_session(t, "log_version")
    elif ev.kind == "model_load_start" and (
        s is None
        or s.phase in TERMINAL
        or s.phase == "ready"
        or (s.phase == "post_load" and (ev.process or "-") in s.load_started_by)
    ):
        f.open_session(t, "log_model_load_start")
    s = f.ensure_session(t)
    f.activity(t)
    s = f.s
    # (the engine config's detail is a value, the KV-cache dtype it names: not a sub-kind)
    key = ev.kind if ev.detail is None or ev.kind == "engine_config" else f"{ev.kind}.{ev.detail}"
    m = s.milestones.get(key)
    if m is None:
        m = MilestoneSeen(
            ev.kind, ev.detail, 1, t, t, ev.seconds, ev.gib, ev.tokens, ev.blocks, ev.value
        )
    else:  # each value the latest the milestone gave
        m = MilestoneSeen(
            m.kind,
            m.detail,
            m.count + 1,
            m.first_at,
            t,
            ev.seconds if ev.seconds is not None else m.seconds,
            ev.gib if ev.gib is not None else m.gib,
            ev.tokens if ev.tokens is not None else m.tokens,
            ev.blocks if ev.blocks is not None else m.blocks,
            ev.value if ev.value is not None else m.value,
        )
    f.mine("milestones")[key] = m
    if ev.kind == "version" and ev.value:
        f.upd(version=ev.value)
    pid = _server_pid(ev)
    if pid is not None and pid != f.s.server_pid:
        f.upd(server_pid=pid)
    if ev.kind == "model_load_start" and len(s.load_started_by) < f.cfg.max_processes:
        f.upd(load_started_by=s.load_started_by | {ev.process or "-"})
    if ev.kind in LOADING_MILESTONES:
        f.advance("loading_weights", t, ev.kind)
    elif ev.kind == "kv_cache" and ev.detail == "dtype":
        # Printed while vLLM builds its configuration, before the model loads (no phase change),
        # and only when it stores the cache quantized (fp8, fp8_e4m3, nvfp4, nvfp4_ds_mla).
        if ev.value:
            f.upd(kv=replace(f.s.kv, stored=ev.value.lower()))
    elif ev.kind in POST_LOAD_MILESTONES:
        if ev.kind == "api_server_start" and f.s.api_server_at is None:
            f.upd(api_server_at=t)
        f.advance("post_load", t, ev.kind)
        # Not ready at `Available routes are:`: vLLM 0.32 lists its routes before uvicorn
        # listens, and a request then is refused (tests/e2e/test_real_vllm.py saw it).
    elif ev.kind == "app_startup_complete":
        _ready(f, t, "application startup complete")
    elif ev.kind == "shutdown":
        _shutdown(f, t, ev.value or "")
    elif ev.kind == "launch_args" and ev.detail == "kv_cache_dtype" and ev.value:
        f.upd(kv=replace(f.s.kv, args=ev.value.lower()))
    elif ev.kind == "engine_config":
        kv = f.s.kv
        f.upd(kv=replace(kv, engine=(ev.detail or "").lower() or kv.engine, model_path=ev.value))


def _server_pid(ev: Milestone) -> int | None:
    """The API server's pid: uvicorn's `Started server process [N]`, or the prefix of one of its
    lines (`(APIServer pid=N)`)."""
    if ev.kind == "api_server_start" and ev.detail == "server_process":
        return int(ev.value) if ev.value and ev.value.isdigit() else None
    return ev.pid if ev.process is not None and ev.process.lower().startswith("api") else None


def _shutdown(f: Fold, t: float, what: str) -> None:
    """vLLM says it is shutting down. Asked to (a signal, not a crash), what follows is not a
    failure: a clean SIGTERM still logs an EngineDeadError traceback."""
    if "signal=SIG" in what or "shutdown triggered" in what:
        f.upd(stop_requested=True)
    s = f.s
    if what in STOP_LINES and s.phase not in TERMINAL:
        f.set_phase("stopped", t, "vLLM shut down" + (" on request" if s.stop_requested else ""))


# The API server's own shutdown lines (vLLM 0.32: `[shutdown] API server: shutdown triggered`,
# uvicorn's `Shutting down`, `Application shutdown complete`): after any of them nothing serves.
# The engine core's `[shutdown] EngineCore: ...` lines alone do not say the server goes.
STOP_LINES = frozenset(
    {"API server: shutdown triggered", "Shutting down", "Application shutdown complete"}
)


def _ready(f: Fold, t: float, reason: str) -> None:
    s = f.s
    if s.phase in TERMINAL:
        return
    if s.ready_at is None:
        f.upd(ready_at=t)
    f.advance("ready", t, reason)


def _fatal(s: Session, ev: Failure) -> bool:
    """Before vLLM serves, every failure the log shows is fatal. Once it serves, clients choose
    text vLLM logs (a model name, a request id) and a request's error is logged like any other:
    an error alone is a warning, and the session fails only on corroboration: the engine's own
    word that it died (`engine_fatal`), or, through `corroborate`, the process's exit or
    /health failing."""
    if s.stop_requested:
        return False
    if ev.kind == "completion_failed":
        return True  # loadwatch's own check, not the log's
    return s.ready_at is None or ev.engine_fatal or s.phase == "failed"


def corroborate(f: Fold, t: float, why: str) -> bool:
    """The server is gone or failing (`why`): the failures the log showed shortly before, held
    as warnings while it served, were fatal after all. The session fails with the most telling
    of them; False when there were none (then the caller decides what the end was)."""
    s = f.s
    if s.stop_requested or s.phase in TERMINAL:
        return False
    held = _held_failures(f, t)
    if not held:
        return False
    kind = session_kind(f.s.failures) or "other"
    if f.s.stall is not None:
        f.clear_stall(t, "failed")
    f.clear_forecasts(t, "session failed")
    best = min(held, key=lambda v: failure_rank(v.kind))
    f.set_phase("failed", t, f"{kind}: {best.message[:200]} ({why})", failure_kind=kind)
    return True


def _held_failures(f: Fold, t: float) -> list[FailureTally]:
    """The failures held as warnings within the corroboration window before `t` that say why
    an engine dies (an `other` error is a request's), now made fatal (in the session's draft)."""
    s = f.s
    since = t - f.cfg.corroboration_window_s
    held = [
        v for v in s.failures.values() if not v.fatal and v.kind != "other" and v.last_at >= since
    ]
    if held:
        failures = {k: replace(v, fatal=True) if v in held else v for k, v in s.failures.items()}
        f.upd(failures=failures)
    return held


def _on_failure(f: Fold, ev: Failure) -> None:
    t = f.at(ev.ts)
    s = f.sess
    past = f.get("past")
    # A failure the previous process logged, read after the next one started: the new
    # process has logged nothing yet (live, the record's stamp says nothing about the clock),
    # or, replayed, its time is before the start.
    if (
        s is not None
        and s.reason == "process_start"
        and past
        and not s.log_seen
        and (not f.replay or t < s.started_at - 1.0)
    ):
        _late_failure(f, ev, t, past)
        return
    s = f.ensure_session(t)
    f.activity(t)
    s = f.s
    if shutdown_noise(ev, s.stop_requested):
        return  # the shutdown that was asked for, not a failure
    fatal = _fatal(s, ev)
    if fatal and s.ready_at is not None and s.phase != "failed":
        _held_failures(f, t)  # the engine died: the errors just before it say why
        s = f.s
    folded = fold_failure(s.failures, ev, t, fatal, f.cfg.max_failures, f.cfg.max_processes)
    f.upd(failures=folded.failures, failures_total=s.failures_total + 1)
    if folded.new_root:
        f.emit(
            "failure",
            t,
            failure_kind=ev.kind,
            message=(ev.exc_type + ": " if ev.exc_type else "") + ev.message[:300],
            fatal=fatal,
        )
    if not fatal:
        return
    kind = session_kind(folded.failures) or ev.kind
    s = f.s
    if s.stall is not None:
        f.clear_stall(t, "failed")
    s = f.s
    if s.phase == "failed":
        if kind != s.failure_kind:
            f.upd(failure_kind=kind)
        return
    f.clear_forecasts(t, "session failed")
    f.set_phase("failed", t, f"{kind}: {ev.message[:200]}", failure_kind=kind)


def _late_failure(f: Fold, ev: Failure, t: float, past: tuple[SessionSummary, ...]) -> None:
    """A failure logged by the previous process, read after the next one started."""
    last = past[-1]
    kind = last.failure_kind
    phase = last.phase
    if not last.stop_requested:
        if failure_rank(ev.kind) < failure_rank(kind):
            kind = ev.kind
        if phase == "stopped":
            phase = "failed"
    f.changes["past"] = (
        *past[:-1],
        replace(last, failure_kind=kind, phase=phase, failures_total=last.failures_total + 1),
    )
    f.emit(
        "failure",
        t,
        session=last.id,
        failure_kind=ev.kind,
        message=ev.message[:300],
        fatal=not last.stop_requested,
    )


# Every log event type and its handler, one event at a time (`LOG_RUNS`: a run of them). Their
# transitions carry the record's offset.
LOG_HANDLERS: dict[type, Any] = {
    ScaleFactorWarning: _on_scale_factor,
    LogWarning: _on_log_warning,
    LogError: _on_log_error,
    StallHint: _on_stall_hint,
    Milestone: _on_milestone,
    Failure: _on_failure,
    EpWeightFilter: _on_ep_filter,
    ClientText: _on_client_text,
}
LOG_RUNS: dict[type, Any] = {KvScaleWarning: on_kv_run, ShardProgress: on_progress_run}
