"""A live stretch of a load's k/v scale warnings and weights-bar updates, folded in one pass.

Read live, a load's log arrives as warnings with the bar's updates between them, every one of
them at `now` (`Fold.at`). While the session is loading weights with no stall, and every bar
update continues its bar without finishing it, the two touch nothing of each other: the
warnings their tally, the bar its track, both the session's `last_event_at` (`now`) and
`log_seen`. None of them makes a transition. So the warnings are folded as they come and each
bar's updates once, at the end, as the same fields the updates one by one would leave
(fold_log.py's `_on_progress`); the node sees every input in order as before. Anything else ends
the stretch and takes its own handler (tests/state/test_fold_lane.py folds the same inputs both
ways and compares).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadwatch.daemon.state.fold import Fold
from loadwatch.daemon.state.fold_log import _tqdm_item_s, on_kv_run
from loadwatch.daemon.state.forecast import eta_updates
from loadwatch.daemon.state.nodefold import track_node
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import WarningTally
from loadwatch.parsers.events import KvScaleRun, KvScaleWarning, ShardProgress

LANE_INPUTS = frozenset({KvScaleRun, KvScaleWarning, ShardProgress})


def lane_end(f: Fold, seq: Sequence[Any], i: int) -> int:
    """Where the stretch that can be folded in one pass from `seq[i]` ends (`i`: none)."""
    s = f.sess
    if f.replay or s is None or s.stall is not None or s.phase != "loading_weights":
        return i
    if f.get("node_load").session != s.id:
        return i  # the node's view of this session is still to be started, in order
    latest, bars = s.bar_latest, s.bars
    done_by: dict[str, int] = {}  # a bar's files done so far in the stretch
    n = len(seq)
    j = i
    while j < n:
        item = seq[j]
        cls = type(item)
        if cls is not ShardProgress:
            if cls is not KvScaleRun and cls is not KvScaleWarning:
                break
            j += 1
            continue
        if item.bar != "weights" or item.process is None:
            break
        key = latest.get(f"{item.process}|weights|{item.desc}")
        if key is None:
            break
        done = done_by.get(key)
        if done is None:
            cur = bars.get(key)
            if cur is None or cur.total != item.total:
                break
            done = cur.done
        if item.done < done or item.done >= item.total:  # a new bar, or this one finishing
            break
        done_by[key] = item.done
        j += 1
    return j


def fold_lane(f: Fold, seq: Sequence[Any], i: int, j: int) -> None:
    """Fold `seq[i:j]`, a stretch `lane_end` admitted."""
    updates: dict[str, list[ShardProgress]] = {}
    groups: list[KvScaleRun] = []  # tallied together: each only adds to the one tally
    latest = f.s.bar_latest
    seen, sid = f.node_seen, f.s.id
    k = i
    while k < j:
        item = seq[k]
        cls = type(item)
        if cls is KvScaleRun:
            groups.append(item)
            for p, pid in item.processes:  # the node sees each (process, pid) once, in order
                if (p, pid, sid) not in seen:
                    f.record = item.offset
                    track_node(f, KvScaleWarning(scale="k", process=p, pid=pid))
        elif cls is KvScaleWarning:
            if groups:  # the tally in record order (its first message, its process cap)
                _kv_groups(f, groups)
                groups = []
            m = k + 1
            while m < j and type(seq[m]) is KvScaleWarning:
                m += 1
            run = seq[k:m]
            f.record = item.offset
            on_kv_run(f, run)
            for ev in run:
                track_node(f, ev)
            k = m
            continue
        else:
            updates.setdefault(latest[f"{item.process}|weights|{item.desc}"], []).append(item)
            if (item.process, item.pid, sid) not in seen:
                f.record = item.offset
                track_node(f, item)
        k += 1
    if groups:
        _kv_groups(f, groups)
    for key, ups in updates.items():
        _bar_updates(f, key, ups)


def _kv_groups(f: Fold, groups: list[KvScaleRun]) -> None:
    """fold_kvrun.py's `on_kv_group` of each of `groups` (live, no stall), but the node's part
    (`fold_lane` did it in order): one tally update for all."""
    t = f.now
    cfg = f.cfg
    warnings = f.mine("warnings")
    code = "kv_scale_missing"
    if code not in warnings and len(warnings) >= cfg.max_warning_codes:
        code = "other"
    w = warnings.get(code)
    if w is None:
        message = (groups[0].checkpoint_name or "")[:300]
        w = f.made(WarningTally(code, "warning", 0, t, t, 0, 0, frozenset(), frozenset(), message))
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
    d["last_at"] = t
    sd = f.draft().__dict__
    sd["warnings_total"] += count
    sd["last_event_at"] = t
    sd["log_seen"] = True


def _bar_updates(f: Fold, key: str, ups: list[ShardProgress]) -> None:
    """`_on_progress` of each of `ups`, updates at `now` that continue bar `key` unfinished."""
    t = f.now
    cur = f.s.bars[key]
    done = cur.done
    gap = cur.longest_gap_s
    prev = cur.last_progress_at if cur.last_progress_at is not None else cur.started_at
    item_s = cur.tqdm_item_s
    advancing: list[ShardProgress] = []
    for ev in ups:
        if ev.done > done:
            gap = max(gap or 0.0, t - prev)
            prev = t
            advancing.append(ev)
            done = ev.done
        x = _tqdm_item_s(ev)
        if x is not None:
            item_s = x
    advanced = bool(advancing)
    eta = cur.eta
    if eta is not None and advancing:
        eta = eta_updates(eta, t, advancing)
    bars = f.mine("bars")
    bar = bars[key] = f.mine_record(cur)
    d = bar.__dict__
    d["done"] = done
    d["last_update_at"] = t
    if advanced:
        d["last_progress_at"] = t
    d["updates"] = cur.updates + len(ups)
    d["longest_gap_s"] = gap
    d["tqdm_remaining_s"] = ups[-1].remaining_s
    d["tqdm_item_s"] = item_s
    d["eta"] = eta
    sd = f.draft().__dict__
    sd["last_event_at"] = t
    sd["log_seen"] = True
    if advanced:
        sd["last_progress_at"] = t
        io = sd["io"]
        sd["io"] = evolve(io, line_bytes=io.last_bytes) if io is not None else None
