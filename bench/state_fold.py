"""Per-input cost of `LoadState.apply`, at two sizes side by side, to show it does not grow.

    .venv/bin/python bench/state_fold.py [--n 1000]

Each workload runs at N and at 10 x N inputs in the same process; the ratio of the per-input
costs is ~1 when the fold is O(1) per input (a fold that copied what it accumulated would show
~10). Workloads: KV-scale warnings (one per layer, from 8 processes), a serving phase (unknown
warnings and errors from many source lines, the odd stall hint), a weight load (bar lines with a
GPU reading, bytes read and a tick each second). Also the cost of a snapshot of the large state
and of one ETA refit (`EtaState.update`), the estimator's share of a bar update.
The last line is key=value pairs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from loadwatch.daemon.sources.inputs import (
    GpuReading,
    GpuSample,
    IoSample,
    ModelInfo,
    ProcessEvent,
    ShardInfo,
    Tick,
)
from loadwatch.daemon.state.forecast import EtaState
from loadwatch.daemon.state.loadstate import Input, LoadState
from loadwatch.parsers.events import KvScaleWarning, LogError, LogWarning, Milestone, ShardProgress

T0 = 1_763_000_000.0
GIB = 1024**3


def warnings(n: int) -> list[tuple[float, Input]]:
    out: list[tuple[float, Input]] = [(T0, ProcessEvent(kind="started", ts=T0, pid=1))]
    for i in range(n):
        out.append(
            (
                T0 + 1 + i * 1e-3,
                KvScaleWarning(
                    scale="k" if i % 2 else "v",
                    layer=(i // 16) % 4096,
                    process=f"Worker_TP{i % 8}",
                    checkpoint_name=f"model.layers.{i // 16}.self_attn.k_scale",
                ),
            )
        )
    return out


def serving(n: int) -> list[tuple[float, Input]]:
    out: list[tuple[float, Input]] = [
        (T0, ProcessEvent(kind="started", ts=T0, pid=1)),
        (T0 + 1, Milestone(kind="app_startup_complete")),
    ]
    for i in range(n):
        t = T0 + 2 + i * 1e-4
        if i % 3:
            ev: Input = LogWarning(source=f"serving_{i % 200}.py:{i % 7}", message="slow request")
        else:
            ev = LogError(source=f"engine_{i % 50}.py:1", message="request failed")
        out.append((t, ev))
    return out


def weight_load(n: int) -> list[tuple[float, Input]]:
    shards = tuple(ShardInfo(f"m-{i}", 4 * GIB) for i in range(n))
    out: list[tuple[float, Input]] = [
        (T0, ProcessEvent(kind="started", ts=T0, pid=1)),
        (T0, ModelInfo(path="/m", shards=shards, total_bytes=4 * GIB * n)),
        (T0 + 1, Milestone(kind="model_load_start")),
    ]
    desc = "Loading safetensors checkpoint shards"
    for i in range(n + 1):
        t = T0 + 2 + i * 2.0
        out.append((t, ShardProgress(desc=desc, bar="weights", done=i, total=n, process="W")))
        for k in range(2):
            s = t + 0.5 + k
            used = int((1 + 70 * i / n) * GIB)
            samples = tuple(
                GpuSample(index=g, health="ok", memory_used_bytes=used, memory_total_bytes=80 * GIB)
                for g in range(8)
            )
            out.append((s, GpuReading(ts=s, samples=samples)))
            out.append((s, IoSample(ts=s, read_bytes=int(4 * GIB * (i + k / 2)))))
            out.append((s, Tick()))
    return out


def per_input_us(items: list[tuple[float, Input]]) -> tuple[float, LoadState]:
    st = LoadState()
    start = time.perf_counter()
    for now, item in items:
        st = st.apply(item, now)
    return 1e6 * (time.perf_counter() - start) / len(items), st


def eta_update_us(files: int = 119, bars: int = 200) -> float:
    """One `EtaState.update` (the ETA refit a weights-bar update makes), best of 5 rounds of
    `bars` whole bars of `files` files at uneven speed."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(bars):
            st = EtaState.start(0.0, 0, files)
            t = 0.0
            for done in range(1, files + 1):
                t += 1.0 + 0.1 * (done % 7)
                st = st.update(t, done)
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / (bars * files)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="the smaller size (default 1000)")
    args = ap.parse_args(argv)
    if args.n < 10:
        print("state_fold: --n must be at least 10", file=sys.stderr)
        return 2
    n = args.n
    work: list[tuple[str, Callable[[int], list[tuple[float, Input]]], int]] = [
        ("kv-scale warnings", warnings, n),
        ("serving errors", serving, n),
        ("weight load (shards)", weight_load, max(n // 10, 10)),
    ]
    print(
        f"{'workload':<22} {'inputs':>8} {'us/input':>9} {'inputs':>8} {'us/input':>9} {'ratio':>6}"
    )
    keys: list[str] = []
    big_state = LoadState()
    for name, make, size in work:
        small_items, big_items = make(size), make(size * 10)
        per_input_us(small_items)  # warm up
        small, _ = per_input_us(small_items)
        big, st = per_input_us(big_items)
        if name == "kv-scale warnings":
            big_state = st
        ratio = big / small
        print(
            f"{name:<22} {len(small_items):>8} {small:>9.1f} {len(big_items):>8} {big:>9.1f} {ratio:>6.2f}"
        )
        keys.append(f"{name.split()[0].replace('-', '_')}_ratio={ratio:.2f}")
        keys.append(f"{name.split()[0].replace('-', '_')}_us={big:.1f}")
    start = time.perf_counter()
    reps = 20
    for _ in range(reps):
        snap = big_state.snapshot(T0 + 100)
        snap.to_dict()
    snap_ms = 1e3 * (time.perf_counter() - start) / reps
    print(f"snapshot + to_dict of the {10 * n}-warning state: {snap_ms:.2f} ms")
    eta_us = eta_update_us()
    print(f"ETA refit per weights-bar update (119-file bar): {eta_us:.1f} us")
    print(" ".join(keys) + f" snapshot_ms={snap_ms:.2f} eta_update_us={eta_us:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
