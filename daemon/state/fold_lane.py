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
from loadwatch.daemon.state.fold_kvrun import tally_groups
from loadwatch.daemon.state.fold_log import _tqdm_item_s, on_kv_run
from loadwatch.daemon.state.forecast import eta_updates
from loadwatch.daemon.state.nodefold import track_node
from loadwatch.daemon.state.records import evolve
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
                tally_groups(f, groups, f.now, f.now)
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
        tally_groups(f, groups, f.now, f.now)
    for key, ups in updates.items():
        _bar_updates(f, key, ups)


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
