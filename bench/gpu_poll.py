#!/usr/bin/env python3
"""What loadwatch's GPU polling adds on top of the NVML calls themselves, measured side by side.

Runs without a GPU: the binding here answers every call at once with a fixed value, so the
figures are the Python-side cost of the wrapper and of the deadline guard, not NVML's own
(tests/device/nvml_track.py measures that on real GPUs). Usage:

    python bench/gpu_poll.py [--gpus 8] [--polls 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
from loadwatch.daemon.sources.gpu.nvml import NvmlSource


def instant_binding(gpus: int) -> Any:
    """pynvml's surface as far as a poll uses it; every call returns a constant at once."""
    ns = types.SimpleNamespace
    mem = ns(total=141 << 30, reserved=512 << 20, free=100 << 30, used=40 << 30)
    util = ns(gpu=37, memory=12)
    procs = [ns(pid=4242, usedGpuMemory=39 << 30)]
    pci = ns(busId="00000000:18:00.0")
    nv = ns()
    nv.NVMLError = type("NVMLError", (Exception,), {})
    nv.nvmlInit = lambda: None
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    nv.nvmlDeviceGetPciInfo = lambda h: pci
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetMemoryInfo = lambda h, version=None: mem
    nv.nvmlDeviceGetUtilizationRates = lambda h: util
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 41
    nv.nvmlDeviceGetPowerUsage = lambda h: 123_456
    nv.nvmlDeviceGetPerformanceState = lambda h: 0
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: procs
    return nv


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
    ap.add_argument("--polls", type=int, default=3000)
    args = ap.parse_args()
    n = args.gpus
    nv = instant_binding(n)
    calls = [
        (nv.nvmlDeviceGetMemoryInfo, (0x02000028,)),
        (nv.nvmlDeviceGetUtilizationRates, ()),
        (nv.nvmlDeviceGetTemperature, (0,)),
        (nv.nvmlDeviceGetPowerUsage, ()),
        (nv.nvmlDeviceGetPerformanceState, ()),
        (nv.nvmlDeviceGetCurrentClocksEventReasons, ()),
        (nv.nvmlDeviceGetTotalEccErrors, (1, 0)),
        (nv.nvmlDeviceGetComputeRunningProcesses, ()),
    ]

    def bare() -> None:  # the same calls one poll makes, results thrown away
        for h in range(n):
            for fn, extra in calls:
                fn(h, *extra)

    src = NvmlSource(nv, xid_events=False)
    src.poll()
    guarded = GuardedGpuSource(NvmlSource(nv, xid_events=False), deadline_s=5.0)
    guarded.poll()
    sim = SimulatedGpuSource(n, progress=lambda: 0.5)

    bare_s = median_s(bare, args.polls)
    poll_s = median_s(src.poll, args.polls)
    guarded_s = median_s(guarded.poll, args.polls)
    sim_s = median_s(sim.poll, args.polls)
    print(f"{n} GPUs, median of {args.polls} polls each; binding answers instantly")
    print(f"{'what':38} {'per poll us':>12} {'per GPU us':>11} {'x bare':>7}")
    for name, s in (
        ("bare binding calls", bare_s),
        ("NvmlSource.poll()", poll_s),
        ("GuardedGpuSource(NvmlSource).poll()", guarded_s),
        ("SimulatedGpuSource.poll()", sim_s),
    ):
        print(f"{name:38} {s * 1e6:12.1f} {s / n * 1e6:11.1f} {s / bare_s:7.2f}")
    print(
        f"the wrapper adds {(poll_s - bare_s) / n * 1e6:.1f} us per GPU to the calls; "
        f"the guard's thread hand-off adds {(guarded_s - poll_s) * 1e6:.1f} us per poll"
    )
    guarded.close()
    src.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
