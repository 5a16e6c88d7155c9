#!/usr/bin/env python3
"""Check loadwatch's NVML source against real NVIDIA GPUs.

Run from the repository root on a machine with GPUs, ``nvidia-ml-py`` and ``torch``:

    python tests/device/nvml_track.py [--gpu 0] [--steps-gib 0,2,4,8,16] [--polls 1000]

loadwatch need not be installed: without it the script links the repository's folders into a
temporary ``loadwatch`` package. A child process allocates GPU memory with torch in steps and
waits at each; the parent polls with the real ``NvmlSource`` and checks that device memory and the
child's process entry track each allocation (within 1% or 64 MiB), that the memory is released
once the child is killed, and that the orphan check then finds nothing leaked. It then times a
full poll (median of ``--polls``) against an ``nvidia-smi`` query in the same run. Every check
prints PASS or FAIL; the exit status is 1 when any failed, 2 when the run could not start.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
MIB = 1 << 20
TOLERANCE_FLOOR_BYTES = 64 * MIB
TOLERANCE_RATIO = 0.01
POLL_GOAL_US_PER_GPU = 50.0
SMI_QUERY = (
    "index,uuid,name,pci.bus_id,memory.used,memory.total,utilization.gpu,"
    "temperature.gpu,power.draw,power.limit,pstate"
)
HOT_CALLS = (  # what one NvmlSource poll asks each GPU, for the per-call breakdown
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetComputeRunningProcesses",
)


# -- helpers (no GPU needed; tested in tests/gpu/test_device_script.py) ---------------------------


def ensure_loadwatch_importable(repo: Path = REPO) -> None:
    """Import loadwatch as installed, or from a temporary package linking the repo's folders."""
    try:
        importlib.import_module("loadwatch.daemon.sources.gpu.nvml")
        return
    except ImportError:
        pass
    shim = Path(tempfile.mkdtemp(prefix="loadwatch-shim-"))
    pkg = shim / "loadwatch"
    pkg.mkdir()
    for name in ("daemon", "parsers", "exporters"):
        (pkg / name).symlink_to(repo / name, target_is_directory=True)
    sys.path.insert(0, str(shim))
    for mod in [m for m in sys.modules if m == "loadwatch" or m.startswith("loadwatch.")]:
        del sys.modules[mod]
    importlib.invalidate_caches()
    importlib.import_module("loadwatch.daemon.sources.gpu.nvml")


def tolerance_bytes(expected_delta: int) -> int:
    return max(TOLERANCE_FLOOR_BYTES, round(abs(expected_delta) * TOLERANCE_RATIO))


