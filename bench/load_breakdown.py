"""Where the time goes on the load-phase log: read, scan + parse, fold, per event type.

    .venv/bin/python bench/load_breakdown.py [--lines N]

The load-phase log of bench/throughput_vs_mtail.py (generated the same way, seeded: Kimi-K2.5-like
starts, ~200,000 lines, nearly every line an event) through the same pipeline, one stage at a
time in one process: the follower reads every chunk (joined as the log source joins them), the
chunk scanner turns them into events, one per record, `LoadState.apply_run` folds each chunk's
events in one call as the daemon does (and, to split the fold's time by event type,
`LoadState.apply` one event at a time, timed per event). Beside
it, in the same run, two floors for the per-layer k/v scale warnings, which are most of the lines: one compiled regex
matching the whole warning record over the file (`finditer`, nothing per match), and a bare
Python loop over the lines. The last line is key=value pairs.

And the budget: mtail on the same file in the same run (when installed; wall time less its
wall time on an empty file, as bench/throughput_vs_mtail.py measures it), a third of which is
the time loadwatch would have for the whole file at 3x mtail; beside it the cost of building the
events the file yields, alone: every event made again from its own field values, the cheapest way
Python has (`object.__new__` and `object.__setattr__`, as the stream's recipes make them), with no
parsing and no folding, the least a fold can do per k/v warning, and the weights bars' ETA
estimator alone, fed every bar update as the fold feeds it: the floors of one event per parsed
record and an ETA from every bar update, taken one by one (`floors_s` against `budget_3x_s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from itertools import repeat
from pathlib import Path

from loggen import load_log
from throughput_vs_mtail import MTAIL_PROGRAM, measured, mtail_counts, tools

from loadwatch.daemon.sources.inputs import joined
from loadwatch.daemon.sources.log.follower import LogFollower
from loadwatch.daemon.state.forecast import EtaConfig, EtaState
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.parsers import ChunkScanner, EventStream
from loadwatch.parsers.events import Event, KvScaleWarning, ShardProgress

# One k/v scale warning record, whole (its layer and scale captured): the cheapest regex pass
KV_RECORD = re.compile(
    rb"^\(([A-Za-z][A-Za-z0-9_]{0,63}) pid=([0-9]{1,10})\) WARNING "
    rb"([0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) \[[\x21-\x5c\x5e-\x7e]{1,200}\] "
    rb"Found ([kv])_scale in the checkpoint \(e\.g\. [^()\s]*?layers\.([0-9]{1,6})\.[^()\s]*\), "
    rb"but not found the expected name in the model \(e\.g\. [^()\s]*\)[^\n\r]*$",
    re.M,
)


def rebuild_s(events: list[Event], repeat_n: int = 3) -> float:
    """Seconds to make every event again from its field values, nothing else done: the best of
    `repeat_n` runs with the collector off (a floor, not what the pipeline meets)."""
    new, setattr_ = object.__new__, object.__setattr__
    rows = [
        (type(ev), names, tuple(getattr(ev, n) for n in names))
        for ev in events
        for names in (tuple(f.name for f in dataclasses.fields(ev)),)
    ]

    def build() -> list[Event]:
        out = []
        for cls, names, values in rows:
            ev = new(cls)
            any(map(setattr_, repeat(ev), names, values))
            out.append(ev)
        return out

    return _floor(build, repeat_n)


def tally_s(events: list[Event], repeat_n: int = 3) -> float:
    """Seconds for the least a fold does per k/v warning, in plain locals: count it, set its
    layer's bit, note its process and scale, keep its time (best of `repeat_n`, collector off)."""
    kv = [ev for ev in events if isinstance(ev, KvScaleWarning)]

    def fold() -> None:
        count, mask, procs, scales, last = 0, 0, set(), set(), None
        for ev in kv:
            count += 1
            if ev.layer is not None:
                mask |= 1 << ev.layer
            procs.add(ev.process)
            scales.add(ev.scale)
            last = ev.ts
        assert count == len(kv) and (last is not None or not kv)

    return _floor(fold, repeat_n)


