"""The snapshot builder: from a `LoadState` to the immutable `Snapshot` exporters read.

Costs O(size of the state), which is bounded; the daemon's loop takes one at its publishing
cadence, not per input. ETA and ages are computed for the `now` given.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadwatch.daemon.state.failures import session_kind
from loadwatch.daemon.state.fold import stall_watch
from loadwatch.daemon.state.kvdtype import KvDtype, KvEvidence, decide_kv_dtype, warning_verdict
from loadwatch.daemon.state.learned import comparable, start_key, startup_eta
from loadwatch.daemon.state.nodefold import node_view
from loadwatch.daemon.state.plan_actual import memory_plan_view
from loadwatch.daemon.state.session import (
    ORDER,
    BarTrack,
    GpuTrack,
    Session,
    StateData,
    failure_rank,
    io_since_line,
    stage_bars,
    weights_load_s,
)
from loadwatch.daemon.state.snapshot import (
    SCHEMA,
    BarView,
    EchoView,
    EpFilterView,
    EtaView,
    FailureView,
    GpuView,
    HealthView,
    KvCacheView,
    MilestoneView,
    ModelView,
    PhaseSpanView,
    ProgressView,
    SessionView,
    Snapshot,
    StallView,
    SupervisorView,
    WarningView,
)
from loadwatch.daemon.state.timeline import timeline_view


def _layers(mask: int, cap: int = 512) -> tuple[int, ...]:
    out: list[int] = []
    n = 0
    while mask and len(out) < cap:
        low = mask & -mask
        n = low.bit_length() - 1
        out.append(n)
        mask ^= low
    return tuple(out)


def _progress_view(state: StateData, s: Session, now: float) -> ProgressView:
    bars = stage_bars(s)
    io = s.io
    read = io.last_bytes if io is not None else None
    if not bars:
        return ProgressView(0, None, None, None, None, None, s.last_progress_at, read, None)
    stage = bars[0].index
    done = min(b.done for b in bars)
    total = max(b.total for b in bars)
    since = io_since_line(s)
    ratio: float | None = None
    etas = []
    bytes_done = bytes_total = None
    for b in bars:
        eta = b.eta
        if eta is None:
            continue
        r = 1.0 if b.finished_at is not None else eta.position(now, since) / max(eta.total, 1e-9)
        ratio = r if ratio is None else min(ratio, r)
        est = eta.estimate(now, since)
        if est is not None:
            etas.append(est)
        if eta.cum is not None or b.unit == "bytes":
            bd = eta.cum[min(b.done, eta.total_items)] if eta.cum is not None else b.done
            bytes_done = bd if bytes_done is None else min(bytes_done, bd)
            bytes_total = eta.cum[-1] if eta.cum is not None else b.total
    eta_view = None
    if etas and len(etas) == len([b for b in bars if b.eta is not None]):
        e = max(etas, key=lambda x: x.remaining_s)
        eta_view = EtaView(
            remaining_s=e.remaining_s,
            low_s=e.low_s,
            high_s=e.high_s,
            finish_at=now + e.remaining_s,
            finish_low_at=now + e.low_s,
            finish_high_at=now + e.high_s,
            rate_per_s=e.rate_per_s,
            units="bytes" if all(b.unit == "bytes" for b in bars) else e.units,
            inputs=eta_inputs(s, bars),
        )
    return ProgressView(
        stage, done, total, bytes_done, bytes_total, ratio, s.last_progress_at, read, eta_view
    )


def _bar_view(b: BarTrack) -> BarView:
    rate = None
    if b.last_progress_at is not None and b.last_progress_at > b.started_at:
        rate = b.done / (b.last_progress_at - b.started_at)
    return BarView(
        key=b.key,
        process=b.process,
        kind=b.kind,
        desc=b.desc,
        index=b.index,
        done=b.done,
        total=b.total,
        started_at=b.started_at,
        last_update_at=b.last_update_at,
        last_progress_at=b.last_progress_at,
        finished_at=b.finished_at,
        rate_per_s=rate,
        longest_gap_s=b.longest_gap_s,
        updates=b.updates,
        tqdm_remaining_s=b.tqdm_remaining_s,
        unit=b.unit,
        sizes_from=b.sizes_from,
    )


def eta_inputs(s: Session, bars: Sequence[BarTrack]) -> tuple[str, ...]:
    """What the weights ETA rests on, said once here for every exporter."""
    out: list[str] = []
    for b in bars:
        if b.eta is None:
            continue
        if b.unit == "bytes":
            out.append(f"{b.desc}: the bar counts bytes")
        elif b.sizes_from == "model_dir":
            out.append(f"{b.desc}: {b.total} files weighed by the model directory's shard sizes")
        elif b.sizes_from == "checkpoint_size":
            gib = b.eta.total / 2**30
            out.append(
                f"{b.desc}: the log's checkpoint size ({gib:.2f} GiB) divided evenly over "
                f"{b.total} files (no model directory)"
            )
        else:
            out.append(f"{b.desc}: the bar counts {b.unit}, each weighed the same")
    ep = s.ep_filter
    if ep is not None:
        out.append(
            f"EP weight filter on (ep_size={ep.ep_size}, ep_rank={ep.ep_rank}, loading "
            f"{ep.experts_loaded}/{ep.experts_total} experts): the bar still counts every "
            "shard, but a shard costs far less than its size, so the rate can jump"
        )
    return tuple(out)


def _session_view(state: StateData, s: Session, now: float, kv: KvDtype) -> SessionView:
    history = (
        *(
            PhaseSpanView(
                h.phase, h.entered_at, h.left_at, h.left_at - h.entered_at, h.failure_kind
            )
            for h in s.history
        ),
        PhaseSpanView(
            s.phase,
            s.phase_entered_at,
            None,
            max(now - s.phase_entered_at, 0.0),
            s.failure_kind if s.phase == "failed" else None,
        ),
    )
    st = s.stall
    past = comparable(state.config.history, start_key(state.model, state.gpus, s))
    # Raised, the stall's own figures; still loading, those the stall check measures now, so
    # the silence and the threshold it is held against are there before a stall is.
    watch = st if st is not None else stall_watch(s, state.config, past)
    stall = StallView(
        active=st is not None,
        kind=st.kind if st else None,
        since=st.since if st else None,
        raised_at=st.raised_at if st else None,
        silent_s=max(now - watch.since, 0.0) if watch else None,
        threshold_s=watch.threshold_s if watch else None,
        expected_shard_s=watch.expected_shard_s if watch else None,
        reason=st.reason if st else None,
        stalls_total=s.stalls_total,
        hints=s.stall_hints,
        last_hint_s=s.last_hint_s,
    )
    warnings = []
    for w in sorted(s.warnings.values(), key=lambda w: (-w.count, w.code)):
        verdict, reason = warning_verdict(w.code, kv)
        warnings.append(
            WarningView(
                code=w.code,
                severity=w.severity,
                count=w.count,
                verdict=verdict,
                reason=reason,
                layers=_layers(w.layers_mask),
                layer_count=w.layers_mask.bit_count(),
                scales=tuple(sorted(w.scales)),
                processes=tuple(sorted(w.processes)),
                first_at=w.first_at,
                last_at=w.last_at,
                sample=w.sample,
            )
        )
    failures = tuple(
        FailureView(
            kind=x.kind,
            exc_type=x.exc_type,
            message=x.message,
            first_line=x.first_line,
            count=x.count,
            fatal=x.fatal,
            first_at=x.first_at,
            last_at=x.last_at,
            processes=tuple(sorted(x.processes)),
            offset=x.offset,
            echoes=x.echoes,
            evidence=tuple(
                EchoView(e.offset, e.exc_type, e.message, e.process) for e in x.evidence
            ),
        )
        for x in sorted(s.failures.values(), key=lambda x: (failure_rank(x.kind), x.first_at))
    )
    milestones = tuple(
        MilestoneView(
            key=k,
            kind=m.kind,
            detail=m.detail,
            count=m.count,
            first_at=m.first_at,
            last_at=m.last_at,
            seconds=m.seconds,
            gib=m.gib,
            tokens=m.tokens,
            blocks=m.blocks,
            value=m.value,
        )
        for k, m in sorted(s.milestones.items(), key=lambda kv_: kv_[1].first_at)
    )
    bars = tuple(_bar_view(b) for b in sorted(s.bars.values(), key=lambda b: b.started_at))
    progress = _progress_view(state, s, now)
    eta, no_eta = startup_eta(past, s, now, progress.eta)
    return SessionView(
        id=s.id,
        reason=s.reason,
        pid=s.pid,
        started_at=s.started_at,
        version=s.version,
        phase=s.phase,
        phase_entered_at=s.phase_entered_at,
        phase_age_s=max(now - s.phase_entered_at, 0.0),
        failure_kind=s.failure_kind,
        stop_requested=s.stop_requested,
        ended_at=s.ended_at,
        exit_code=s.exit_code,
        exit_signal=s.exit_signal,
        ready_at=s.ready_at,
        time_to_ready_s=s.ready_at - s.started_at if s.ready_at is not None else None,
        weights_load_s=weights_load_s(s),
        server_pid=s.server_pid,
        first_completion_s=s.completion.latency_s
        if s.completion is not None and s.completion.ok
        else None,
        verdict=session_verdict(s),
        reached=reached(s),
        history=history,
        progress=progress,
        bars=bars,
        stall=stall,
        warnings=tuple(warnings),
        warnings_total=s.warnings_total,
        failures=failures,
        failures_total=s.failures_total,
        milestones=milestones,
        ep_weight_filter=EpFilterView(**vars(s.ep_filter)) if s.ep_filter is not None else None,
        timeline=timeline_view(s.timeline, s.bars, now),
        startup_eta=eta,
        startup_eta_reason=no_eta,
    )


def _gpu_view(g: GpuTrack, xids: int) -> GpuView:
    x = g.sample
    p = g.projection
    total = x.memory_total_bytes
    return GpuView(
        index=x.index,
        uuid=x.uuid,
        name=x.name,
        health=x.health,
        memory_used_bytes=x.memory_used_bytes,
        memory_total_bytes=total,
        utilization_ratio=x.utilization_ratio,
        temperature_celsius=x.temperature_celsius,
        power_watts=x.power_watts,
        sampled_at=x.sampled_at,
        error=x.error,
        xids_total=xids,
        last_xid=g.last_xid,
        projected_final_bytes=p.final_bytes if p else None,
        projected_low_bytes=p.low_bytes if p else None,
        projected_high_bytes=p.high_bytes if p else None,
        oom_predicted=g.oom_since is not None,
        shortfall_bytes=p.final_bytes - total if p and total and g.oom_since is not None else None,
        oom_predicted_since=g.oom_since,
    )


def xids_of(state: StateData, index: int) -> int:
    """Xid errors of GPU `index`, all codes."""
    return sum(n for (i, _, _), n in state.xids.items() if i == index)


CRASH_LOOP_FAILURES = 3  # sessions that failed within the window: vLLM is crash looping...
CRASH_LOOP_WINDOW_S = 1800.0  # ...as the LoadwatchVllmCrashLooping alert counts (30 minutes)


def liveness(state: StateData, now: float) -> tuple[bool, str | None]:
    """Whether vLLM is worth keeping: what /livez says, so a kubelet never kills a load that
    progresses and kills one that stopped. Not live: the load stalled (raised by the stall
    policy, [forecast]), the session failed with no restart of the supervisor's coming, the
    supervisor gave up, or sessions keep failing (crash loop). Before any session, live."""
    s = state.session
    sup = state.supervisor
    if sup is not None and sup.kind == "fatal":
        return False, f"the supervisor gave up: {sup.reason or 'fatal'}"
    failed = [p.ended_at for p in state.past if p.phase == "failed" and p.ended_at is not None]
    if s is not None and s.phase == "failed":
        failed.append(s.ended_at if s.ended_at is not None else s.phase_entered_at)
    recent = [t for t in failed if now - t <= CRASH_LOOP_WINDOW_S]
    if len(recent) >= CRASH_LOOP_FAILURES:
        return False, f"crash looping: {len(recent)} sessions failed in {CRASH_LOOP_WINDOW_S:.0f} s"
    if s is None:
        return True, None
    if s.stall is not None:
        return False, f"stalled for {max(now - s.stall.since, 0.0):.0f} s: {s.stall.reason}"
    if s.phase == "failed" and not (sup is not None and sup.kind in ("backoff", "started")):
        return False, f"failed: {s.failure_kind or 'unknown'}"
    return True, None


def readiness(state: StateData) -> str | None:
    """Why vLLM is not ready (what /readyz says with its 503), or None when it is: the phase is
    ready and was seen live (a session read back ready, after a restart, waits for a live
    /health answer or its process seen here), no fatal failure is being held for its echoes,
    /health has not failed `health_failures_not_ready` times in a row since, and, when the
    servable check is on, one completion succeeded."""
    s = state.session
    if s is None:
        return "not ready: no vLLM session yet"
    if s.failing is not None:
        kind = session_kind(s.failures) or "failure"
        return f"not ready: failing ({kind}; the crash's last lines are read first)"
    if s.phase != "ready":
        return f"not ready: {s.phase}"
    if not s.seen_live:
        return "not ready: ready in the log read back, waiting for a live /health answer"
    h = state.health
    n = state.config.health_failures_not_ready
    if h is not None and not h.ok and state.health_failures >= n:
        return f"not ready: /health failed {state.health_failures} times in a row ({h.error})"
    if state.config.require_completion and (s.completion is None or not s.completion.ok):
        return "not ready: waiting for the first completion"
    return None


def reached(s: Session) -> str:
    """The furthest phase of the load order the session got to."""
    best = max((ORDER.get(p, 0) for p in (*(h.phase for h in s.history), s.phase)), default=0)
    return next(p for p, i in ORDER.items() if i == best)


def session_verdict(s: Session) -> str:
    """failed (whenever it failed, even after it was ready), ready (it was, and did not fail:
    it may have stopped since), or incomplete."""
    if s.phase == "failed":
        return "failed"
    return "ready" if s.ready_at is not None else "incomplete"


def session_kv_dtype(state: StateData, s: Session | None) -> KvDtype:
    """The session's KV-cache dtype from everything known (kvdtype.decide_kv_dtype)."""
    if s is None:
        return decide_kv_dtype(None, KvEvidence(), state.model, None)
    passed = "version" in s.milestones and (
        "model_load_start" in s.milestones or any(b.kind == "weights" for b in s.bars.values())
    )
    return decide_kv_dtype(s.argv, s.kv, state.model, s.version, passed)


