"""Where the time goes on the load-phase log: read, scan + parse, fold, per event type.

    .venv/bin/python bench/load_breakdown.py [--lines N]

The load-phase log of bench/throughput_vs_mtail.py (generated the same way, seeded: Kimi-K2.5-like
starts, ~200,000 lines, nearly every line an event) through the same pipeline, one stage at a
time in one process: the follower reads every chunk, the chunk scanner turns them into events,
`LoadState.apply` folds them (timed per event and summed by type). Beside it, in the same run,
two floors for the per-layer k/v scale warnings, which are most of the lines: one compiled regex
matching the whole warning record over the file (`finditer`, nothing per match), and a bare
Python loop over the lines. The last line is key=value pairs.

This says what limits loadwatch on this log (issue 10's goal: 3x mtail, about 0.9 s for the
file here): one Python event per record, parsed and folded into an immutable state, is several
microseconds per record however the per-record code is trimmed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from loggen import load_log

from loadwatch.daemon.follower import LogFollower
from loadwatch.daemon.state import LoadState
from loadwatch.parsers import ChunkScanner, EventStream

# One k/v scale warning record, whole (its layer and scale captured): the cheapest regex pass
KV_RECORD = re.compile(
    rb"^\(([A-Za-z][A-Za-z0-9_]{0,63}) pid=([0-9]{1,10})\) WARNING "
    rb"([0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) \[[\x21-\x5c\x5e-\x7e]{1,200}\] "
    rb"Found ([kv])_scale in the checkpoint \(e\.g\. [^()\s]*?layers\.([0-9]{1,6})\.[^()\s]*\), "
    rb"but not found the expected name in the model \(e\.g\. [^()\s]*\)[^\n\r]*$",
    re.M,
)


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
            chunks += follower.read()
            if not follower.backlog:
                break
        lines = follower.health().records_total
        follower.close(checkpoint=False)
        t1 = time.perf_counter()
        scanner = ChunkScanner(EventStream(ref_ts=time.time()))
        events = []
        for c in chunks:
            events += scanner.feed(c.data, c.offset, c.file_id)
        t2 = time.perf_counter()
        state, now = LoadState(), time.time()
        spent: Counter[str] = Counter()
        count: Counter[str] = Counter()
        clock = time.perf_counter
        for ev in events:
            a = clock()
            state = state.apply(ev, now)
            spent[ev.type] += clock() - a
            count[ev.type] += 1
        t3 = time.perf_counter()

        a = clock()
        kv_regex = sum(1 for _ in KV_RECORD.finditer(data))
        regex_s = clock() - a
        a = clock()
        with path.open("rb") as f:
            for _line in f:
                pass
        loop_s = clock() - a

    read_s, parse_s, fold_s = t1 - t0, t2 - t1, t3 - t2
    total = read_s + parse_s + fold_s
    print(
        f"load-phase log: {lines:,} records (a tqdm bar's `\\r` ends one too), "
        f"{len(events):,} events ({len(data) / 1e6:.1f} MB)"
    )
    print(f"{'stage':28} {'s':>6} {'us/rec':>8} {'us/event':>9}")
    for name, s in (("read (follower)", read_s), ("scan + parse", parse_s), ("fold", fold_s)):
        print(f"{name:28} {s:6.2f} {s / lines * 1e6:8.2f} {s / len(events) * 1e6:9.2f}")
    print(f"{'all':28} {total:6.2f} {total / lines * 1e6:8.2f}   = {lines / total:,.0f} records/s")
    print(f"\nfold by event type{'':10} {'events':>8} {'s':>6} {'us each':>8}")
    for kind, n in count.most_common():
        print(f"  {kind:26} {n:8,} {spent[kind]:6.2f} {spent[kind] / n * 1e6:8.1f}")
    print(
        f"\nfloors, same run: one regex over the file for the k/v warning records: "
        f"{regex_s:.2f} s ({kv_regex:,} records, {regex_s / max(kv_regex, 1) * 1e6:.1f} us "
        f"each, nothing done per match); a bare Python line loop: {loop_s:.2f} s"
    )
    if kv_regex != truth.kv_scale_warnings:
        print(f"regex counted {kv_regex}, the generator wrote {truth.kv_scale_warnings}")
        return 1
    print(
        f"records_per_s={lines / total:.0f} read_s={read_s:.2f} parse_s={parse_s:.2f} "
        f"fold_s={fold_s:.2f} kv_regex_s={regex_s:.2f} line_loop_s={loop_s:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
