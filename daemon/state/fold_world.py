"""The fold's handlers of what the daemon observes besides the log: the supervisor's process
events, health probes, the model's checkpoint, bytes read, GPU readings, orphan checks, ticks."""

from __future__ import annotations

from typing import Any

from loadwatch.daemon.sources.inputs import (
    CompletionProbe,
    GpuReading,
    HealthProbe,
    IoSample,
    LoggedProcessSeen,
    ModelInfo,
    OrphanCheck,
    PageCache,
    ProcessEvent,
)
from loadwatch.daemon.state.fold import Fold
from loadwatch.daemon.state.fold_failure import corroborate, on_failure
from loadwatch.daemon.state.fold_log import ready
from loadwatch.daemon.state.memfit import MemoryFit
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import (
    TERMINAL,
    GpuTrack,
    IoTrack,
    main_fraction,
)
from loadwatch.daemon.state.timeline import served
from loadwatch.parsers.events import Failure


def _on_process(f: Fold, ev: ProcessEvent) -> None:
    f.changes["supervisor"] = ev
    t = ev.ts
    s = f.sess
    if ev.kind == "exited":
        f.count("vllm_exits", ev.outcome)  # (every run's, whatever session it was)
    if ev.kind == "started":
        f.changes["vllm_started_at"] = t
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
        if corroborate(f, t, f"then vLLM {how}"):
            return  # (vLLM exits with code 0 when its engine died while serving)
        if s.stop_requested:
            f.set_phase("stopped", t, f"stopped on request, {how}")
        elif ev.exit_code == 0 and ev.signal is None:
            f.set_phase("stopped", t, how)
        else:
            f.set_phase("failed", t, ev.reason or how, failure_kind="exited")


def _on_health(f: Fold, ev: HealthProbe) -> None:
    f.changes["health"] = ev
    f.changes["health_failures"] = 0 if ev.ok else f.get("health_failures") + 1
    s = f.sess
    if (
        ev.ok
        and s is not None
        and s.api_server_at is not None
        and ev.ts >= s.api_server_at
        and s.phase not in TERMINAL
    ):
        ready(f, ev.ts, "health 200 after the API server started")
    failures = f.get("health_failures")
    if not ev.ok and s is not None and failures >= f.cfg.health_failures_not_ready:
        corroborate(f, ev.ts, f"then /health failed {failures} times in a row")


def _on_completion(f: Fold, ev: CompletionProbe) -> None:
    """The servable check answered: a failure is one of its own kind (the engine answers
    /health and cannot serve: a broken kernel, a bad patch of the config)."""
    if f.sess is None:
        return
    f.upd(completion=ev)  # (also once failed: the engine may die of the request, and say so)
    if ev.ok:
        f.upd(timeline=served(f.s.timeline, ev.ts))
    if not ev.ok:
        why = ev.error or "failed"
        model = f" (model {ev.model})" if ev.model else ""
        message = f"the first completion failed: {why}{model}"
        on_failure(f, Failure(kind="completion_failed", message=message, ts=ev.ts))


def _on_logged_process(f: Fold, ev: LoggedProcessSeen) -> None:
    """Watch mode: the vLLM process the log named, as /proc shows it on this host.

    Gone with no stop asked for and no shutdown line (SIGKILL, the OOM killer: they leave no
    line), the session fails as `vanished`; after vLLM's shutdown lines it stopped."""
    s = f.sess
    if s is None:
        return
    if ev.alive:
        if s.argv is None and ev.argv:
            f.upd(argv=ev.argv)  # the live argv: --kv-cache-dtype and the model path
        if not s.seen_live:
            f.upd(seen_live=True)
        return
    if s.phase in TERMINAL:
        return
    t = ev.ts
    f.upd(ended_at=t)
    if ev.was_seen:
        gone = f"vLLM process {ev.pid} is gone"
    else:
        gone = f"vLLM process {ev.pid} is not running here and /health fails"
    if corroborate(f, t, f"then {gone}"):
        return
    f.clear_forecasts(t, "process gone")
    if f.s.stall is not None:
        f.clear_stall(t, "process gone")
    s = f.s
    if s.stop_requested:
        f.set_phase("stopped", t, f"{gone}, stopped on request")
    elif "shutdown" in s.milestones:
        f.set_phase("stopped", t, f"{gone} after its shutdown lines")
    else:
        f.set_phase(
            "failed",
            t,
            f"{gone}, with no shutdown line and no stop asked for (killed: SIGKILL or the "
            "OOM killer leave no line)",
            failure_kind="vanished",
        )


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
        k: evolve(b, eta=b.eta.with_sizes(table), sizes_from="model_dir")
        for k, b in s.bars.items()
        if b.kind == "weights"
        and b.unit in ("files", "items")
        and b.index == 0
        and b.eta is not None
        and b.eta.cum is None
        and len(table) == b.eta.total_items + 1
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
        cc = sample.compute_capability
        if g is None:
            g = GpuTrack(sample, compute_capability=cc)
        else:
            g = evolve(g, sample=sample, compute_capability=cc or g.compute_capability)
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
        f.count("xids", (x.gpu_index, ev.uuid_of(x), x.xid))
        g = gpus.get(x.gpu_index)
        if g is not None:
            gpus[x.gpu_index] = evolve(g, last_xid=x.xid)
    f.changes["gpus"] = gpus


def _on_page_cache(f: Fold, ev: PageCache) -> None:
    """The model's page cache as the start began (looked at before it loads: aftercare.py),
    kept once."""
    s = f.sess
    model = f.get("model")
    if s is None or s.id != ev.session or s.page_cache is not None:
        return
    if model is None or model.path != ev.model:
        return
    f.upd(page_cache=ev.state)


def _on_orphans(f: Fold, ev: OrphanCheck) -> None:
    f.changes["orphans"] = ev.leaked


WORLD_HANDLERS: dict[type, Any] = {
    ProcessEvent: _on_process,
    HealthProbe: _on_health,
    CompletionProbe: _on_completion,
    LoggedProcessSeen: _on_logged_process,
    ModelInfo: _on_model,
    IoSample: _on_io,
    GpuReading: _on_gpu,
    OrphanCheck: _on_orphans,
    PageCache: _on_page_cache,
}
