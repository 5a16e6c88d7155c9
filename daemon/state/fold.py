"""The work of one `LoadState.apply`: per-input handlers that rebuild the session they touch.

A `Fold` holds the state being replaced, the session being rebuilt and the transitions produced;
each handler reads the input and calls its small verbs (`open_session`, `set_phase`, `advance`,
`clear_stall`, `emit`, ...). Nothing here mutates a record: every change is a `replace`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import (
    GpuReading,
    HealthProbe,
    IoSample,
    ModelInfo,
    ProcessEvent,
    Tick,
)
from loadwatch.daemon.state.durations import duration
from loadwatch.daemon.state.failures import fold_failure, session_kind, shutdown_noise
from loadwatch.daemon.state.forecast import EtaState, MemoryFit, stall_threshold_s
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import (
    LOADING_MILESTONES,
    ORDER,
    POST_LOAD_MILESTONES,
    SESSION_PART,
    STATE_PART,
    TERMINAL,
    BarTrack,
    GpuTrack,
    IoTrack,
    MilestoneSeen,
    PhaseSpan,
    Session,
    SessionInfo,
    SessionLife,
    SessionLog,
    Stall,
    StateConfig,
    StateData,
    WarningTally,
    active_weights_bar,
    failure_rank,
    main_fraction,
    summarise,
)
from loadwatch.daemon.state.snapshot import SessionSummary, Transition, TransitionKind
from loadwatch.parsers.events import (
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

# -- the fold -----------------------------------------------------------------------------------


class Fold:
    """The work of one `apply`: the session being rebuilt, state changes, transitions out."""

    __slots__ = ("cfg", "changes", "now", "offset", "old", "out", "record", "replay", "sess")

    def __init__(
        self, state: StateData, now: float, replay: bool = False, offset: float = 0.0
    ) -> None:
        self.old = state
        self.now = now
        self.cfg = state.config
        self.sess = state.session
        self.changes: dict[str, Any] = {}
        self.out: list[Transition] = []
        self.replay = replay
        self.offset = offset
        self.record: int | None = None  # the offset of the log record being folded

    # -- plumbing ----------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        return self.changes[name] if name in self.changes else getattr(self.old, name)

    def changes_out(self) -> dict[str, Any]:
        """The root fields to replace in the state (parts rebuilt once), this call's
        transitions included."""
        out: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for name, value in self.changes.items():
            parts.setdefault(STATE_PART[name], {})[name] = value
        for part, ch in parts.items():
            out[part] = evolve(getattr(self.old, part), **ch)
        if self.sess is not self.old.session:
            out["session"] = self.sess
        out["transitions"] = tuple(self.out)
        out["inputs_total"] = self.old.inputs_total + 1
        return out

    @property
    def s(self) -> Session:
        assert self.sess is not None
        return self.sess

    def upd(self, **kw: Any) -> None:
        """Change session fields: each part is copied once, then the four-field root."""
        s = self.s
        parts: dict[str, dict[str, Any]] = {}
        for name, value in kw.items():
            parts.setdefault(SESSION_PART[name], {})[name] = value
        self.sess = evolve(s, **{p: evolve(getattr(s, p), **ch) for p, ch in parts.items()})

    def emit(self, kind: TransitionKind, at: float, **kw: Any) -> None:
        sid = kw.pop("session", self.sess.id if self.sess is not None else None)
        self.out.append(Transition(kind=kind, at=at, session=sid, offset=self.record, **kw))

    def at(self, ts: float | None) -> float:
        """A log event's time. Live, every event happens `now` (the daemon's clock): its own
        stamp is in vLLM's local time, of no known zone, and is never compared with the clock.
        Replayed (re-read after a restart), an event happens at its stamp moved by the offset
        the log source gives, kept in order and never after `now`; one without a stamp, at the
        time of the event before it."""
        if not self.replay:
            return self.now
        s = self.sess
        prev = s.last_event_at if s is not None else None
        if ts is None:
            return prev if prev is not None else self.now
        t = ts + self.offset
        if prev is not None and t < prev:
            t = prev
        return t if t < self.now else self.now

    # -- sessions ----------------------------------------------------------------------------

    def open_session(
        self,
        at: float,
        reason: str,
        pid: int | None = None,
        argv: tuple[str, ...] | None = None,
    ) -> None:
        old = self.sess
        if old is not None:
            if old.stall is not None:
                self.clear_stall(at, "a new session started")
            self.clear_forecasts(at, "a new session started")
            past = (*self.get("past"), summarise(self.s, at))
            self.changes["past"] = past[-self.cfg.max_sessions :]
        total = self.get("sessions_total") + 1
        self.changes["sessions_total"] = total
        self.sess = Session(
            info=SessionInfo(id=total, reason=reason, started_at=at, pid=pid, argv=argv),
            life=SessionLife(phase_entered_at=at),
            log=SessionLog(last_event_at=at),
        )
        gpus = self.get("gpus")
        if any(g.fit is not None for g in gpus.values()):
            self.changes["gpus"] = {
                i: evolve(g, fit=None, projection=None) for i, g in gpus.items()
            }
        self.emit("session_started", at, reason=reason, phase_to="starting")

    def ensure_session(self, at: float) -> Session:
        if self.sess is None:
            self.open_session(at, "first_event")
        return self.s

    # -- phases ------------------------------------------------------------------------------

    def set_phase(self, to: str, at: float, reason: str, failure_kind: str | None = None) -> None:
        s = self.s
        if s.phase == to:
            return
        span = PhaseSpan(
            s.phase, s.phase_entered_at, at, s.failure_kind if s.phase == "failed" else None
        )
        history = (*s.history, span)[-self.cfg.max_phase_history :]
        kind = failure_kind if to == "failed" else s.failure_kind
        self.upd(phase=to, phase_entered_at=at, history=history, failure_kind=kind)
        self.emit(
            "phase",
            at,
            phase_from=s.phase,
            phase_to=to,
            reason=reason,
            failure_kind=kind if to == "failed" else None,
        )

    def live_phase(self) -> str:
        s = self.s
        return s.stall.resume_phase if s.stall is not None else s.phase

    def advance(self, to: str, at: float, reason: str) -> None:
        """Move forward to `to` if it is later than the live phase; reaching a later phase is
        progress, so it also ends a stall."""
        s = self.s
        if s.phase in TERMINAL or ORDER[to] <= ORDER.get(self.live_phase(), 0):
            return
        if s.stall is not None:
            self.clear_stall(at, reason)
        self.set_phase(to, at, reason)
        if to in ("post_load", "ready"):
            self.clear_forecasts(at, "weights loaded")

    def progressed(self, at: float, reason: str) -> None:
        """Weights progress: clears a stall and keeps the session in a live phase."""
        if self.s.stall is not None:
            self.clear_stall(at, reason)

    # -- stalls ------------------------------------------------------------------------------

    def clear_stall(self, at: float, reason: str) -> None:
        s = self.s
        st = s.stall
        if st is None:
            return
        self.upd(stall=None)
        self.emit("stall_cleared", at, reason=reason, since=st.since, duration_s=at - st.since)
        if s.phase == "stalled":
            self.set_phase(st.resume_phase, at, reason)

    def check_stall(self) -> None:
        s = self.sess
        if s is None:
            return
        due = stall_due(s, self.now, self.cfg)
        if due is None:
            return
        kind, last, threshold, expected = due
        now = self.now
        if kind == "progress":
            reason = f"no shard finished and no bytes read for {duration(now - last)}"
        else:
            reason = f"nothing logged and no bytes read for {duration(now - last)}"
        self.upd(
            stall=Stall(kind, last, now, threshold, expected, reason, s.phase),
            stalls_total=s.stalls_total + 1,
        )
        self.emit("stall_raised", now, reason=reason, since=last, threshold_s=threshold)
        self.set_phase("stalled", now, reason)

    # -- forecasts ---------------------------------------------------------------------------

    def clear_forecasts(self, at: float, reason: str) -> None:
        gpus = self.get("gpus")
        if not any(g.oom_since is not None for g in gpus.values()):
            return
        new = dict(gpus)
        for i, g in gpus.items():
            if g.oom_since is not None:
                new[i] = evolve(g, oom_since=None)
                self.emit(
                    "forecast_cleared", at, gpu_index=i, forecast="oom_predicted", reason=reason
                )
        self.changes["gpus"] = new


def stall_due(
    s: Session, now: float, cfg: StateConfig
) -> tuple[Literal["progress", "quiet"], float, float, float | None] | None:
    """A stall to raise at `now`: (kind, silent since, threshold, expected shard seconds)."""
    if s.stall is not None or s.phase in TERMINAL or s.phase == "ready":
        return None
    io_mark = s.io.mark_at if s.io is not None and s.io.mark_at is not None else 0.0
    bar = active_weights_bar(s) if s.phase == "loading_weights" else None
    if bar is not None:
        eta = bar.eta
        expected = eta.next_item_seconds() if eta is not None and eta.regime else None
        if expected is None:
            threshold = max(cfg.stall_first_shard_s, cfg.stall_floor_s)
        else:
            threshold = stall_threshold_s(expected, cfg.stall_k, cfg.stall_floor_s)
        last = max(bar.last_progress_at or bar.started_at, io_mark)
        kind: Literal["progress", "quiet"] = "progress"
    elif cfg.quiet_stall_s is not None:
        threshold, expected = cfg.quiet_stall_s, None
        last = max(s.last_event_at, io_mark)
        kind = "quiet"
    else:
        return None
    if now - last <= threshold:
        return None
    return kind, last, threshold, expected


# -- handlers -----------------------------------------------------------------------------------


def _bar_slot(s: Session, ev: ShardProgress) -> tuple[str, str | None, str | None]:
    """(the bar's slot, the key of the bar it continues, the slot it adopts a bar from).

    A slot is a process's bar of one kind and desc (two graph-capture bars with their own descs
    are two bars). A bar whose first updates carried no process (the prefix came in a record of
    its own later) is adopted by the first update that names one and continues it."""
    base = f"{ev.process or '-'}|{ev.bar}|{ev.desc}"
    key = s.bar_latest.get(base)
    if key is not None or ev.process is None:
        return base, key, None
    anon = f"-|{ev.bar}|{ev.desc}"
    anon_key = s.bar_latest.get(anon)
    b = s.bars.get(anon_key) if anon_key is not None else None
    if b is not None and b.finished_at is None and b.total == ev.total and ev.done >= b.done:
        return base, anon_key, anon
    return base, None, None


def _on_progress(f: Fold, ev: ShardProgress) -> None:
    t = f.at(ev.ts)
    s = f.ensure_session(t)
    changes: dict[str, Any]
    base, cur_key, adopted = _bar_slot(s, ev)
    cur = s.bars.get(cur_key) if cur_key is not None else None
    if cur is None or ev.done < cur.done or ev.total != cur.total:
        index = 0 if cur_key is None else int(cur_key.rsplit("|", 1)[1]) + 1
        key = f"{base}|{index}"
        started = t - ev.elapsed_s if ev.done > 0 and ev.elapsed_s is not None else t
        eta = None
        if ev.bar == "weights" and ev.total > 0:
            cum = f.get("cum_bytes")
            use = cum if index == 0 and cum is not None and len(cum) == ev.total + 1 else None
            eta = EtaState.start(t, ev.done, ev.total, use, ev.elapsed_s, f.cfg.eta)
        bar = BarTrack(
            key=key,
            process=ev.process,
            kind=ev.bar,
            desc=ev.desc,
            index=index,
            done=ev.done,
            total=ev.total,
            started_at=started,
            last_update_at=t,
            last_progress_at=t if ev.done > 0 else None,
            finished_at=t if ev.total > 0 and ev.done >= ev.total else None,
            updates=1,
            longest_gap_s=None,
            tqdm_remaining_s=ev.remaining_s,
            eta=eta,
        )
        bars = dict(s.bars)
        bars[key] = bar
        if len(bars) > f.cfg.max_bars:
            drop = min(
                (b for b in bars.values() if b.key != key),
                key=lambda b: (b.finished_at is None, b.last_update_at),
            )
            del bars[drop.key]
        changes = {"bars": bars, "bar_latest": {**s.bar_latest, base: key}}
        advanced = ev.done > 0
    else:
        advanced = ev.done > cur.done
        gap = cur.longest_gap_s
        if advanced:
            prev = cur.last_progress_at if cur.last_progress_at is not None else cur.started_at
            gap = max(gap or 0.0, t - prev)
        bar = evolve(
            cur,
            done=ev.done,
            last_update_at=t,
            last_progress_at=t if advanced else cur.last_progress_at,
            finished_at=cur.finished_at if cur.finished_at is not None or ev.done < ev.total else t,
            updates=cur.updates + 1,
            longest_gap_s=gap,
            tqdm_remaining_s=ev.remaining_s,
            eta=cur.eta.update(t, ev.done) if cur.eta is not None and advanced else cur.eta,
        )
        changes = {"bars": {**s.bars, cur.key: bar}}
        if adopted is not None:  # the bar drawn before its process was known is this one
            bar = evolve(bar, process=ev.process)
            latest = {k: v for k, v in s.bar_latest.items() if k != adopted}
            changes = {"bars": {**s.bars, cur.key: bar}, "bar_latest": {**latest, base: cur.key}}
    weights = ev.bar in ("weights", "prefetch")
    if weights and advanced:
        io = s.io
        changes["last_progress_at"] = t
        changes["io"] = evolve(io, line_bytes=io.last_bytes) if io is not None else None
    f.upd(last_event_at=t, log_seen=True, **changes)  # one copy of the session for all of it
    if advanced and f.s.stall is not None:
        f.progressed(t, f"{ev.desc}: {ev.done}/{ev.total}")
    if weights:
        f.advance("loading_weights", t, "weights bar")
        if (
            bar.kind == "weights"
            and bar.index == 0
            and all(
                b.finished_at is not None
                for b in f.s.bars.values()
                if b.kind == "weights" and b.index == 0
            )
        ):
            f.clear_forecasts(t, "weights loaded")
    else:
        if ev.bar == "graph_capture":
            f.advance("post_load", t, "graph capture")
        _activity(f, t)


def _warning_code(f: Fold, code: str) -> str:
    ws = f.s.warnings
    if code in ws or len(ws) < f.cfg.max_warning_codes:
        return code
    return "other"


def _tally(
    f: Fold,
    ev: Event,
    code: str,
    severity: str,
    message: str,
    layer: int | None = None,
    scale: str | None = None,
) -> None:
    t = f.at(ev.ts)
    s = f.ensure_session(t)
    if s.stall is not None and s.stall.kind == "quiet":
        _activity(f, t)
        s = f.s
    code = _warning_code(f, code)
    w = s.warnings.get(code)
    if w is None:
        w = WarningTally(code, severity, 0, t, t, 0, 0, frozenset(), frozenset(), message[:300])
    mask, over = w.layers_mask, w.layers_over
    if layer is not None:
        if 0 <= layer < f.cfg.max_layer:
            mask |= 1 << layer
        else:
            over += 1
    scales = w.scales
    if scale is not None and scale not in scales:
        scales = scales | {scale}
    procs = w.processes
    if ev.process and ev.process not in procs and len(procs) < f.cfg.max_processes:
        procs = procs | {ev.process}
    w = evolve(
        w,
        count=w.count + 1,
        last_at=t,
        layers_mask=mask,
        layers_over=over,
        scales=scales,
        processes=procs,
    )
    warnings = dict(s.warnings)
    warnings[code] = w
    f.upd(warnings=warnings, warnings_total=s.warnings_total + 1, last_event_at=t, log_seen=True)


def _activity(f: Fold, t: float) -> None:
    f.upd(last_event_at=t, log_seen=True)
    st = f.s.stall
    if st is not None and st.kind == "quiet":
        f.clear_stall(t, "log activity")


def _on_kv_scale(f: Fold, ev: KvScaleWarning) -> None:
    _tally(f, ev, "kv_scale_missing", "warning", ev.checkpoint_name or "", ev.layer, ev.scale)


def _on_scale_factor(f: Fold, ev: ScaleFactorWarning) -> None:
    _tally(f, ev, ev.code, "warning", ev.message)
    if ev.code == "kv_scale_default" and not f.s.kv.fp8_path:
        f.upd(kv=replace(f.s.kv, fp8_path=True))


def _on_log_warning(f: Fold, ev: LogWarning) -> None:
    _tally(f, ev, message_code("log", ev.message), "warning", ev.message)


def _on_log_error(f: Fold, ev: LogError) -> None:
    _tally(f, ev, message_code("error", ev.message), "error", ev.message)


def _on_stall_hint(f: Fold, ev: StallHint) -> None:
    t = f.at(ev.ts)
    f.ensure_session(t)
    _activity(f, t)
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
    _activity(f, t)
    s = f.s
    # (the engine config's detail is a value, the KV-cache dtype it names: not a sub-kind)
    key = ev.kind if ev.detail is None or ev.kind == "engine_config" else f"{ev.kind}.{ev.detail}"
    m = s.milestones.get(key)
    if m is None:
        m = MilestoneSeen(ev.kind, ev.detail, 0, t, t, None, None, None, None, None)
    m = evolve(
        m,
        count=m.count + 1,
        last_at=t,
        seconds=ev.seconds if ev.seconds is not None else m.seconds,
        gib=ev.gib if ev.gib is not None else m.gib,
        tokens=ev.tokens if ev.tokens is not None else m.tokens,
        blocks=ev.blocks if ev.blocks is not None else m.blocks,
        value=ev.value if ev.value is not None else m.value,
    )
    f.upd(milestones={**s.milestones, key: m})
    if ev.kind == "version" and ev.value:
        f.upd(version=ev.value)
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


def _shutdown(f: Fold, t: float, what: str) -> None:
    """vLLM says it is shutting down. Asked to (a signal, not a crash), what follows is not a
    failure: a clean SIGTERM still logs an EngineDeadError traceback."""
    if "signal=SIG" in what or "shutdown triggered" in what:
        f.upd(stop_requested=True)
    s = f.s
    if what == "Application shutdown complete" and s.phase not in TERMINAL:
        f.set_phase("stopped", t, "vLLM shut down" + (" on request" if s.stop_requested else ""))


def _ready(f: Fold, t: float, reason: str) -> None:
    s = f.s
    if s.phase in TERMINAL:
        return
    if s.ready_at is None:
        f.upd(ready_at=t)
    f.advance("ready", t, reason)


def _fatal(s: Session, ev: Failure) -> bool:
    if s.stop_requested:
        return False
    return ev.kind != "other" or s.ready_at is None


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
    _activity(f, t)
    s = f.s
    if shutdown_noise(ev, s.stop_requested):
        return  # the shutdown that was asked for, not a failure
    fatal = _fatal(s, ev)
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


def _on_process(f: Fold, ev: ProcessEvent) -> None:
    f.changes["supervisor"] = ev
    t = ev.ts
    s = f.sess
    if ev.kind == "started":
        argv = ev.argv or None
        if (
            s is not None
            and s.pid is None
            and s.reason != "process_start"
            and s.phase == "starting"
            and abs(t - s.started_at) <= f.cfg.adopt_window_s
        ):
            f.upd(pid=ev.pid, argv=argv)
        else:
            f.open_session(t, "process_start", ev.pid, argv)
        return
    if s is None or (ev.pid is not None and s.pid is not None and ev.pid != s.pid):
        return
    if ev.kind == "stopping":
        f.upd(stop_requested=True)
    elif ev.kind == "exited":
        if s.ended_at is not None:
            return
        f.upd(ended_at=t, exit_code=ev.exit_code, exit_signal=ev.signal)
        if s.stall is not None:
            f.clear_stall(t, "process exited")
        f.clear_forecasts(t, "process exited")
        s = f.s
        if s.phase == "failed":
            return
        if ev.signal is not None:
            how = f"killed by signal {ev.signal}"
        else:
            how = f"exited with code {ev.exit_code}"
        if s.stop_requested:
            f.set_phase("stopped", t, f"stopped on request, {how}")
        elif ev.exit_code == 0 and ev.signal is None:
            f.set_phase("stopped", t, how)
        else:
            f.set_phase("failed", t, ev.reason or how, failure_kind="exited")


def _on_health(f: Fold, ev: HealthProbe) -> None:
    f.changes["health"] = ev
    f.changes["health_failures"] = 0 if ev.ok else f.old.health_failures + 1
    s = f.sess
    if (
        ev.ok
        and s is not None
        and s.api_server_at is not None
        and ev.ts >= s.api_server_at
        and s.phase not in TERMINAL
    ):
        _ready(f, ev.ts, "health 200 after the API server started")


def _on_model(f: Fold, ev: ModelInfo) -> None:
    f.changes["model"] = ev
    cum = [0]
    for shard in ev.shards:
        cum.append(cum[-1] + max(shard.size_bytes, 0))
    table = tuple(cum) if ev.shards else None
    f.changes["cum_bytes"] = table
    s = f.sess
    if table is None or s is None:
        return
    # A bar that started before the model was read is weighed by bytes from now on.
    rebased = {
        k: evolve(b, eta=b.eta.with_sizes(table))
        for k, b in s.bars.items()
        if b.kind == "weights" and b.index == 0 and b.eta is not None and b.eta.cum is None
    }
    if rebased:
        f.upd(bars={**s.bars, **rebased})


def _on_io(f: Fold, ev: IoSample) -> None:
    s = f.sess
    if s is None or ev.read_bytes is None:
        return
    rb = ev.read_bytes
    io = s.io
    if io is None:
        f.upd(io=IoTrack(rb, ev.ts, rb, None, rb))
        return
    if rb < io.last_bytes:  # a process of the tree went away: start counting again from here
        f.upd(io=IoTrack(rb, ev.ts, rb, io.mark_at, rb))
        return
    if rb - io.mark_bytes >= f.cfg.io_progress_bytes:
        f.upd(io=evolve(io, last_bytes=rb, last_at=ev.ts, mark_bytes=rb, mark_at=ev.ts))
        st = f.s.stall
        if st is not None:
            f.clear_stall(ev.ts, "bytes read again")
    else:
        f.upd(io=evolve(io, last_bytes=rb, last_at=ev.ts))


def _on_gpu(f: Fold, ev: GpuReading) -> None:
    f.changes["gpu_source_up"] = ev.source_up
    f.changes["gpu_error"] = ev.error
    if not ev.samples and not ev.xids:
        return
    gpus = dict(f.get("gpus"))
    s = f.sess
    frac = None
    first = 0.0
    by_bytes = False
    if s is not None and f.live_phase() == "loading_weights":
        frac, first, by_bytes = main_fraction(s, ev.ts)
    mcfg = f.cfg.memory
    for sample in ev.samples:
        g = gpus.get(sample.index)
        g = GpuTrack(sample) if g is None else evolve(g, sample=sample)
        used, total = sample.memory_used_bytes, sample.memory_total_bytes
        if frac is not None and used is not None and sample.up:
            fit = g.fit or MemoryFit(skip_below=first, cfg=mcfg)
            fit = fit.add(frac, float(used))
            proj = fit.project()
            g = evolve(g, fit=fit, projection=proj)
            if proj is not None and total:
                if g.oom_since is None and by_bytes and proj.low_bytes > total * mcfg.raise_ratio:
                    g = evolve(g, oom_since=ev.ts)
                    f.emit(
                        "forecast_raised",
                        ev.ts,
                        gpu_index=sample.index,
                        forecast="oom_predicted",
                        reason="projected memory at 100% of the weights exceeds the GPU",
                        projected_bytes=proj.final_bytes,
                        total_bytes=total,
                        shortfall_bytes=proj.final_bytes - total,
                        fraction=frac,
                    )
                elif g.oom_since is not None and proj.final_bytes < total * mcfg.clear_ratio:
                    g = evolve(g, oom_since=None)
                    f.emit(
                        "forecast_cleared",
                        ev.ts,
                        gpu_index=sample.index,
                        forecast="oom_predicted",
                        reason="projection fits",
                        projected_bytes=proj.final_bytes,
                        total_bytes=total,
                    )
        gpus[sample.index] = g
    for x in ev.xids:
        g = gpus.get(x.gpu_index)
        if g is not None:
            gpus[x.gpu_index] = evolve(g, xids_total=g.xids_total + 1, last_xid=x.xid)
    f.changes["gpus"] = gpus


def _on_tick(f: Fold, ev: Tick) -> None:
    return None


# -- the common case without a Fold -----------------------------------------------------------

_new = object.__new__


def tally_fast(
    st: StateData, ev: Event, now: float, replay: bool = False, offset: float = 0.0
) -> Session | None:
    """The session after one more warning of a code it counts already, when nothing else
    changes: no new scale or process to note, no stall, the same replay state, no stall to
    raise. Exactly what `_tally` gives then, without the general machinery; None otherwise."""
    cls = type(ev)
    layer = scale = None
    if cls is KvScaleWarning:
        code = "kv_scale_missing"
        layer, scale = ev.layer, ev.scale  # type: ignore[attr-defined]
    elif cls is LogWarning:
        code = message_code("log", ev.message)  # type: ignore[attr-defined]
    elif cls is LogError:
        code = message_code("error", ev.message)  # type: ignore[attr-defined]
    elif cls is ScaleFactorWarning and ev.code != "kv_scale_default":  # type: ignore[attr-defined]
        code = ev.code  # type: ignore[attr-defined]  # (kv_scale_default also marks FP8)
    else:
        return None
    s = st.session
    if s is None:
        return None
    log = s.log
    cfg = st.config
    live = not replay
    if live:
        t = now
    else:  # as `Fold.at`
        t = log.last_event_at
        ts = ev.ts
        if ts is not None:
            if ts + offset > t:
                t = ts + offset
            if t > now:
                t = now
    life = s.life
    if life.stall is not None:
        return None
    warnings = log.warnings
    w = warnings.get(code)
    if w is None and len(warnings) >= cfg.max_warning_codes:
        code = "other"  # as `_warning_code`: past the cap every new code counts as "other"
        w = warnings.get(code)
    if w is None or (scale is not None and scale not in w.scales):
        return None
    p = ev.process
    if p and p not in w.processes and len(w.processes) < cfg.max_processes:
        return None
    mask, over = w.layers_mask, w.layers_over
    if layer is not None:
        if 0 <= layer < cfg.max_layer:
            mask |= 1 << layer
        else:
            over += 1
    # `evolve` inlined: three copies of a few fields each, for every warning line
    tally = _new(WarningTally)
    d = tally.__dict__
    d.update(w.__dict__)
    d["count"] = w.count + 1
    d["last_at"] = t
    d["layers_mask"] = mask
    d["layers_over"] = over
    warnings = dict(warnings)
    warnings[code] = tally
    new_log = _new(SessionLog)
    d = new_log.__dict__
    d.update(log.__dict__)
    d["warnings"] = warnings
    d["warnings_total"] = log.warnings_total + 1
    d["last_event_at"] = t
    new = _new(Session)
    d = new.__dict__
    d.update(s.__dict__)
    d["log"] = new_log
    if live and stall_due(new, now, cfg) is not None:
        return None
    return new


# Inputs that often change one counter of the session: tried before the general handler.
FAST: dict[type, Any] = {
    KvScaleWarning: tally_fast,
    ScaleFactorWarning: tally_fast,
    LogWarning: tally_fast,
    LogError: tally_fast,
}

HANDLERS: dict[type, Any] = {
    ShardProgress: _on_progress,
    KvScaleWarning: _on_kv_scale,
    ScaleFactorWarning: _on_scale_factor,
    LogWarning: _on_log_warning,
    LogError: _on_log_error,
    StallHint: _on_stall_hint,
    Milestone: _on_milestone,
    Failure: _on_failure,
    ProcessEvent: _on_process,
    HealthProbe: _on_health,
    ModelInfo: _on_model,
    IoSample: _on_io,
    GpuReading: _on_gpu,
    Tick: _on_tick,
}