def within(measured: int | None, expected: int) -> bool:
    return measured is not None and abs(measured - expected) <= tolerance_bytes(expected)


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.3f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def median_seconds(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Checks:
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    results: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self.results.append((name, ok, detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", file=self.out, flush=True)
        return ok

    @property
    def failed(self) -> list[str]:
        return [name for name, ok, _ in self.results if not ok]


class LineReader:
    """Lines from a pipe, read on a thread so every wait can have a timeout."""

    def __init__(self, stream: IO[str]) -> None:
        self._q: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def expect(self, prefix: str, timeout_s: float) -> list[str]:
        """The fields of the next line starting with ``prefix`` (other lines are skipped)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {prefix!r} line from the child within {timeout_s:g} s")
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise EOFError(f"the child closed its output before a {prefix!r} line")
            if line.startswith(prefix + " ") or line == prefix:
                return line.split()[1:]


@dataclass(frozen=True)
class Track:
    """One allocation step as NVML saw it."""

    expected_delta: int
    device_delta: int | None
    process_delta: int | None
    process_seen: bool
    waited_s: float

    @property
    def ok(self) -> bool:
        return (
            self.process_seen
            and within(self.device_delta, self.expected_delta)
            and within(self.process_delta, self.expected_delta)
        )


def process_bytes(sample: Any, pid: int) -> int | None:
    for proc in sample.processes:
        if proc.pid == pid:
            return int(proc.used_bytes) if proc.used_bytes is not None else None
    return None


def sample_of(source: Any, index: int) -> Any:
    reading = source.poll()
    if not reading.source_up:
        raise RuntimeError(f"NVML went down: {reading.error}")
    for s in reading.samples:
        if s.index == index:
            return s
    raise RuntimeError(f"GPU {index} missing from the reading")


def wait_sample(
    source: Any,
    index: int,
    done: Callable[[Any], bool],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> tuple[Any, bool, float]:
    """Poll until ``done(sample)`` or the timeout: (last sample, done, seconds waited)."""
    start = monotonic()
    while True:
        s = sample_of(source, index)
        waited = monotonic() - start
        if done(s):
            return s, True, waited
        if waited >= timeout_s:
            return s, False, waited
        sleep(interval_s)


def track(
    source: Any,
    index: int,
    pid: int,
    base_used: int,
    base_proc: int,
    expected_delta: int,
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.05,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> Track:
    """Poll until device and process memory show ``expected_delta`` (or the timeout passes)."""

    def measure(s: Any, waited: float) -> Track:
        used = s.memory_used_bytes
        proc = process_bytes(s, pid)
        return Track(
            expected_delta=expected_delta,
            device_delta=None if used is None else used - base_used,
            process_delta=None if proc is None else proc - base_proc,
            process_seen=proc is not None,
            waited_s=waited,
        )

    s, _, waited = wait_sample(
        source,
        index,
        lambda s: measure(s, 0.0).ok,
        timeout_s=timeout_s,
        interval_s=interval_s,
        sleep=sleep,
        monotonic=monotonic,
    )
    return measure(s, waited)


# -- the child: allocates with torch ------------------------------------------------------------


def run_child(
    steps: Sequence[int],
    allocate: Callable[[int], object],
    reserved: Callable[[], int],
    stdin: IO[str],
    stdout: IO[str],
) -> int:
    """Allocate up to each cumulative step on "NEXT", answering "STEP <target> <reserved>"."""
    held: list[object] = []
    total = 0
    print(f"READY {os.getpid()} {reserved()}", file=stdout, flush=True)
    for target in steps:
        if stdin.readline().strip() != "NEXT":
            return 0
        if target > total:
            held.append(allocate(target - total))
            total = target
        print(f"STEP {target} {reserved()}", file=stdout, flush=True)
    stdin.readline()  # hold the memory until killed, or until the parent goes away
    return 0


def child_main(steps: Sequence[int]) -> int:
    import torch

    dev = torch.device("cuda:0")
    torch.zeros(1, device=dev)  # the CUDA context, before the baseline is taken
    torch.cuda.synchronize(dev)

    def allocate(n: int) -> object:
        t = torch.empty(n, dtype=torch.uint8, device=dev)
        torch.cuda.synchronize(dev)
        return t

    return run_child(
        steps, allocate, lambda: int(torch.cuda.memory_reserved(dev)), sys.stdin, sys.stdout
    )


# -- the parent: the real checks ----------------------------------------------------------------


def start_child(steps: Sequence[int], uuid: str, log: IO[str]) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = uuid  # the child's cuda:0 is NVML's GPU, whatever the order
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # plain cudaMalloc per step, no expandable segments
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", ",".join(map(str, steps))]
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        start_new_session=True,
    )


def kill_child(child: subprocess.Popen[str]) -> None:
    # the whole group: anything the child started goes too
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=30)


def smi_median_s(runs: int) -> float | None:
    argv = ["nvidia-smi", f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits"]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            subprocess.run(argv, check=True, capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def call_breakdown(index: int, n: int) -> list[tuple[str, float | None]]:
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    calls: dict[str, Callable[[], object]] = {
        "nvmlDeviceGetMemoryInfo_v2": lambda: pynvml.nvmlDeviceGetMemoryInfo(
            h, version=pynvml.nvmlMemory_v2
        ),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetPerformanceState": lambda: pynvml.nvmlDeviceGetPerformanceState(h),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: (
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        ),
        "nvmlDeviceGetTotalEccErrors": lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(
            h
        ),
    }
    out: list[tuple[str, float | None]] = []
    for name in HOT_CALLS:
        try:
            out.append((name, median_seconds(calls[name], n)))
        except Exception:  # an older binding or driver lacks it
            out.append((name, None))
    for name, slow, reps in (
        (
            "nvmlDeviceGetPcieThroughput (off the hot poll)",
            lambda: pynvml.nvmlDeviceGetPcieThroughput(h, 0),
            10,
        ),
        (
            "nvmlDeviceGetTotalEnergyConsumption (off the hot poll)",
            lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
            20,
        ),
    ):
        try:
            out.append((name, median_seconds(slow, reps)))
        except Exception:  # an older binding or driver lacks it
            out.append((name, None))
    return out


def parent_main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryFile("w+") as child_log:
        return run_checks(args, child_log)


def run_checks(args: argparse.Namespace, child_log: IO[str]) -> int:
    ensure_loadwatch_importable()
    from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
    from loadwatch.daemon.sources.gpu.nvml import NvmlSource
    from loadwatch.daemon.supervise.orphans import check_orphans

    checks = Checks()
    steps = [int(float(x) * GIB) for x in args.steps_gib.split(",")]
    source = NvmlSource(logger=lambda line: print(f"log: {line}", flush=True))
    child: subprocess.Popen[str] | None = None
    try:
        first = source.poll()
        if not first.source_up:
            print(f"FAIL nvml-init: {first.error}")
            return 2
        print(f"NVML up: {len(first.samples)} GPU(s)")
        checks.add(
            "xid-events", source.xid_status is None, source.xid_status or "registered, watched"
        )
        print(
            format_table(
                (
                    "gpu",
                    "name",
                    "cc",
                    "bus id",
                    "used GiB",
                    "total GiB",
                    "reserved GiB",
                    "W",
                    "C",
                    "P",
                ),
                [
                    (
                        s.index,
                        s.name,
                        s.compute_capability,
                        s.pci_bus_id,
                        gib(s.memory_used_bytes),
                        gib(s.memory_total_bytes),
                        gib(s.memory_reserved_bytes),
                        s.power_watts,
                        s.temperature_celsius,
                        s.pstate,
                    )
                    for s in first.samples
                ],
            )
        )
        target = next((s for s in first.samples if s.index == args.gpu), None)
        if target is None or target.uuid is None or target.memory_total_bytes is None:
            print(f"FAIL gpu-select: GPU {args.gpu} not readable")
            return 2
        checks.add(
            "static-facts",
            target.compute_capability is not None and target.name is not None,
            f"{target.name} cc={target.compute_capability} bus={target.pci_bus_id}",
        )
        free = (
            target.memory_total_bytes
            - (target.memory_used_bytes or 0)
            - (target.memory_reserved_bytes or 0)
        )
        steps = [s for s in steps if s <= free - 2 * GIB]
        print(f"steps (GiB): {[s / GIB for s in steps]}")
        before_used = target.memory_used_bytes or 0

        child = start_child(steps, target.uuid, child_log)
        reader = LineReader(child.stdout)  # type: ignore[arg-type]
        ready = reader.expect("READY", max(120.0, args.wait_s * 4))  # torch import + CUDA init
        pid, reserved0 = int(ready[0]), int(ready[1])
        # the child's CUDA context alone is the baseline the steps are measured from
        s0, listed, _ = wait_sample(
            source, args.gpu, lambda s: process_bytes(s, pid) is not None, timeout_s=args.wait_s
        )
        base_used = s0.memory_used_bytes or 0
        base_proc = process_bytes(s0, pid) or 0
        checks.add(
            "child-listed",
            listed,
            f"pid {pid} holds {gib(base_proc)} GiB (CUDA context)"
            + ("" if listed else "; not in NVML's process list (another pid namespace?)"),
        )

        rows = []
        for target_bytes in steps:
            child.stdin.write("NEXT\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            _, reserved = reader.expect("STEP", args.wait_s * 6)
            expected = int(reserved) - reserved0
            t = track(source, args.gpu, pid, base_used, base_proc, expected, timeout_s=args.wait_s)
            rows.append(
                (
                    gib(target_bytes),
                    gib(expected),
                    gib(t.device_delta),
                    gib(t.process_delta),
                    f"{tolerance_bytes(expected) / MIB:.0f}",
                    f"{t.waited_s:.2f}",
                    "ok" if t.ok else "FAIL",
                )
            )
            checks.add(
                f"track-{target_bytes / GIB:g}GiB",
                t.ok,
                f"expected +{gib(expected)} GiB, device +{gib(t.device_delta)}, process +{gib(t.process_delta)}",
            )
        print(
            format_table(
                ("step GiB", "torch GiB", "device d GiB", "process d GiB", "tol MiB", "wait s", ""),
                rows,
            )
        )

        # cost of a poll, measured while the child holds memory (a non-empty process list)
        n_gpus = len(first.samples)
        poll_s = median_seconds(source.poll, args.polls)
        guarded = GuardedGpuSource(source, deadline_s=5.0)
        guarded_s = median_seconds(guarded.poll, max(args.polls // 5, 10))
        smi_s = smi_median_s(args.smi_runs)
        per_gpu_us = poll_s / n_gpus * 1e6
        print(
            format_table(
                ("measure", "median", "per GPU"),
                [
                    (
                        f"NvmlSource.poll() x{args.polls}",
                        f"{poll_s * 1e6:.1f} us",
                        f"{per_gpu_us:.1f} us",
                    ),
                    (
                        "GuardedGpuSource.poll()",
                        f"{guarded_s * 1e6:.1f} us",
                        f"{guarded_s / n_gpus * 1e6:.1f} us",
                    ),
                    (
                        f"nvidia-smi --query-gpu x{args.smi_runs}",
                        "n/a" if smi_s is None else f"{smi_s * 1e3:.1f} ms",
                        "",
                    ),
                    (
                        "ratio nvidia-smi / poll",
                        "n/a" if smi_s is None else f"{smi_s / poll_s:.0f}x",
                        "",
                    ),
                ],
            )
        )
        print(
            format_table(
                ("call (one GPU)", "median us"),
                [
                    (name, "n/a" if s is None else f"{s * 1e6:.1f}")
                    for name, s in call_breakdown(args.gpu, args.polls)
                ],
            )
        )
        checks.add(
            "poll-cost",
            per_gpu_us <= POLL_GOAL_US_PER_GPU,
            f"{per_gpu_us:.1f} us per GPU (goal <= {POLL_GOAL_US_PER_GPU:g} us)",
        )

        kill_child(child)

        def back(s: Any) -> bool:
            used = s.memory_used_bytes
            return (
                process_bytes(s, pid) is None and used is not None and within(used - before_used, 0)
            )

        after, released, waited = wait_sample(source, args.gpu, back, timeout_s=args.wait_s * 3)
        delta = None if after.memory_used_bytes is None else after.memory_used_bytes - before_used
        checks.add(
            "released",
            released,
            f"device {gib(delta)} GiB from before the child after {waited:.2f} s; "
            f"pid listed: {process_bytes(after, pid) is not None}",
        )
        report = check_orphans(source.poll(), {pid, child.pid})
        checks.add("orphans", report.clean, report.summary())
        for h in report.unknown:
            print(
                f"note: other holder pid {h.pid} on GPU {h.gpu_index}: {gib(h.used_bytes)} GiB {h.cmdline or ''}"
            )
    except Exception as exc:  # whatever broke, the child still goes and the verdict is printed
        if not isinstance(exc, TimeoutError | EOFError | RuntimeError | OSError):
            traceback.print_exc()
        checks.add("run", False, f"{type(exc).__name__}: {exc}")
    finally:
        if child is not None:
            kill_child(child)
        source.close()
        child_log.seek(0)
        tail = child_log.read()[-2000:]
        if checks.failed and tail.strip():
            print("child stderr (tail):\n" + tail)
    print(
        f"{'PASS' if not checks.failed else 'FAIL'}: {len(checks.results) - len(checks.failed)}"
        f"/{len(checks.results)} checks passed"
        + (f"; failed: {', '.join(checks.failed)}" if checks.failed else "")
    )
    return 1 if checks.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to allocate on")
    ap.add_argument("--steps-gib", default="0,2,4,8,16", help="cumulative allocation steps")
    ap.add_argument("--polls", type=int, default=1000, help="polls timed for the median")
    ap.add_argument("--smi-runs", type=int, default=20, help="nvidia-smi runs timed")
    ap.add_argument(
        "--wait-s", type=float, default=10.0, help="how long each reading may take to settle"
    )
    ap.add_argument("--timeout-s", type=int, default=480, help="the whole run's limit")
    ap.add_argument("--child", metavar="STEPS", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main([int(x) for x in args.child.split(",") if x])

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"the whole run passed {args.timeout_s} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.timeout_s)
    try:
        return parent_main(args)
    finally:
        signal.alarm(0)


if __name__ == "__main__":
    sys.exit(main())
