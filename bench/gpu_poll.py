#!/usr/bin/env python3
"""What loadwatch's GPU polling adds on top of the NVML calls themselves, measured side by side.

Runs without a GPU: the binding is the hand-written fake from the tests, so the figures are the
Python-side cost of the wrapper and the deadline guard, not NVML's own (tests/device/nvml_track.py
measures that on real GPUs). Usage: python bench/gpu_poll.py [--gpus 8] [--polls 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadwatch.daemon.gpu import GuardedGpuSource
from loadwatch.daemon.gpusim import SimulatedGpuSource
from loadwatch.daemon.nvml import NvmlSource
from tests.gpu.fake_pynvml import FakeNvml, devices


def median_s(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--polls", type=int, default=2000)
    args = ap.parse_args()
    fake = FakeNvml(devices(args.gpus))
    fake.nvmlInit()
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(args.gpus)]

    def raw() -> None:
        # the same calls one poll makes, straight to the binding, results thrown away
        for h in handles:
            fake.nvmlDeviceGetMemoryInfo(h, version=0x02000028)
            fake.nvmlDeviceGetUtilizationRates(h)
            fake.nvmlDeviceGetTemperature(h, 0)
            fake.nvmlDeviceGetPowerUsage(h)
            fake.nvmlDeviceGetPerformanceState(h)
            fake.nvmlDeviceGetCurrentClocksEventReasons(h)
            fake.nvmlDeviceGetTotalEccErrors(h, 1, 0)
            fake.nvmlDeviceGetComputeRunningProcesses(h)

    src = NvmlSource(fake, xid_events=False)
    src.poll()
    guarded = GuardedGpuSource(NvmlSource(fake, xid_events=False), deadline_s=5.0)
    guarded.poll()
    sim = SimulatedGpuSource(args.gpus, progress=lambda: 0.5)

    raw_s = median_s(raw, args.polls)
    poll_s = median_s(src.poll, args.polls)
    guarded_s = median_s(guarded.poll, args.polls)
    sim_s = median_s(sim.poll, args.polls)
    n = args.gpus
    rows = [
        ("bare binding calls (fake)", raw_s, 1.0),
        ("NvmlSource.poll()", poll_s, poll_s / raw_s),
        ("GuardedGpuSource(NvmlSource).poll()", guarded_s, guarded_s / raw_s),
        ("SimulatedGpuSource.poll()", sim_s, sim_s / raw_s),
    ]
    print(f"{n} GPUs, median of {args.polls} polls each")
    print(f"{'what':40} {'per poll us':>12} {'per GPU us':>11} {'x bare':>7}")
    for name, s, ratio in rows:
        print(f"{name:40} {s * 1e6:12.1f} {s / n * 1e6:11.1f} {ratio:7.2f}")
    print(
        f"wrapper adds {(poll_s - raw_s) / n * 1e6:.1f} us per GPU; "
        f"the guard's thread hand-off adds {(guarded_s - poll_s) * 1e6:.1f} us per poll"
    )
    guarded.close()
    src.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