def eta_s(events: list[Event], repeat_n: int = 3) -> float:
    """Seconds for the weights bars' ETA estimator alone, fed as the fold feeds it: a new
    estimate when a bar starts again, an update each time it advances (best of `repeat_n`,
    collector off). The ETA is the product's own; every bar update of a load feeds it."""
    bars = [ev for ev in events if isinstance(ev, ShardProgress) and ev.bar == "weights"]
    cfg = EtaConfig()

    def fold() -> None:
        etas: dict[str | None, EtaState] = {}
        for ev in bars:
            t = ev.ts if ev.ts is not None else 0.0
            cur = etas.get(ev.process)
            if cur is None or ev.done < cur.last_done or ev.total != cur.total_items:
                etas[ev.process] = EtaState.start(t, ev.done, ev.total, None, ev.elapsed_s, cfg)
            elif ev.done > cur.last_done:
                etas[ev.process] = cur.update(t, ev.done)
        assert len(etas) <= len(bars)

    return _floor(fold, repeat_n)


def _floor(work: Callable[[], object], repeat_n: int) -> float:
    best = float("inf")
    clock = time.perf_counter
    gc.disable()
    try:
        for _ in range(repeat_n):
            a = clock()
            work()
            best = min(best, clock() - a)
    finally:
        gc.enable()
    return best


