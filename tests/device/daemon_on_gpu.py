#!/usr/bin/env python3
"""The whole daemon on real NVIDIA GPUs: supervise a program that loads "shards" into GPU memory.

Run from the repository root on a machine with GPUs, ``nvidia-ml-py`` and ``torch``:

    python tests/device/daemon_on_gpu.py [--shards 8] [--shard-gib 4]

The supervised program prints a vLLM-format weights bar and allocates ``--shard-gib`` of GPU
memory per shard with torch, like a loader that allocates as it loads; then it says it is ready
and waits. loadwatch runs in supervise mode with the real NVML source. The script checks, from
the daemon's own /metrics and /status: GPU memory used follows the load shard by shard, the
projected final memory is close to what the load ends at (before it ends), the phase reaches
ready, and after SIGTERM the daemon exits 0, no process of the tree is left and the memory is
released. Prints PASS/FAIL lines; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "device"))
GIB = 1 << 30

LOADER = r"""
import signal, sys, time, torch
shards, per = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.init()
held = []
P = "(Worker_TP0 pid=%d) " % __import__("os").getpid()
def out(s):
    sys.stdout.write(s); sys.stdout.flush()
stamp = lambda: time.strftime("%m-%d %H:%M:%S")
out(f"INFO {stamp()} [api_server.py:1] vLLM API server version 0.15.1\n")
out(f"{P}INFO {stamp()} [gpu_model_runner.py:1] Starting to load model /m...\n")
out(f"{P}\rLoading safetensors checkpoint shards:   0% Completed | 0/{shards} [00:00<?, ?it/s]\n")
t0 = time.time()
for n in range(1, shards + 1):
    held.append(torch.empty(per << 30, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    el = int(time.time() - t0)
    out(f"{P}\rLoading safetensors checkpoint shards: {100*n//shards:3d}% Completed | {n}/{shards} [00:{el:02d}<00:00,  0.50it/s]\n")
    time.sleep(2.0)  # the memory holds still while the bar says n
out(f"{P}INFO {stamp()} [default_loader.py:1] Loading weights took {time.time()-t0:.2f} seconds\n")
out("INFO:     Application startup complete.\n")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(1)
"""


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bytes(r.read())


def metrics(base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in get(base + "/metrics").decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def gpu0(m: dict[str, float], name: str) -> float | None:
    return next((v for k, v in m.items() if k.startswith(name + "{") and 'gpu="0"' in k), None)


def _gpu_holders() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(f.startswith("/dev/nvidia") for f in fds):
            out.append(f"pid {proc.name}: {cmd[:160]}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-gib", type=int, default=4)
    args = ap.parse_args()
    from nvml_track import ensure_loadwatch_importable

    ensure_loadwatch_importable()
    import loadwatch

    shim = str(Path(loadwatch.__path__[0]).parent)
    import pynvml

    from loadwatch.daemon.tools.demo import free_port, make_model_dir

    pynvml.nvmlInit()  # GPU 0 before anything starts: what the stop must get back to
    start_used = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
    pynvml.nvmlShutdown()
    work = Path(tempfile.mkdtemp(prefix="loadwatch-gpu-"))
    model = make_model_dir(work, fp8_kv=False, shards=args.shards, total_bytes=args.shards * 10**9)
    (work / "loader.py").write_text(LOADER)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([shim, os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "loadwatch.daemon.cli",
        "run",
        "--gpu",
        "nvml",
        "--state-dir",
        str(work / "state"),
        "--listen",
        f"127.0.0.1:{port}",
        "--model-dir",
        str(model),
        "--",
        sys.executable,
        str(work / "loader.py"),
        str(args.shards),
        str(args.shard_gib),
    ]
    daemon = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    results: list[tuple[str, bool, str]] = []
    rows: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                m = metrics(base)
                break
            except OSError:
                time.sleep(0.2)
        seen: dict[int, float] = {}
        projected_mid: float | None = None
        deadline = time.monotonic() + 30 + 4 * args.shards
        while time.monotonic() < deadline:
            m = metrics(base)
            done = int(m.get("loadwatch_load_shards_done", -1))
            used = gpu0(m, "loadwatch_gpu_memory_used_bytes")
            if done >= 0 and used is not None:
                seen[done] = used
            if done == args.shards // 2:
                projected_mid = gpu0(m, "loadwatch_gpu_memory_projected_bytes") or projected_mid
            if m.get("loadwatch_load_ready") == 1.0:
                break
            time.sleep(0.25)
        m = metrics(base)
        final_used = gpu0(m, "loadwatch_gpu_memory_used_bytes") or 0.0
        for done, used in sorted(seen.items()):
            rows.append(f"  shards {done:2d}/{args.shards}: GPU 0 used {used / GIB:7.2f} GiB")
        # each shard the bar reports adds what the loader allocated for it
        deltas = [seen[d] - seen[d - 1] for d in sorted(seen) if d > 1 and d - 1 in seen]
        tol = 0.02 * args.shard_gib * GIB + (64 << 20)
        steps_ok = len(deltas) >= args.shards // 2 and all(
            abs(x - args.shard_gib * GIB) <= tol for x in deltas
        )
        results.append(
            ("tracks-load", steps_ok, f"{len(seen)} steps seen, {args.shard_gib} GiB each")
        )
        results.append(("ready", m.get("loadwatch_load_ready") == 1.0, "phase ready from the log"))
        ok_proj = projected_mid is not None and abs(projected_mid - final_used) <= 0.1 * final_used
        results.append(
            (
                "projection",
                ok_proj,
                f"projected at half way {(projected_mid or 0) / GIB:.1f} GiB, "
                f"ended at {final_used / GIB:.1f} GiB",
            )
        )
        status = json.loads(get(base + "/status"))
        gpus = status.get("gpus", [])
        results.append(
            (
                "gpus",
                bool(gpus) and all(g["health"] == "ok" for g in gpus),
                f"{len(gpus)} GPU(s): {', '.join(g['name'] or '?' for g in gpus)}",
            )
        )
        tree: set[int] = set()
        daemon.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = daemon.wait(60)
        out = daemon.stdout.read() if daemon.stdout else ""
        for line in out.splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") in ("vllm.exited", "vllm.stopped"):
                tree.update(doc.get("tree_pids") or [])
        left = [p for p in tree if Path(f"/proc/{p}").exists()]
        results.append(
            (
                "stop",
                code == 0 and not left,
                f"exit {code} in {time.monotonic() - t0:.1f} s, "
                f"{len(tree)} tree pid(s), {len(left)} left",
            )
        )
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        # the driver frees a context a moment after its process is gone: wait up to 10 s
        t_stop = time.monotonic()
        while True:
            after = pynvml.nvmlDeviceGetMemoryInfo(h).used
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            freed = after < start_used + (256 << 20) and not procs
            if freed or time.monotonic() - t_stop > 10:
                break
            time.sleep(0.1)
        pynvml.nvmlShutdown()
        if not freed:  # who still has the GPU open (NVML may not list other namespaces)
            for holder in _gpu_holders():
                rows.append(f"  holds /dev/nvidia*: {holder}")
        results.append(
            (
                "released",
                freed,
                f"GPU 0 used {after / GIB:.2f} GiB {time.monotonic() - t_stop:.1f} s after the "
                f"stop ({start_used / GIB:.2f} before the start), {len(procs)} process(es)",
            )
        )
    finally:
        if daemon.poll() is None:
            daemon.kill()
    print("\n".join(rows))
    for name, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    failed = [n for n, ok, _ in results if not ok]
    print(
        f"{'PASS' if not failed else 'FAIL'}: {len(results) - len(failed)}/{len(results)} checks passed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