def build_snapshot(state: StateData, now: float) -> Snapshot:
    s = state.session
    kv = session_kv_dtype(state, s)
    m = state.model
    sup = state.supervisor
    h = state.health
    live, not_live = liveness(state, now)
    not_ready = readiness(state)
    sv = _session_view(state, s, now, kv) if s is not None else None
    return Snapshot(
        schema=SCHEMA,
        at=now,
        phase=s.phase if s is not None else None,
        ready=not_ready is None,
        not_ready=not_ready,
        live=live,
        not_live=not_live,
        restarts=state.restarts,
        sessions_total=state.sessions_total,
        client_text=state.client_text,
        session=sv,
        sessions=state.past,
        model=ModelView(m.path, len(m.shards), m.total_bytes, m.checkpoint_kv_dtype, m.errors)
        if m is not None
        else None,
        kv_cache=KvCacheView(kv.dtype, kv.quantized, kv.source, kv.reason),
        memory_plan=memory_plan_view(state, s, kv),
        gpu_source_up=state.gpu_source_up,
        gpu_error=state.gpu_error,
        gpus=tuple(_gpu_view(state.gpus[i], xids_of(state, i)) for i in sorted(state.gpus)),
        supervisor=SupervisorView(
            sup.kind, sup.ts, sup.pid, sup.exit_code, sup.signal, sup.reason, sup.backoff_s
        )
        if sup is not None
        else None,
        health=HealthView(h.ok, h.ts, h.status, h.error, state.health_failures)
        if h is not None
        else None,
        node=node_view(state, s, now, sv.progress.eta if sv is not None else None),
    )
