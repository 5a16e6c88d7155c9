"""The fold's handlers of log events: warnings, milestones, failures (see fold.py's `Fold`);
bars in fold_bars.py.

Each reads its event and calls the fold's verbs; k/v scale warnings back to back (most of a
load's records) are counted as a run, in one call (`on_kv_run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loadwatch.daemon.state.fold import Fold, settle_failure
from loadwatch.daemon.state.fold_bars import on_progress_run
from loadwatch.daemon.state.nodefold import track_node
from loadwatch.daemon.state.ranks import Spans, process_spans, replayed, track_processes
from loadwatch.daemon.state.records import new_tuple
from loadwatch.daemon.state.session import (
    LOADING_MILESTONES,
    POST_LOAD_MILESTONES,
    TERMINAL,
    EpFilterSeen,
    MilestoneSeen,
    WarningTally,
)
from loadwatch.daemon.state.timeline import mark, milestone_signal
from loadwatch.daemon.state.timeline import ready as timeline_ready
from loadwatch.parsers.events import (
    ClientText,
    EpWeightFilter,
    Event,
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
    f.upd(ep_filter=seen, timeline=mark(f.s.timeline, "weights", t, ev.process, "on"))
    f.advance("loading_weights", t, "ep weight filter")


def _tally(
    f: Fold,
    evs: Sequence[Event],
    code: str,
    severity: str,
    message: str,
    kv: bool = False,
    spans: Spans | None = None,
    last_at: float | None = None,
) -> None:
    """Count the warnings `evs` of `code`: one record's, or a run of records back to back (a
    load's per-layer k/v scale warnings: `kv`, with their layers and scales), exactly as one at
    a time would, in one call. `spans`: the run's `process_spans`, when the caller has them
    (its processes are then read from there, in the same order, not record by record);
    `last_at`: the time of a run's last record, replayed (ranks.py's `replayed`)."""
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
    for ev in evs:
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
        if spans is None:
            p = ev.process
            if p and p not in procs and len(procs) < max_procs:
                procs = procs | {p}
    for p, _pid in spans or ():
        if p and p not in procs and len(procs) < max_procs:
            procs = procs | {p}
    d = w.__dict__
    d["layers_mask"], d["layers_over"], d["scales"], d["processes"] = mask, over, scales, procs
    if last_at is not None:
        t = last_at
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
    prev = f.sess.last_event_at if f.sess is not None else None
    spans = process_spans(run)
    times = replayed(f, run, prev) if f.replay else None  # (each record's, as `Fold.at` has it)
    kv_code, sample = "kv_scale_missing", run[0].checkpoint_name or ""
    _tally(f, run, kv_code, "warning", sample, True, spans, times[-1] if times else None)
    for first, _last in spans.values():  # (`track_node` would do nothing for the rest)
        track_node(f, run[first], lines=False)
    track_processes(f, run, prev, spans=spans, times=times)  # (each process's first and last)


def _on_scale_factor(f: Fold, ev: ScaleFactorWarning) -> None:
    _tally(f, (ev,), ev.code, "warning", ev.message)
    if ev.code == "kv_scale_default" and not f.s.kv.fp8_path:
        f.upd(kv=replace(f.s.kv, fp8_path=True))


def _on_log_warning(f: Fold, ev: LogWarning) -> None:
    _tally(f, (ev,), message_code("log", ev.message), "warning", ev.message)


def _on_log_error(f: Fold, ev: LogError) -> None:
    _tally(f, (ev,), message_code("error", ev.message), "error", ev.message)


def on_client_text_run(f: Fold, run: Sequence[ClientText]) -> None:
    """Text a client chose, echoed by vLLM (a serving log's many prompts): counted by kind,
    and nothing else (not even activity: it says nothing of how vLLM's own work goes). The
    process that printed it did print a line: the node looks at each process once, and each
    process's last line is noted, at its own time (the session's last event time stays)."""
    f.record = run[-1].offset
    kinds: dict[str, int] = {}
    for ev in run:
        kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
    spans = process_spans(run)
    for first, _last in spans.values():  # (`track_node` would do nothing for the rest)
        track_node(f, run[first], lines=False)
    for kind, n in kinds.items():
        f.count("client_text", kind, n)
    track_processes(f, run, moves_time=False, spans=spans)


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
    elif ev.kind == "launch_args" and (
        s is None or s.phase != "starting" or "launch_args.kv_cache_dtype" in s.milestones
    ):
        # vLLM prints its arguments and its version line at start, in either order (0.15 the
        # arguments first): the arguments of a session that is not a fresh start open the next
        f.open_session(t, "log_launch_args")
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
        m = new_tuple(
            MilestoneSeen,
            (ev.kind, ev.detail, 1, t, t, ev.seconds, ev.gib, ev.tokens, ev.blocks, ev.value),
        )
    else:  # each value the latest the milestone gave, but the API server's URL: the first
        m = new_tuple(
            MilestoneSeen,
            (
                m.kind,
                m.detail,
                m.count + 1,
                m.first_at,
                t,
                ev.seconds if ev.seconds is not None else m.seconds,
                ev.gib if ev.gib is not None else m.gib,
                ev.tokens if ev.tokens is not None else m.tokens,
                ev.blocks if ev.blocks is not None else m.blocks,
                # (vLLM prints it before it serves, so no client's text comes first; the daemon
                # probes it: a later line of the same shape must not move the probes)
                m.value
                if ev.value is None or (ev.kind == "api_server_start" and m.value is not None)
                else ev.value,
            ),
        )
    f.mine("milestones")[key] = m
    signal = milestone_signal(ev.kind, ev.detail)
    if signal is not None:
        phase, edge, note, timed = signal
        took = ev.seconds if timed else None
        tl = mark(f.s.timeline, phase, t, ev.process, edge, took, detail=note)
        f.upd(timeline=tl)
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
        ready(f, t, "application startup complete")
    elif ev.kind == "shutdown":
        _shutdown(f, t, ev.value or "")
    elif ev.kind == "launch_args" and ev.detail == "kv_cache_dtype":
        if ev.value:
            f.upd(kv=replace(f.s.kv, args=ev.value.lower()))
        if ev.args and ev.args != f.s.launch_args:
            f.upd(launch_args=ev.args)
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
        # A failure held for its echoes is decided first: an engine that died mid-serve takes
        # the API server down with it (uvicorn's `Shutting down` follows the root cause).
        if s.failing is not None and settle_failure(f, "then vLLM shut down"):
            return
        s = f.s
        f.set_phase("stopped", t, "vLLM shut down" + (" on request" if s.stop_requested else ""))


# The API server's own shutdown lines (vLLM 0.32: `[shutdown] API server: shutdown triggered`,
# uvicorn's `Shutting down`, `Application shutdown complete`): after any of them nothing serves.
# The engine core's `[shutdown] EngineCore: ...` lines alone do not say the server goes.
STOP_LINES = frozenset(
    {"API server: shutdown triggered", "Shutting down", "Application shutdown complete"}
)


def ready(f: Fold, t: float, reason: str) -> None:
    """vLLM serves: the ready line read, or /health 200. Read back (a replay), it is not seen
    live: readiness then waits for a live answer (`Session.seen_live`)."""
    s = f.s
    if s.phase in TERMINAL or s.failing is not None:
        return
    if not f.replay and not s.seen_live:
        f.upd(seen_live=True)
    if s.ready_at is None:
        tl = timeline_ready(s.timeline, t, None, f.cfg.require_completion)
        f.upd(ready_at=t, timeline=tl)
    f.advance("ready", t, reason)


# Every log event type and its handler, one event at a time (`LOG_RUNS`: a run of them). Their
# transitions carry the record's offset.
LOG_HANDLERS: dict[type, Any] = {
    ScaleFactorWarning: _on_scale_factor,
    LogWarning: _on_log_warning,
    LogError: _on_log_error,
    StallHint: _on_stall_hint,
    Milestone: _on_milestone,
    EpWeightFilter: _on_ep_filter,
}
LOG_RUNS: dict[type, Any] = {
    KvScaleWarning: on_kv_run,
    ShardProgress: on_progress_run,
    ClientText: on_client_text_run,
}
