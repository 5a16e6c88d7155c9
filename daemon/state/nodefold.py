"""Folds the node's facts (node.py) and its bar-less progress (nodeprogress.py) from the inputs
the state already takes, beside the session's own fold: one call per input from
`LoadState.apply_run`, changing only the `node` and `node_load` fields of the state, and the
session's record of each process's lines (ranks.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

from loadwatch.daemon.sources.inputs import GpuReading, IoSample, ModelInfo, ProcessEvent
from loadwatch.daemon.state.node import NodeFacts, role_view
from loadwatch.daemon.state.nodeprogress import NodeLoad, NodeProgressView, progress_view
from loadwatch.daemon.state.ranks import track_process
from loadwatch.daemon.state.snapshot import NodeView
from loadwatch.parsers.events import (
    Event,
    Failure,
    KvScaleWarning,
    LogError,
    LogWarning,
    Milestone,
    NodeLaunch,
    ParallelInit,
    ScaleFactorWarning,
    ShardProgress,
    StallHint,
)

if TYPE_CHECKING:
    from loadwatch.daemon.state.fold import Fold

LOAD_PHASES: Final = ("starting", "loading_weights", "stalled")
MAX_PIDS: Final = 64  # vLLM processes remembered from the log's prefixes


def on_node_event(f: Fold, ev: Event) -> None:
    """The handler of the node-only events: they open a session like any log event (a
    headless node's log may hold nothing else before its load)."""
    f.ensure_session(f.at(ev.ts))


NODE_EVENTS: dict[type, Any] = {ParallelInit: on_node_event, NodeLaunch: on_node_event}


def _load(f: Fold) -> NodeLoad:
    load: NodeLoad = f.get("node_load")
    sid = f.sess.id if f.sess is not None else None
    if load.session != sid:
        load = load.restart(sid, f.now)
    return load


# Log events whose only bearing on the node is their process and pid: of a run of them, the
# first of each (process, pid, session) is looked at, the rest change nothing.
_PLAIN: Final = frozenset(
    {KvScaleWarning, ScaleFactorWarning, LogWarning, LogError, ShardProgress, StallHint, Failure}
)


def _known(f: Fold, process: str | None, pid: int | None, sid: int | None) -> bool:
    """Whether the node has this process and pid already (an earlier run saw them): what
    `track_node` would then do for a plain event is nothing."""
    ray = process is not None and process.startswith("RayWorker")
    if ray and not f.get("node").ray:
        return False
    if pid is not None and sid is not None and not ray and pid not in f.get("node_pids"):
        return False
    return bool(f.get("node_load").session == sid)


def track_tick(f: Fold, tick: Any) -> None:
    """`track_node` of a tick, which holds no fact: the node's load starts again when the
    session is new to it (`_load`), else nothing changes (analyze ticks each second)."""
    sid = f.sess.id if f.sess is not None else None
    if f.get("node_load").session != sid:
        track_node(f, tick)


def track_node(f: Fold, item: Any, lines: bool = True) -> None:
    """Update the node's record for one input (after the session's handler ran), and its
    process's lines (ranks.py; `lines=False`: the caller notes them for a whole run)."""
    if lines and isinstance(item, Event):
        track_process(f, item)
    if type(item) in _PLAIN:
        sid = f.sess.id if f.sess is not None else None
        key = (item.process, item.pid, sid)
        seen = f.node_seen
        if key in seen:
            return
        seen.add(key)
        if _known(f, item.process, item.pid, sid):
            return
    facts: NodeFacts = f.get("node")
    new_facts = facts
    if isinstance(item, Event):
        new_facts = facts.with_process(item.process)
        if isinstance(item, ParallelInit):
            new_facts = new_facts.with_rank(
                item.world_size, item.rank, item.local_rank, item.backend, item.init_method
            )
        elif isinstance(item, NodeLaunch):
            new_facts = new_facts.with_launch(item.mode, item.head_address, item.engines)
        # Ray's remote actors' lines reach the head's log with their own hosts' pids
        remote = item.process is not None and item.process.startswith("RayWorker")
        if item.pid is not None and f.sess is not None and not remote:
            pids: tuple[int, ...] = f.get("node_pids")
            if item.pid not in pids:
                f.changes["node_pids"] = (*pids, item.pid)[-MAX_PIDS:]
    elif isinstance(item, ProcessEvent) and item.kind == "started" and item.argv:
        new_facts = facts.with_argv(item.argv)
    if new_facts is not facts:
        f.changes["node"] = new_facts
    load = _load(f)
    new = load
    if isinstance(item, IoSample) and item.read_bytes is not None:
        new = load.with_io(item.ts, item.read_bytes, item.rchar, f.cfg.io_progress_bytes)
    elif isinstance(item, GpuReading) and item.samples and f.sess is not None:
        if f.sess.phase in LOAD_PHASES and not load.weights_done:
            used = {
                s.index: s.memory_used_bytes
                for s in item.samples
                if s.up and s.memory_used_bytes is not None
            }
            if used:
                new = load.with_gpus(item.ts, used)
    elif isinstance(item, Milestone):
        if item.kind == "weights_loaded" and item.detail is None:
            new = _replace(load, weights_done=True)
        elif item.kind == "checkpoint_info" and item.gib is not None:
            new = _replace(load, checkpoint_gib=item.gib)
    if new is not load or new.session != f.get("node_load").session:
        view = node_progress(f, new, f.now)
        new = new.with_point(f.now, view.signal_ratio)
        f.changes["node_load"] = new


def _replace(load: NodeLoad, **kw: Any) -> NodeLoad:
    return replace(load, **kw)


def stall_window_s(cfg: Any) -> float:
    return float(cfg.stall_floor_s)


def node_progress(f: Fold, load: NodeLoad, now: float) -> NodeProgressView:
    """The view of `load` with what the fold knows around it (its pending changes first)."""
    return progress_for(
        load,
        now=now,
        facts=f.get("node"),
        model=f.get("model"),
        gpus=len(f.get("gpus")),
        session=f.sess,
        cfg=f.cfg,
    )


def progress_for(
    load: NodeLoad,
    *,
    now: float,
    facts: NodeFacts,
    model: ModelInfo | None,
    gpus: int,
    session: Any,
    cfg: Any,
) -> NodeProgressView:
    view = role_view(facts)
    bar = None
    phase = None
    if session is not None:
        phase = session.stall.resume_phase if session.stall is not None else session.phase
        bar = _bar_ratio(session)
    loading = (
        session is not None
        and load.session == session.id
        and session.phase in LOAD_PHASES
        and not load.weights_done
    )
    return progress_view(
        load,
        now=now,
        loading=loading and phase in LOAD_PHASES,
        checkpoint_bytes=model.total_bytes if model is not None else None,
        share=view.share,
        local_gpus=gpus,
        bar_ratio=bar,
        stall_window_s=stall_window_s(cfg),
    )


def node_view(state: Any, session: Any, now: float, bar_eta: Any = None) -> NodeView:
    """The node's view; `bar_eta` is the session's ETA (EtaView) where this node prints the
    bar: there the node's ETA is the bar's, as its progress is."""
    role = role_view(state.node)
    progress = progress_for(
        state.node_load,
        now=now,
        facts=state.node,
        model=state.model,
        gpus=len(state.gpus),
        session=session,
        cfg=state.config,
    )
    if bar_eta is not None and progress.bar_ratio is not None and progress.loading:
        progress = replace(
            progress, eta_s=bar_eta.remaining_s, eta_low_s=bar_eta.low_s, eta_high_s=bar_eta.high_s
        )
    phase = session.phase if session is not None else None
    if role.role in ("headless_tp_pp", "headless_dp"):
        ready = progress.weights_done and phase not in ("failed", "stopped", "stalled")
    else:
        ready = phase == "ready"
    return NodeView(role=role, progress=progress, ready=ready)


def _bar_ratio(session: Any) -> float | None:
    """The main weights bar's fraction of files, where this node prints it."""
    best = None
    for b in session.bars.values():
        if b.kind == "weights" and b.total:
            best = b if best is None or b.index < best.index else best
    if best is None:
        return None
    return min(max(float(best.done) / float(best.total), 0.0), 1.0)


__all__ = ["NODE_EVENTS", "node_view", "on_node_event", "progress_for", "track_node"]
