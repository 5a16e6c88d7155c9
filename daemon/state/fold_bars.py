"""The fold of tqdm bar updates (`ShardProgress`): one handler per update, and one per run of
them that `LoadState.apply_run` hands over together.

A run of updates of one bar read at one instant (a backlog, a busy moment: every update then
happens at the same time on the daemon's clock) says only where the bar stood then: the first
of them is folded as usual, the rest at once, the last of them deciding (files done, tqdm's
remaining time and rate, the estimator's last point). Updates that start, finish or adopt a
bar, or that meet a stall, take the handler one by one. The result is what the updates one at a
time leave (tests/state/test_apply_run.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadwatch.daemon.state.fold import Fold
from loadwatch.daemon.state.forecast import EtaState, eta_update, tqdm_elapsed_s
from loadwatch.daemon.state.nodefold import track_node
from loadwatch.daemon.state.ranks import track_processes
from loadwatch.daemon.state.records import evolve
from loadwatch.daemon.state.session import BarTrack, Session
from loadwatch.daemon.state.timeline import bar_phase, mark
from loadwatch.parsers.events import ShardProgress

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
        began, was_finished = True, False
    else:
        began = False
        was_finished = cur.finished_at is not None
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
    finished = not was_finished and bar.finished_at is not None  # (with this update)
    # (all of the stage's weights bars done: the weights are in; else this bar is one of them)
    weights_in = (
        finished
        and bar.kind == "weights"
        and all(
            b.finished_at is not None
            for b in f.s.bars.values()
            if b.kind == "weights" and b.index == bar.index
        )
    )
    phase = bar_phase(bar.kind) if began or finished else None
    if phase is not None:
        tl = f.s.timeline
        if began:
            tl = mark(tl, phase, t, bar.process, "start", t - bar.started_at, bar=bar.key)
        if finished:
            tl = mark(tl, phase, t, bar.process, "end" if weights_in else "on")
        sd["timeline"] = tl
    if weights:
        f.advance("loading_weights", t, "weights bar")
        if weights_in and bar.index == 0:
            f.clear_forecasts(t, "weights loaded")
    else:
        if ev.bar in ("graph_capture", "autotune"):  # (vLLM does both after the weights)
            f.advance("post_load", t, ev.bar.replace("_", " "))
        f.activity(t)


def on_progress_run(f: Fold, run: Sequence[ShardProgress]) -> None:
    """Bar updates back to back: each through `_on_progress`, but of the updates after it that
    only move the same weights bar on at the same instant, the last decides (`_burst`)."""
    n = len(run)
    k = 0
    while k < n:
        ev = run[k]
        f.record = ev.offset
        _on_progress(f, ev)
        track_node(f, ev)
        k += 1
        if k == n or ev.bar != "weights" or ev.process is None:
            continue
        s = f.s
        key = s.bar_latest.get(f"{ev.process}|weights|{ev.desc}")
        bar = s.bars.get(key) if key is not None else None
        if bar is None or bar.finished_at is not None or s.stall is not None:
            continue
        t = bar.last_update_at
        done = bar.done
        m = k
        while m < n:
            nxt = run[m]
            if (
                nxt.bar != "weights"
                or nxt.desc != ev.desc
                or nxt.process != ev.process
                or nxt.pid != ev.pid
                or nxt.total != bar.total
                or not done <= nxt.done < bar.total
                or tqdm_elapsed_s(nxt) is None  # (the estimator starts again from each)
                or f.at(nxt.ts) != t
            ):
                break
            done = nxt.done
            m += 1
        if m > k:
            _burst(f, bar, run[k:m], t)
            track_processes(f, run[k:m])
            k = m


def _burst(f: Fold, cur: BarTrack, ups: Sequence[ShardProgress], t: float) -> None:
    """`_on_progress` of each of `ups`: updates at `t`, the instant of the bar's last update,
    that continue it unfinished (`on_progress_run` checked), with no stall to clear."""
    last = ups[-1]
    item_s = cur.tqdm_item_s
    moved: ShardProgress | None = None  # the last update that advanced the bar
    done = cur.done
    for ev in ups:
        x = _tqdm_item_s(ev)
        if x is not None:
            item_s = x
        if ev.done > done:
            moved, done = ev, ev.done
    bars = f.mine("bars")
    bar = bars[cur.key] = f.mine_record(cur)
    d = bar.__dict__
    d["done"] = last.done
    d["updates"] = cur.updates + len(ups)
    d["tqdm_remaining_s"] = last.remaining_s
    d["tqdm_item_s"] = item_s
    if moved is not None:
        prev = cur.last_progress_at if cur.last_progress_at is not None else cur.started_at
        d["longest_gap_s"] = max(cur.longest_gap_s or 0.0, t - prev)
        d["last_progress_at"] = t
        if cur.eta is not None:
            d["eta"] = eta_update(cur.eta, t, moved)
        sd = f.draft().__dict__
        sd["last_progress_at"] = t
        io = sd["io"]
        if io is not None and io.line_bytes != io.last_bytes:
            sd["io"] = evolve(io, line_bytes=io.last_bytes)
