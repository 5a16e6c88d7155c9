#!/usr/bin/env python3
"""The whole daemon on N real NVIDIA GPUs (N >= 1): per-GPU memory, OOM forecast and orphans.

Run from the repository root on a machine with GPUs, ``nvidia-ml-py`` and ``torch``:

    python tests/device/multi_gpu.py [--gpus N]

loadwatch runs as a user runs it (``loadwatch run --config FILE --gpu nvml``, supervise mode,
following the log the supervisor writes) over a loader that acts like vLLM with TP=N: one
worker process per GPU, each allocating its share of every shard with torch in step with the
weights bar that only worker 0 prints, in vLLM 0.32's format (tests/fixtures/real-v0.32-*.log).
Scenarios, each a fresh daemon:

- ``stop``: a load of 8 x 12 GiB per GPU reaches ready, then the daemon is stopped (SIGTERM):
  the orphan check must report 0 leaked, although NVML lists the exited workers for a moment.
- ``crash``: the same load, then the whole tree is SIGKILLed: 0 leaked.
- ``orphan``: the last GPU's worker leaves a grandchild (setsid, double fork: it leaves the
  tree's session, but carries the run's environment marker) holding 8 GiB on its GPU, then the
  tree is SIGKILLed. The supervisor ends what is left of the run after an exit (a process that
  keeps GPU memory after vLLM is gone is what fails the next start), so the grandchild must be
  ended by the daemon, said in a `vllm.ending_leftovers` line, its memory given back, and the orphan
  check then finds nothing leaked on any GPU.
- ``oom``: another process (not of the tree) holds most of GPU k's memory, as a stale process
  did on GPU 3 in a real report; the load (32 x 1.5 GiB per GPU) overflows GPU k and its worker
  dies of torch's own ``OutOfMemoryError``: loadwatch must predict the OOM on GPU k alone and
  before the failure, report ``cuda_oom`` naming GPU k, and project the other GPUs' final memory
  right (within 5% of what their load will reach).

Then the NVML poll cost per GPU (``NvmlSource.poll``, all N GPUs, median; goal 50 us/GPU) and
the daemon's CPU while a load is in flight (GPU polls at 1 Hz) with N GPUs. With one GPU, the
checks that need a second GPU print ``SKIP`` and say so. Prints PASS/FAIL/SKIP lines and the
figures; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "device"))
GIB = 1 << 30
POLL_GOAL_US_PER_GPU = 50.0
PROJECTION_TOLERANCE = 0.05
ORPHAN_GIB = 8

# The supervised program: an API server process and one worker per GPU (multiprocessing, spawn).
SERVER_BODY = r'''
import multiprocessing as mp, os, signal, sys, threading, time, traceback

S, G, PACE, MODE, N = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
ORPHAN_GPU, ORPHAN_GIB, MODEL, WORK = int(sys.argv[6]), int(sys.argv[7]), sys.argv[8], sys.argv[9]


def stamp():
    return time.strftime("%m-%d %H:%M:%S")


def out(s):
    sys.stdout.write(s)
    sys.stdout.flush()


@@FUNCS@@

def leave_grandchild(rank):
    """Fork a process that leaves the session, holds GPU memory and outlives the tree."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setsid()
        if os.fork():
            os._exit(0)
        import torch
        torch.cuda.set_device(rank)
        held = torch.empty(ORPHAN_GIB << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        with open(os.path.join(WORK, "grandchild.pid"), "w") as f:
            f.write(str(os.getpid()))
        os.write(w, b"held")
        os.close(w)
        time.sleep(900)
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    os.read(r, 8)
    os.close(r)


def worker(rank, step, loaded):
    P = f"(Worker_TP{rank} pid={os.getpid()}) "
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    if MODE == "orphan" and rank == ORPHAN_GPU:
        leave_grandchild(rank)  # before CUDA is initialised here: a fork after it breaks CUDA
    import torch
    torch.cuda.set_device(rank)
    torch.empty(1, device="cuda")
    if rank == 0:
        out(f"{P}INFO {stamp()} [gpu_model_runner.py:4114] Starting to load model {MODEL}...\n")
        out(f"{P}\r" + bar(0, S, 0.0))
    held = []
    t0 = time.time()
    for n in range(1, S + 1):
        try:
            held.append(torch.empty(int(G * (1 << 30)), dtype=torch.uint8, device="cuda"))
            torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            lines = ["WorkerProc failed to start.", *traceback.format_exc().rstrip().splitlines()]
            out("".join(f"{P}ERROR {stamp()} [multiproc_executor.py:772] {l}\n" for l in lines))
            step.abort()
            os._exit(1)
        try:
            step.wait(300)
        except threading.BrokenBarrierError:
            os._exit(1)
        if rank == 0:
            out(f"{P}\r" + bar(n, S, time.time() - t0))
        time.sleep(PACE)
    if rank == 0:
        took = time.time() - t0
        out(bar(S, S, took))
        out(f"{P}INFO {stamp()} [default_loader.py:501] Loading weights took {took:.2f} seconds\n")
        out(f"{P}INFO {stamp()} [gpu_model_runner.py:4206] Model loading took {S * G:.2f} GiB memory and {took:.6f} seconds\n")
    try:
        step.wait(300)
    except threading.BrokenBarrierError:
        os._exit(1)
    if rank == 0:
        loaded.set()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    P = f"(APIServer pid={os.getpid()}) "
    out(f"{P}INFO {stamp()} [api_server.py:1] vLLM API server version 0.32.0\n")
    out(f"{P}INFO {stamp()} [api_utils.py:286] non-default args: {{'model': '{MODEL}', 'tensor_parallel_size': {N}}}\n")
    ctx = mp.get_context("spawn")
    step, loaded = ctx.Barrier(N), ctx.Event()
    procs = [ctx.Process(target=worker, args=(r, step, loaded)) for r in range(N)]
    for p in procs:
        p.start()

    def stop(*_):
        for p in procs:
            p.join(60)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    while not loaded.is_set():
        if any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                p.join(30)
            sys.exit(1)
        time.sleep(0.1)
    out("INFO:     Application startup complete.\n")
    if MODE in ("crash", "orphan"):
        time.sleep(3)
        os.killpg(os.getpgid(0), signal.SIGKILL)  # the whole tree at once, as the OOM killer does
    while True:
        time.sleep(1)
'''


def interval(s: float) -> str:
    """tqdm's format_interval: [H:]MM:SS, truncated."""
    t = int(s)
    return (
        f"{t // 3600:d}:{t // 60 % 60:02d}:{t % 60:02d}"
        if t >= 3600
        else f"{t // 60:02d}:{t % 60:02d}"
    )


def bar(n: int, total: int, elapsed: float) -> str:
    """vLLM's weights bar line: tqdm with ``{desc}: {percentage:3.0f}% Completed | {n_fmt}/
    {total_fmt} [{elapsed}<{remaining}, {rate_fmt}]`` (s/it once an item takes over a second)."""
    if n == 0 or elapsed <= 0:
        tail = f"[{interval(elapsed)}<?, ?it/s]"
    else:
        rate = n / elapsed
        rfmt = f"{rate:5.2f}it/s" if 1 / rate <= 1 else f"{1 / rate:5.2f}s/it"
        tail = f"[{interval(elapsed)}<{interval((total - n) / rate)}, {rfmt}]"
    pct = 100 * n / total
    return f"Loading safetensors checkpoint shards: {pct:3.0f}% Completed | {n}/{total} {tail}\n"


SERVER = SERVER_BODY.replace(
    "@@FUNCS@@", inspect.getsource(interval) + "\n\n" + inspect.getsource(bar)
)

HOG = r"""
import sys, time, torch
torch.cuda.set_device(int(sys.argv[1]))
x = torch.empty(int(sys.argv[2]), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("held", flush=True)
time.sleep(900)
"""


# -- helpers (no GPU needed) -----------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.results: list[tuple[str, str, str]] = []

    def add(self, name: str, ok: bool, detail: str) -> bool:
        self._say("PASS" if ok else "FAIL", name, detail)
        return ok

    def skip(self, name: str, detail: str) -> None:
        self._say("SKIP", name, detail)

    def _say(self, verdict: str, name: str, detail: str) -> None:
        self.results.append((verdict, name, detail))
        print(f"{verdict} {name}: {detail}", flush=True)

    @property
    def failed(self) -> list[str]:
        return [n for v, n, _ in self.results if v == "FAIL"]


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


def read_events(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    docs = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "event" in doc:
            docs.append(doc)
    return docs


def wait_for(what: str, fn: Callable[[], Any], timeout_s: float, every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = fn()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(every_s)


def failures_of(status: dict[str, Any]) -> list[dict[str, Any]]:
    session = status.get("session") or {}
    return [f for f in session.get("failures") or [] if isinstance(f, dict)]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the daemon ------------------------------------------------------------------------------------


class Daemon:
    """``loadwatch run --config FILE --gpu nvml`` supervising the loader in one scenario."""

    def __init__(self, work: Path, name: str, argv: list[str], model: Path) -> None:
        from loadwatch.daemon.tools.demo import free_port

        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.events_path = self.dir / "events.jsonl"
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        cfg = self.dir / "loadwatch.toml"
        cfg.write_text(
            f'state_dir = "{self.dir / "state"}"\n'
            f'events_file = "{self.events_path}"\n'
            f'[log]\npath = "{self.dir / "vllm.log"}"\n'
            f'[http]\nlisten = "127.0.0.1:{port}"\n'
            "[gpu]\npoll_interval_s = 1.0\n"
            f'[model]\ndir = "{model}"\n'
            f"[vllm]\nargv = {json.dumps(argv)}\n"
            'restart = "never"\nstop_grace_s = 20\npreflight = "off"\n'
        )
        self.out = (self.dir / "daemon.out").open("w")
        cmd = [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(cfg)]
        self.proc = subprocess.Popen(
            [*cmd, "--gpu", "nvml"], env=daemon_env(), stdout=self.out, stderr=subprocess.STDOUT
        )
        wait_for("daemon /metrics", self._up, 60)

    def _up(self) -> dict[str, float]:
        if self.proc.poll() is not None:
            self.out.flush()
            raise RuntimeError(f"the daemon exited {self.proc.returncode}:\n{self.tail(15)}")
        return metrics(self.base)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        docs = read_events(self.events_path)
        return docs if name is None else [d for d in docs if d["event"] == name]

    def status(self) -> dict[str, Any]:
        return dict(json.loads(get(self.base + "/status")))

    def metrics(self) -> dict[str, float]:
        return metrics(self.base)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.out.close()

    def tail(self, n: int = 30) -> str:
        lines = (self.dir / "daemon.out").read_text(errors="replace").splitlines()[-n:]
        log = self.dir / "vllm.log"
        vlines = log.read_text(errors="replace").splitlines()[-n:] if log.exists() else []
        return "\n".join(["daemon:", *lines, "vllm.log:", *vlines])


_SHIM: str | None = None


def daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    if _SHIM:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_SHIM, env.get("PYTHONPATH", "")) if p)
    return env


# -- the GPU side ----------------------------------------------------------------------------------


def nvml_used(pynvml: Any, n: int) -> list[int]:
    return [
        int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used)
        for i in range(n)
    ]


def wait_released(pynvml: Any, n: int, baseline: list[int], timeout_s: float = 60) -> float:
    """Seconds until every GPU is back within 1 GiB of ``baseline`` (the next scenario's start)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if all(u <= b + GIB for u, b in zip(nvml_used(pynvml, n), baseline, strict=True)):
            break
        time.sleep(0.2)
    return time.monotonic() - t0


class ListingLag:
    """Watches NVML's process lists (every 10 ms, on a thread): for how long, after a process
    was gone from /proc (or a zombie), did NVML still list it? The moment the orphan check waits
    out."""

    def __init__(self, pynvml: Any, n: int) -> None:
        self._nv, self._n = pynvml, n
        self._stop = threading.Event()
        self.gone_at: dict[int, float] = {}  # pid -> first moment seen listed but gone
        self.longest_s = 0.0
        self.pids: set[int] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nv = self._nv
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(self._n)]
        while not self._stop.is_set():
            now = time.monotonic()
            for h in handles:
                try:
                    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
                except Exception:
                    continue
                for proc in procs:
                    pid = int(proc.pid)
                    if _alive(pid):
                        continue
                    since = self.gone_at.setdefault(pid, now)
                    self.pids.add(pid)
                    self.longest_s = max(self.longest_s, now - since)
            time.sleep(0.01)

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(5)
        return (
            f"NVML listed {len(self.pids)} exited process(es) for up to {self.longest_s:.2f} s "
            "after they were gone from /proc"
        )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def server_argv(
    work: Path, model: Path, mode: str, n: int, shards: int, gib: float, pace: float, orphan: int
) -> list[str]:
    script = work / "server.py"
    script.write_text(SERVER)
    return [
        sys.executable,
        str(script),
        str(shards),
        str(gib),
        str(pace),
        mode,
        str(n),
        str(orphan),
        str(ORPHAN_GIB),
        str(model),
        str(work),
    ]


def orphan_event(d: Daemon) -> dict[str, Any]:
    return wait_for("gpu.orphans event", lambda: d.events("gpu.orphans"), 60)[0]  # type: ignore[no-any-return]


def scenario_exit(c: Checks, work: Path, mode: str, n: int, pynvml: Any, base: list[int]) -> None:
    """``stop`` or ``crash``: a loaded tree ends; 0 leaked."""
    from loadwatch.daemon.tools.demo import make_model_dir

    shards, gib = 8, 12.0
    model = make_model_dir(
        work / f"m-{mode}", fp8_kv=False, shards=shards, total_bytes=shards * 10**9
    )
    d = Daemon(work, mode, server_argv(work, model, mode, n, shards, gib, 0.3, -1), model)
    try:
        wait_for("ready", lambda: d.metrics().get("loadwatch_load_ready") == 1.0, 180)
        used = nvml_used(pynvml, n)
        print(f"{mode}: loaded, GPU used GiB {[round(u / GIB, 1) for u in used]}", flush=True)
        lag = ListingLag(pynvml, n)
        if mode == "stop":
            code = d.stop()
            ev = orphan_event(d)
            print(f"figure {mode}: {lag.stop()}", flush=True)
            c.add("stop-exit", code == 0, f"daemon exit {code}")
        else:
            ev = orphan_event(d)
            print(f"figure {mode}: {lag.stop()}", flush=True)
            m = d.metrics()
            c.add(
                "crash-metric",
                m.get("loadwatch_vllm_orphans") == 0.0,
                f"loadwatch_vllm_orphans {m.get('loadwatch_vllm_orphans')}",
            )
        c.add(
            f"{mode}-orphans",
            ev.get("leaked") == 0,
            f"{ev.get('leaked')} leaked after {ev.get('waited_s')} s of re-reads "
            f"({ev.get('exiting')} exited still listed at the end): {ev.get('summary')}",
        )
    except Exception as exc:
        c.add(f"{mode}-run", False, f"{type(exc).__name__}: {exc}")
        print(d.tail())
    finally:
        d.stop()
        print(f"{mode}: memory back in {wait_released(pynvml, n, base):.1f} s", flush=True)


def scenario_orphan(c: Checks, work: Path, n: int, pynvml: Any, base: list[int]) -> None:
    from loadwatch.daemon.tools.demo import make_model_dir

    shards, gib, gpu = 8, 4.0, n - 1
    model = make_model_dir(
        work / "m-orphan", fp8_kv=False, shards=shards, total_bytes=shards * 10**9
    )
    d = Daemon(work, "orphan", server_argv(work, model, "orphan", n, shards, gib, 0.3, gpu), model)
    grandchild: int | None = None
    try:
        wait_for("ready", lambda: d.metrics().get("loadwatch_load_ready") == 1.0, 180)
        grandchild = int((work / "grandchild.pid").read_text())
        ev = orphan_event(d)
        m = d.metrics()
        ended = d.events("vllm.ending_leftovers")
        c.add(
            "orphan-ended-by-the-daemon",
            bool(ended) and not alive(grandchild),
            f"ending_leftovers lines {[e.get('reason') for e in ended]}, grandchild {grandchild} "
            f"{'alive' if alive(grandchild) else 'gone'}",
        )
        c.add(
            "orphan-none-left",
            ev.get("leaked") == 0 and m.get("loadwatch_vllm_orphans") == 0.0,
            f"{ev.get('leaked')} leaked (pids {ev.get('pids')}), loadwatch_vllm_orphans "
            f"{m.get('loadwatch_vllm_orphans')}: {ev.get('summary')}",
        )
    except Exception as exc:
        c.add("orphan-run", False, f"{type(exc).__name__}: {exc}")
        print(d.tail())
    finally:
        d.stop()
        if grandchild is not None:
            with_kill(grandchild)
        print(f"orphan: memory back in {wait_released(pynvml, n, base):.1f} s", flush=True)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def with_kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def scenario_oom(c: Checks, work: Path, n: int, pynvml: Any, base: list[int]) -> None:
    from loadwatch.daemon.tools.demo import make_model_dir

    shards, gib, pace = 32, 1.5, 1.0
    k = min(3, n - 1)
    load = shards * gib * GIB
    h = pynvml.nvmlDeviceGetHandleByIndex(k)
    info = pynvml.nvmlDeviceGetMemoryInfo(h)
    # what stays free on GPU k: 70% of the load, so it overflows at about 70% of the bar
    hog_bytes = int(info.free) - int(0.7 * load) - GIB  # a CUDA context each for hog and worker
    hog = subprocess.Popen(
        [sys.executable, "-c", HOG, str(k), str(hog_bytes)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert hog.stdout is not None
        if hog.stdout.readline().strip() != "held":
            raise RuntimeError("the hog did not take its memory")
        total = int(info.total)
        print(
            f"oom: GPU {k} has {hog_bytes / GIB:.1f} GiB taken by pid {hog.pid} (not of the tree); "
            f"each worker will load {load / GIB:.0f} GiB; GPU total {total / GIB:.1f} GiB",
            flush=True,
        )
        model = make_model_dir(
            work / "m-oom", fp8_kv=False, shards=shards, total_bytes=shards * 10**9
        )
        d = Daemon(work, "oom", server_argv(work, model, "oom", n, shards, gib, pace, -1), model)
        try:
            oom_check(c, d, n, k, shards, gib)
        except Exception as exc:
            c.add("oom-run", False, f"{type(exc).__name__}: {exc}")
            print(d.tail())
        finally:
            d.stop()
    finally:
        hog.kill()
        hog.wait()
        print(f"oom: memory back in {wait_released(pynvml, n, base):.1f} s", flush=True)


def oom_check(c: Checks, d: Daemon, n: int, k: int, shards: int, gib: float) -> None:
    first_k: dict[str, Any] | None = None  # /status when GPU k was first predicted
    others_predicted: set[int] = set()
    rows: list[str] = []
    deadline = time.monotonic() + 240
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = d.status()
        gpus = {g["index"]: g for g in status.get("gpus") or []}
        others_predicted |= {i for i, g in gpus.items() if i != k and g.get("oom_predicted")}
        if first_k is None and gpus.get(k, {}).get("oom_predicted"):
            first_k = status
        if (status.get("session") or {}).get("phase") == "failed":
            break
        time.sleep(0.5)
    session = status.get("session") or {}
    events = d.events()
    kinds = [(e["event"], e.get("gpu_index"), e.get("forecast")) for e in events]
    raised = [
        i
        for i, (ev, g, f) in enumerate(kinds)
        if ev == "transition.forecast_raised" and f == "oom_predicted"
    ]
    raised_gpus = sorted({kinds[i][1] for i in raised})
    failed_at = next((i for i, (ev, _, _) in enumerate(kinds) if ev == "transition.failure"), None)
    before = bool(raised) and failed_at is not None and min(raised) < failed_at
    frac = None
    if first_k is not None:
        progress = (first_k.get("session") or {}).get("progress") or {}
        frac = f"{progress.get('shards_done')}/{progress.get('shards_total')}"
    c.add(
        "oom-predicted",
        first_k is not None and k in raised_gpus and before,
        f"GPU {k} predicted at shard {frac}, before the failure: {before}",
    )
    fails = failures_of(status)
    named = [
        f
        for f in fails
        if f.get("kind") == "cuda_oom"
        and f"GPU {k} " in (f.get("message", "") + f.get("first_line", ""))
    ]
    c.add(
        "oom-cuda_oom-named",
        session.get("failure_kind") == "cuda_oom" and bool(named),
        f"failure_kind {session.get('failure_kind')}; "
        + (
            named[0].get("message", "")[:160]
            if named
            else f"no cuda_oom failure names GPU {k}: {fails[:2]}"
        ),
    )
    if n < 2:
        c.skip("oom-on-that-gpu-only", "needs N>=2: the overflowed GPU is the only GPU")
        c.skip("oom-others-projected", "needs N>=2: no other GPU to project")
        return
    c.add(
        "oom-on-that-gpu-only",
        raised_gpus == [k] and not others_predicted,
        f"forecast raised on GPUs {raised_gpus}; other GPUs ever predicted in /status: "
        f"{sorted(others_predicted)}",
    )
    snap = first_k or status
    done = ((snap.get("session") or {}).get("progress") or {}).get("shards_done") or 0
    worst = 0.0
    ok = True
    for g in snap.get("gpus") or []:
        if g["index"] == k:
            continue
        used, proj = g.get("memory_used_bytes"), g.get("projected_final_bytes")
        if used is None or proj is None:
            ok = False
            rows.append(f"  GPU {g['index']}: no projection (used {used})")
            continue
        expected = used + (shards - done) * gib * GIB
        err = abs(proj - expected) / expected
        worst = max(worst, err)
        ok = ok and err <= PROJECTION_TOLERANCE
        rows.append(
            f"  GPU {g['index']}: used {used / GIB:.1f} GiB at shard {done}, projected "
            f"{proj / GIB:.1f}, the load will end at {expected / GIB:.1f} ({100 * err:.1f}% off)"
        )
    print("\n".join(rows))
    c.add(
        "oom-others-projected",
        ok,
        f"worst error {100 * worst:.1f}% (tolerance {100 * PROJECTION_TOLERANCE:.0f}%) "
        f"over {n - 1} GPU(s), at shard {done}/{shards}",
    )


def poll_cost(c: Checks, n: int, polls: int) -> None:
    from loadwatch.daemon.sources.gpu.nvml import NvmlSource

    source = NvmlSource()
    try:
        source.poll()
        times = []
        for _ in range(polls):
            t0 = time.perf_counter()
            source.poll()
            times.append(time.perf_counter() - t0)
    finally:
        source.close()
    med = statistics.median(times)
    per = med / n * 1e6
    print(
        f"figure poll: NvmlSource.poll() median {med * 1e6:.1f} us over {polls} polls, {n} GPU(s)"
    )
    c.add(
        "poll-cost", per <= POLL_GOAL_US_PER_GPU, f"{per:.1f} us per GPU at N={n} (goal <= 50 us)"
    )


def daemon_cpu(c: Checks, work: Path, n: int, window_s: float) -> None:
    """Watch mode on a log whose load sits at shard 1/100: GPU polls at 1 Hz, nothing else."""
    from loadwatch.daemon.tools.demo import free_port

    d = work / "cpu"
    d.mkdir()
    log = d / "vllm.log"
    p = "(Worker_TP0 pid=4242) "
    t = time.strftime("%m-%d %H:%M:%S")  # a live log: stamped now, in local time as vLLM does
    log.write_text(
        f"(APIServer pid=4200) INFO {t} [api_server.py:1] vLLM API server version 0.32.0\n"
        f"{p}INFO {t} [gpu_model_runner.py:4114] Starting to load model /models/m...\n"
        f"{p}\r{bar(0, 100, 0.0)}{p}\r{bar(1, 100, 2.0)}"
    )
    port = free_port()
    cmd = [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--log", str(log), "--gpu", "nvml"]
    proc = subprocess.Popen(
        [*cmd, "--state-dir", str(d / "state"), "--listen", f"127.0.0.1:{port}"],
        env=daemon_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("watch daemon", lambda: metrics(base), 60)
        # /metrics answers before the first read of the log is published: wait for the load
        with contextlib.suppress(TimeoutError):  # (the check below says what was seen)
            wait_for(
                "the load read",
                lambda: json.loads(get(base + "/status")).get("phase") == "loading_weights",
                30,
            )
        phase = json.loads(get(base + "/status")).get("phase")
        time.sleep(3)
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window_s)
        c1, t1 = cpu_seconds(proc.pid), time.monotonic()
        stamps = set()
        for _ in range(20):
            g = (json.loads(get(base + "/status")).get("gpus") or [{}])[0]
            stamps.add(g.get("sampled_at"))
            time.sleep(0.25)
        share = (c1 - c0) / (t1 - t0)
        print(
            f"figure cpu: daemon {100 * share:.2f}% of one core over {t1 - t0:.0f} s, N={n}, phase "
            f"{phase}, {len(stamps)} distinct GPU samples in 5 s"
        )
        c.add(
            "daemon-cpu",
            phase == "loading_weights" and len(stamps) >= 4,
            f"{100 * share:.2f}% of one core with {n} GPU(s) polled at 1 Hz (phase {phase})",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def main() -> int:
    global _SHIM
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--gpus", type=int, default=0, help="how many GPUs (default: all)")
    ap.add_argument("--polls", type=int, default=1000, help="polls timed for the median")
    ap.add_argument("--cpu-window-s", type=float, default=20.0)
    ap.add_argument(
        "--only", default="stop,crash,orphan,oom,poll,cpu", help="scenarios to run, comma-separated"
    )
    args = ap.parse_args()
    from nvml_track import ensure_loadwatch_importable

    ensure_loadwatch_importable()
    import loadwatch

    _SHIM = str(Path(loadwatch.__path__[0]).parent)
    import pynvml

    pynvml.nvmlInit()
    count = pynvml.nvmlDeviceGetCount()
    n = args.gpus or count
    if not 1 <= n <= count:
        print(f"FAIL setup: asked for {n} GPU(s), the machine has {count}")
        return 2
    names = {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)}
    print(f"N={n} GPU(s): {sorted(map(str, names))}", flush=True)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # torch's GPU k is NVML's GPU k
    base = nvml_used(pynvml, n)
    work = Path(tempfile.mkdtemp(prefix="loadwatch-multi-"))
    c = Checks()
    only = set(args.only.split(","))
    t_start = time.monotonic()
    steps: list[tuple[str, Callable[[], None]]] = [
        ("stop", lambda: scenario_exit(c, work, "stop", n, pynvml, base)),
        ("crash", lambda: scenario_exit(c, work, "crash", n, pynvml, base)),
        ("orphan", lambda: scenario_orphan(c, work, n, pynvml, base)),
        ("oom", lambda: scenario_oom(c, work, n, pynvml, base)),
        ("poll", lambda: poll_cost(c, n, args.polls)),
        ("cpu", lambda: daemon_cpu(c, work, n, args.cpu_window_s)),
    ]
    for name, step in steps:
        if name not in only:
            continue
        try:
            step()
        except Exception as exc:  # one scenario's breakage is its FAIL line; the others still run
            c.add(f"{name}-run", False, f"{type(exc).__name__}: {exc}")
    if n < 2:
        print("not run for lack of a second GPU: OOM on one GPU alone, the other GPUs' projections")
        print("and an orphan on one GPU with nothing on the others (run again with N >= 2)")
    failed = c.failed
    print(
        f"{'PASS' if not failed else 'FAIL'}: "
        f"{sum(v == 'PASS' for v, _, _ in c.results)} passed, {len(failed)} failed, "
        f"{sum(v == 'SKIP' for v, _, _ in c.results)} skipped, N={n}, "
        f"{time.monotonic() - t_start:.0f} s" + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
