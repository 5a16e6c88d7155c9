"""A soak of vLLM start/crash cycles under the real daemon: nothing grows, every count is kept.

The daemon supervises a simulated vLLM (daemon/sim/vllm_server.py) that crashes every time, in turn at
start (an NCCL error), at the model load (FP8 KV cache refused) and three quarters into the
weights (CUDA OOM), restarted at once, for `LOADWATCH_SOAK_S` seconds (60 here; `make soak` runs
ten minutes). The vLLM log is rotated at 64 KiB meanwhile. The daemon's open file descriptors,
threads and resident memory are sampled from /proc: after a warm-up, the level at the end may
not stand above the level after the warm-up by more than a little. The start and exit counters
of /metrics must equal what the event log says happened, and when the daemon stops, no process
of any vLLM tree is left.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

from loadwatch.daemon.tools.demo import free_port, make_model_dir
from tests.reliability.proc import DaemonProc, wait_for

pytestmark = pytest.mark.waits
SOAK_S = float(os.environ.get("LOADWATCH_SOAK_S", "60"))
WARMUP_S = min(15.0, SOAK_S / 4)
WINDOW_S = min(10.0, SOAK_S / 6)
SLACK_FDS = 2
SLACK_THREADS = 2
SLACK_RSS = 8 << 20

# The vLLM command: picks the next crash from a counter file, then runs the simulated vLLM.
ROTATE = """
import runpy, sys
from pathlib import Path
counter = Path(sys.argv[1])
n = int(counter.read_text() or 0) if counter.exists() else 0
counter.write_text(str(n + 1))
scenario = ("crash-loop", "fp8-kv-on-sm120", "oom")[n % 3]
sys.argv = ["simvllm", "--scenario", scenario, *sys.argv[2:]]
runpy.run_module("loadwatch.daemon.sim.vllm_server", run_name="__main__")
"""


def _sample(pid: int) -> tuple[int, int, int]:
    """Open file descriptors, threads, resident bytes."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    threads = int(fields["Threads"])
    rss = int(fields["VmRSS"].split()[0]) * 1024
    return fds, threads, rss


def _left_over(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmd:
                out.append(int(entry))
    return out


@pytest.mark.slow  # bounded: see the module docstring
def test_start_crash_cycles_leak_nothing(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "models", fp8_kv=True, shards=4, total_bytes=4 * 10**9)
    argv = [
        sys.executable,
        "-c",
        ROTATE,
        str(tmp_path / "starts"),
        "--model",
        str(model),
        "--speed",
        "400",
        "--tensor-parallel-size",
        "2",
        "--layers",
        "4",
        "--port",
        str(free_port()),
    ]
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'state'}'\n"
        "[log]\npoll_interval_s = 0.05\n"
        "[http]\nlisten = '127.0.0.1:0'\n"
        "[gpu]\nsource = 'simulated'\npoll_interval_s = 0.2\nsimulated_count = 2\n"
        "[forecast]\nstall_floor_s = 86400\n"
        "[vllm]\n"
        f"argv = {json.dumps(argv)}\n"  # a JSON array of strings is a TOML array
        "backoff_initial_s = 0.02\nbackoff_max_s = 0.05\n"
        "crash_loop_starts = 1000\ncrash_loop_window_s = 1.0\n"
        "stop_grace_s = 3.0\npreflight = 'off'\nlog_max_bytes = 65536\nlog_keep = 2\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
    d.wait_listening()
    samples: list[tuple[float, tuple[int, int, int]]] = []
    t0 = time.monotonic()
    try:
        while (now := time.monotonic() - t0) < SOAK_S:
            samples.append((now, _sample(d.pid)))
            assert d.get("/healthz")[0] == 200
            time.sleep(0.5)  # (real: a soak samples the daemon over wall time)
        m = d.metrics()
        events = d.events()
    finally:
        code = d.stop(20)
    assert code == 0, d.stderr()

    started = sum(1 for e in events if e.get("event") == "vllm.started")
    exited = sum(1 for e in events if e.get("event") == "vllm.exited")
    # the counters say what happened, however many runs there were (they may be one apart:
    # the scrape and the event log are not read at the same instant)
    assert abs(m["loadwatch_vllm_starts_total"] - started) <= 1
    exits = sum(v for k, v in m.items() if k.startswith("loadwatch_vllm_exits_total{"))
    assert abs(exits - exited) <= 1 and m['loadwatch_vllm_exits_total{outcome="failed"}'] >= 1
    kinds = {e.get("failure_kind") for e in events if e.get("event") == "transition.failure"}
    assert {"nccl", "fp8_kv_unsupported", "cuda_oom"} <= kinds, kinds
    assert m["loadwatch_log_rotations_total"] >= 1

    def level(lo: float, hi: float, i: int) -> float:
        return statistics.median(s[i] for t, s in samples if lo <= t <= hi)

    base = [level(WARMUP_S, WARMUP_S + WINDOW_S, i) for i in range(3)]
    end = [level(SOAK_S - WINDOW_S, SOAK_S, i) for i in range(3)]
    print(
        f"\nsoak {SOAK_S:.0f} s: vLLM starts={started} exits={exited} "
        f"fds {base[0]:.0f}->{end[0]:.0f} threads {base[1]:.0f}->{end[1]:.0f} "
        f"rss {base[2] / 2**20:.1f}->{end[2] / 2**20:.1f} MiB "
        f"(max fds {max(s[0] for _, s in samples)}, max threads {max(s[1] for _, s in samples)})"
    )
    assert started >= 20, "too few cycles to say anything"
    assert end[0] <= base[0] + SLACK_FDS, f"open files grew: {base[0]} -> {end[0]}"
    assert end[1] <= base[1] + SLACK_THREADS, f"threads grew: {base[1]} -> {end[1]}"
    assert end[2] <= base[2] + SLACK_RSS, f"memory grew: {base[2]} -> {end[2]}"
    wait_for(lambda: not _left_over(str(model)), "every vLLM process to be gone", 10)
