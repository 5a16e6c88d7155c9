"""The fold's handlers of log events: bars, warnings, milestones, failures (see fold.py's `Fold`).

Each reads its event and calls the fold's verbs; k/v scale warnings back to back (most of a
load's records) are counted as a run, in one call (`on_kv_run`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from loadwatch.daemon.state.fold import Fold, settle_failure
from loadwatch.daemon.state.forecast import EtaState, eta_update
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import (
    LOADING_MILESTONES,
    POST_LOAD_MILESTONES,
    TERMINAL,
    BarTrack,
    EpFilterSeen,
    MilestoneSeen,
    Session,
    WarningTally,
)
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


def _sizes(f: Fold, s: Session, ev: ShardProgress) -> tuple[tuple[int, ...] | None, str | None]:
    """The bytes of the first n files of a weights bar counting files, n = 0..total: the model
    directory's shard sizes, else vLLM's `Checkpoint size: N GiB` (PR #39422) divided evenly
    over the files (the ETA then weighs what is left by bytes as with a model directory)."""
    if ev.unit in ("bytes", "tensors"):  # bytes count themselves; tensors have no sizes here
        return None, None
    cum = f.get("cum_bytes")
    if cum is not None and len(cum) == ev.total + 1:
        return cum, "model_dir"
    ck = s.milestones.get("checkpoint_info")
    if cum is None and ck is not None and ck.gib and ev.total <= MAX_EVEN_FILES:
        total = ck.gib * 2**30
        return tuple(round(total * i / ev.total) for i in range(ev.total + 1)), "checkpoint_size"
    return None, None


def _on_ep_filter(f: Fold, ev: EpWeightFilter) -> None:
    """`EP weight filter: ...`: this rank reads its own experts only (the ETA's inputs say so)."""
    t = f.at(ev.ts)
    f.ensure_session(t)
    activity(f, t)
    seen = EpFilterSeen(ev.ep_size, ev.ep_rank, ev.experts_loaded, ev.experts_total, t, ev.process)
    f.upd(ep_filter=seen)
    f.advance("loading_weights", t, "ep weight filter")


def _tqdm_item_s(ev: ShardProgress) -> float | None:
    """Seconds per file by the bar's own numbers (a duration, never a stamp), or None: a bar
    counting bytes has no files to time, and one before its first file has no rate yet."""
    if ev.unit == "bytes" or ev.done <= 0:
        return None
    if ev.rate_per_s is not None and ev.rate_per_s > 0:
        return 1.0 / ev.rate_per_s
    if ev.elapsed_s is not None and ev.elapsed_s > 0:
        return ev.elapsed_s / ev.done
    return None


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
        sizes_from = None
        if ev.bar == "weights" and ev.total > 0:
            use, sizes_from = _sizes(f, s, ev) if index == 0 else (None, None)
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
            unit=ev.unit,
            sizes_from=sizes_from,
            tqdm_item_s=_tqdm_item_s(ev),
        )
        bars = dict(s.bars)
        bars[key] = bar
        latest = {**s.bar_latest, base: key}
        if len(bars) > f.cfg.max_bars:
            drop = min(
                (b for b in bars.values() if b.key != key),
                key=lambda b: (b.finished_at is None, b.last_update_at),
            )
            del bars[drop.key]
            # a slot whose bar is gone names nothing: kept, one per process ever seen, it grew
            # (and was copied) without bound
            latest = {k: v for k, v in latest.items() if v in bars}
        changes = {"bars": bars, "bar_latest": latest}
        advanced = ev.done > 0
    else:
        advanced = ev.done > cur.done
        gap = cur.longest_gap_s
        if advanced:
            prev = cur.last_progress_at if cur.last_progress_at is not None else cur.started_at
            gap = max(gap or 0.0, t - prev)
        bars = f.mine("bars")
        bar = bars[cur.key] = f.mine_record(cur)
        d = bar.__dict__
        d["done"] = ev.done
        d["last_update_at"] = t
        if advanced:
            d["last_progress_at"] = t
        if cur.finished_at is None and ev.done >= ev.total:
            d["finished_at"] = t
        d["updates"] = cur.updates + 1
        d["longest_gap_s"] = gap
        d["tqdm_remaining_s"] = ev.remaining_s
        item_s = _tqdm_item_s(ev)
        if item_s is not None:
            d["tqdm_item_s"] = item_s
        if cur.eta is not None and advanced:
            d["eta"] = eta_update(cur.eta, t, ev)
        changes = {}
        if adopted is not None:  # the bar drawn before its process was known is this one
            d["process"] = ev.process
            latest = {k: v for k, v in s.bar_latest.items() if k != adopted}
            changes = {"bar_latest": {**latest, base: cur.key}}
    weights = ev.bar in ("weights", "prefetch")
    if weights and advanced:
        io = s.io
        changes["last_progress_at"] = t
        changes["io"] = evolve(io, line_bytes=io.last_bytes) if io is not None else None
    sd = f.draft().__dict__
    sd["last_event_at"] = t
    sd["log_seen"] = True
    if changes:
        sd.update(changes)
    if advanced and f.s.stall is not None:
        f.progressed(t, f"{ev.desc}: {ev.done}/{ev.total}")
    if weights:
        f.advance("loading_weights", t, "weights bar")
        if (
            bar.finished_at is not None  # (else this bar is one of those not finished)
            and bar.kind == "weights"
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
        activity(f, t)


def _tally(
    f: Fold, evs: Sequence[Event], code: str, severity: str, message: str, kv: bool = False
) -> None:
    """Count the warnings `evs` of `code`: one record's, or a run of records back to back (a
    load's per-layer k/v scale warnings: `kv`, with their layers and scales), exactly as one at
    a time would, in one call."""
    t = f.at(evs[0].ts)
    s = f.ensure_session(t)
    if s.stall is not None and s.stall.kind == "quiet":
        activity(f, t)
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


def activity(f: Fold, t: float) -> None:
    f.upd(last_event_at=t, log_seen=True)
    st = f.s.stall
    if st is not None and st.kind == "quiet":
        f.clear_stall(t, "log activity")


def on_kv_run(f: Fold, run: Sequence[KvScaleWarning]) -> None:
    """k/v scale warnings back to back (a load prints one per layer and worker)."""
    _tally(f, run, "kv_scale_missing", "warning", run[0].checkpoint_name or "", kv=True)


def _on_kv_scale(f: Fold, ev: KvScaleWarning) -> None:
    on_kv_run(f, (ev,))


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
    activity(f, t)
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
    activity(f, t)
    s = f.s
    # (the engine config's detail is a value, the KV-cache dtype it names: not a sub-kind)
    key = ev.kind if ev.detail is None or ev.kind == "engine_config" else f"{ev.kind}.{ev.detail}"
    m = s.milestones.get(key)
    if m is None:
        m = MilestoneSeen(
            ev.kind, ev.detail, 1, t, t, ev.seconds, ev.gib, ev.tokens, ev.blocks, ev.value
        )
    else:  # each value the latest the milestone gave, but the API server's URL: the first
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
            # (vLLM prints it before it serves, so no client's text comes first; the daemon
            # probes it: a later line of the same shape must not move the probes)
            m.value
            if ev.value is None or (ev.kind == "api_server_start" and m.value is not None)
            else ev.value,
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
        ready(f, t, "application startup complete")
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
        f.upd(ready_at=t)
    f.advance("ready", t, reason)


# Every log event type and its handler. Their transitions carry the record's offset.
LOG_HANDLERS: dict[type, Any] = {
    ShardProgress: _on_progress,
    KvScaleWarning: _on_kv_scale,
    ScaleFactorWarning: _on_scale_factor,
    LogWarning: _on_log_warning,
    LogError: _on_log_error,
    StallHint: _on_stall_hint,
    Milestone: _on_milestone,
    EpWeightFilter: _on_ep_filter,
    ClientText: _on_client_text,
}
