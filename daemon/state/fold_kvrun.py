"""The fold of a `KvScaleRun`: the chunk scanner's one event for a run of plain k/v scale
warnings (parsers/vllm/kvrun.py), counted exactly as fold_log.py's `on_kv_run` counts the same
records one `KvScaleWarning` each (tests/state/test_kv_run_fold.py compares them)."""

from __future__ import annotations

from collections.abc import Sequence

from loadwatch.daemon.state.fold import Fold
from loadwatch.daemon.state.fold_log import activity
from loadwatch.daemon.state.nodefold import track_node
from loadwatch.daemon.state.session import WarningTally
from loadwatch.parsers.events import KvScaleRun, KvScaleWarning


def on_kv_group(f: Fold, g: KvScaleRun) -> None:
    """`on_kv_run` of the run's records: the same tally, from the run's sums."""
    t = f.at(g.ts)
    s = f.ensure_session(t)
    if s.stall is not None and s.stall.kind == "quiet":
        activity(f, t)
    last = t
    if f.replay and g.count > 1 and g.last_ts is not None:
        # `Fold.at` of each later record: stamps never go back within a run, so the last decides
        last = min(max(t, g.last_ts + f.offset), f.now)
    tally_groups(f, (g,), t, last)
    seen, sid = f.node_seen, f.s.id
    for p, pid in g.processes:  # the node sees each (process, pid) once, as with one event each
        if (p, pid, sid) not in seen:  # (`track_node` would return at once)
            track_node(f, KvScaleWarning(scale="k", process=p, pid=pid))


def tally_groups(f: Fold, groups: Sequence[KvScaleRun], first: float, last: float) -> None:
    """The session's k/v warning tally after `groups`, runs back to back whose first record
    happened at `first` and last at `last`: what their records one at a time would leave (the
    node's part aside). fold_lane.py tallies a live burst's runs in one call."""
    cfg = f.cfg
    warnings = f.mine("warnings")
    code = "kv_scale_missing"
    if code not in warnings and len(warnings) >= cfg.max_warning_codes:
        code = "other"
    w = warnings.get(code)
    if w is None:
        message = (groups[0].checkpoint_name or "")[:300]
        w = WarningTally(code, "warning", 0, first, first, 0, 0, frozenset(), frozenset(), message)
        w = f.made(w)
    else:
        w = f.mine_record(w)
    warnings[code] = w
    mask, over, scales, procs = w.layers_mask, w.layers_over, w.scales, w.processes
    max_layer, max_procs = cfg.max_layer, cfg.max_processes
    count = 0
    for g in groups:
        count += g.count
        for layer, records in g.layers:
            if 0 <= layer < max_layer:
                mask |= 1 << layer
            else:
                over += records
        if not scales.issuperset(g.scales):
            scales = scales | set(g.scales)
        for p, _pid in g.processes:
            if p and p not in procs and len(procs) < max_procs:
                procs = procs | {p}
    d = w.__dict__
    d["layers_mask"], d["layers_over"], d["scales"], d["processes"] = mask, over, scales, procs
    d["count"] = w.count + count
    d["last_at"] = last
    sd = f.draft().__dict__
    sd["warnings_total"] += count
    sd["last_event_at"] = last
    sd["log_seen"] = True