def mtail_s(path: Path, tmp: Path, runs: int = 3) -> tuple[float, int] | None:
    """mtail's median wall time on `path` less that on an empty file, and the k/v warnings it
    counted; None when mtail is not installed."""
    if shutil.which("mtail") is None or shutil.which("/usr/bin/time") is None:
        return None
    progs = tmp / "progs"
    progs.mkdir(exist_ok=True)
    shutil.copy(MTAIL_PROGRAM, progs / MTAIL_PROGRAM.name)
    empty = tmp / "empty.log"
    empty.write_bytes(b"")
    tool = next(t for t in tools(progs) if t.name == "mtail")
    for _ in range(runs):
        tool.runs.append(measured(tool.argv(path)))
        tool.empty.append(measured(tool.argv(empty)))
    return tool.net(), mtail_counts(tool.runs[-1].stdout)["kv_scale_warnings"] or 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=200_000, help="lines of the load-phase log")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "load.log"
        truth = load_log(path, args.lines, seed=1)
        data = path.read_bytes()

        t0 = time.perf_counter()
        follower = LogFollower(path, mode="poll")
        chunks = []
        while True:
            chunks += joined(follower.read())  # as the daemon's log source hands them over
            if not follower.backlog:
                break
        lines = follower.health().records_total
        follower.close(checkpoint=False)
        t1 = time.perf_counter()
        scanner = ChunkScanner(EventStream(ref_ts=time.time()))
        runs = [scanner.feed(c.data, c.offset, c.file_id) for c in chunks]
        events = [ev for run in runs for ev in run]
        t2 = time.perf_counter()
        state, now = LoadState(), time.time()
        for run in runs:  # as the daemon folds them: a chunk's events in one call
            state = state.apply_run(run, now)
        t3 = time.perf_counter()
        # and one at a time, to split the fold's time by event type
        single = LoadState()
        spent: Counter[str] = Counter()
        count: Counter[str] = Counter()
        clock = time.perf_counter
        for ev in events:
            a = clock()
            single = single.apply(ev, now)
            spent[ev.type] += clock() - a
            count[ev.type] += 1
        same = single.snapshot(now) == state.snapshot(now) and single.lifetime == state.lifetime

        a = clock()
        kv_regex = sum(1 for _ in KV_RECORD.finditer(data))
        regex_s = clock() - a
        a = clock()
        with path.open("rb") as f:
            for _line in f:
                pass
        loop_s = clock() - a
        build_s = rebuild_s(events)
        kv_build_s = rebuild_s([ev for ev in events if ev.type == "kv_scale_warning"])
        kv_fold_s = tally_s(events)
        bar_eta_s = eta_s(events)
        mtail = mtail_s(path, Path(tmp))

    read_s, parse_s, fold_s = t1 - t0, t2 - t1, t3 - t2
    total = read_s + parse_s + fold_s
    print(
        f"load-phase log: {lines:,} records (a tqdm bar's `\\r` ends one too), "
        f"{len(events):,} events ({len(data) / 1e6:.1f} MB)"
    )
    print(f"{'stage':28} {'s':>6} {'us/rec':>8} {'us/event':>9}")
    stages = (("read (follower)", read_s), ("scan + parse", parse_s), ("fold (per chunk)", fold_s))
    for name, s in stages:
        print(f"{name:28} {s:6.2f} {s / lines * 1e6:8.2f} {s / len(events) * 1e6:9.2f}")
    print(f"{'all':28} {total:6.2f} {total / lines * 1e6:8.2f}   = {lines / total:,.0f} records/s")
    print(f"\nfold one event at a time (the state {'equal' if same else 'DIFFERENT'}), by type")
    print(f"  {'':26} {'events':>8} {'s':>6} {'us each':>8}")
    for kind, n in count.most_common():
        print(f"  {kind:26} {n:8,} {spent[kind]:6.2f} {spent[kind] / n * 1e6:8.1f}")
    print(
        f"\nfloors, same run: one regex over the file for the k/v warning records: "
        f"{regex_s:.2f} s ({kv_regex:,} records, {regex_s / max(kv_regex, 1) * 1e6:.1f} us "
        f"each, nothing done per match); a bare Python line loop: {loop_s:.2f} s"
    )
    print(
        f"building the {len(events):,} events alone, from their field values: {build_s:.2f} s "
        f"({build_s / len(events) * 1e6:.1f} us each; the k/v warnings' {kv_build_s:.2f} s); "
        f"the least fold of the k/v warnings, in plain locals: {kv_fold_s:.2f} s; the weights "
        f"bars' ETA estimator alone, fed every bar update: {bar_eta_s:.2f} s"
    )
    if kv_regex != truth.kv_scale_warnings:
        print(f"regex counted {kv_regex}, the generator wrote {truth.kv_scale_warnings}")
        return 1
    budget = ""
    if mtail is None:
        print("mtail not installed: no budget (./scripts/ensure-tools.sh installs it)")
    else:
        mtail_net, mtail_kv = mtail
        if mtail_kv != truth.kv_scale_warnings:
            print(
                f"mtail counted {mtail_kv} k/v warnings, the generator wrote "
                f"{truth.kv_scale_warnings}"
            )
            return 1
        third = mtail_net / 3
        least = read_s + build_s + kv_fold_s
        floors = least + bar_eta_s
        print(
            f"mtail, same file, same run: {mtail_net:.2f} s; at 3x mtail loadwatch would have "
            f"{third:.2f} s for the whole file. Reading it, building the events and the least "
            f"fold of the k/v warnings take {least:.2f} s of that ({least / third:.0%}); with "
            f"the ETA estimator's updates {floors:.2f} s ({floors / third:.0%}), before any "
            f"parsing and any other fold; loadwatch now: {mtail_net / total:.2f}x mtail"
        )
        budget = (
            f" floors_s={floors:.2f} mtail_s={mtail_net:.2f} budget_3x_s={third:.2f}"
            f" ratio_vs_mtail={mtail_net / total:.2f}"
        )
    print(
        f"records_per_s={lines / total:.0f} read_s={read_s:.2f} parse_s={parse_s:.2f} "
        f"fold_s={fold_s:.2f} kv_regex_s={regex_s:.2f} line_loop_s={loop_s:.2f} "
        f"build_events_s={build_s:.2f} kv_least_fold_s={kv_fold_s:.2f} "
        f"bar_eta_s={bar_eta_s:.2f}{budget}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
