#!/usr/bin/env python3
"""A stand-in for ``vllm serve``: prints a scripted vLLM-format log with timing and behaves badly
on request (crash, hang, exit 0 after a fatal engine error, ignore SIGTERM, setsid workers).

Standalone on purpose (no loadwatch imports): the supervisor must treat it as any program.
Output goes straight to the file descriptors with os.write, unbuffered, as vLLM's does through
tqdm and the logging handler; worker processes share the parent's stdout and stderr.

Scenarios (--scenario):
  serve        full startup, then serve until SIGTERM (exit 0 on SIGTERM)
  crash        load, then a CUDA OOM traceback; exit --exit-code (default 1)
  exit0-fatal  load, then EngineCore failed to start + traceback; exit 0, as real vLLM does
  hang         start the weights bar, then hang forever (a stalled load)
  exit         exit at once with --exit-code
  bulk         print about --bulk-bytes of mixed log (bars with \\r) fast, copy every byte
               written to --record, then exit 0
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MODEL = "/models/Kimi-K2.5-NVFP4"
RECORD: int | None = None


def out(data: str, fd: int = 1) -> None:
    raw = data.encode()
    view = memoryview(raw)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    if RECORD is not None:
        os.write(RECORD, raw)


def ts() -> str:
    return time.strftime("%m-%d %H:%M:%S")


def line(prefix: str, level: str, src: str, msg: str, fd: int = 1) -> None:
    out(f"{prefix}{level} {ts()} [{src}] {msg}\n", fd)


def write_pid(pid_dir: str | None, name: str) -> None:
    if not pid_dir:
        return
    tmp = Path(pid_dir) / f".{name}.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(pid_dir) / f"{name}.pid")


def gate(args: argparse.Namespace, name: str) -> None:
    """Wait until the test creates GATE_DIR/name (for tests that look at partial output)."""
    if not args.gate_dir:
        return
    path = Path(args.gate_dir) / name
    while not path.exists():
        time.sleep(0.005)


def sleep_forever() -> None:
    while True:
        time.sleep(3600)


# -- worker processes -------------------------------------------------------------------------


def worker_main(args: argparse.Namespace) -> None:
    rank = args.rank
    if args.worker_ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.setsid and rank == args.workers - 1:
        os.setsid()  # leaves the supervisor's process group, as some launchers do
        if args.grandchild:
            cmd = [sys.executable, __file__, "--role", "grandchild", "--rank", str(rank)]
            cmd += ["--pid-dir", args.pid_dir or ""]
            if args.worker_ignore_term:
                cmd.append("--worker-ignore-term")
            subprocess.Popen(cmd)
    write_pid(args.pid_dir, f"worker-{rank}")
    prefix = f"(Worker_TP{rank} pid={os.getpid()}) "
    line(
        prefix,
        "INFO",
        "parallel_state.py:1208",
        f"rank {rank} in world size {args.workers} is assigned as DP rank 0, PP rank 0, "
        f"TP rank {rank}, EP rank {rank}",
    )
    sleep_forever()


def grandchild_main(args: argparse.Namespace) -> None:
    if args.worker_ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    write_pid(args.pid_dir, f"grandchild-{args.rank}")
    sleep_forever()


def spawn_workers(args: argparse.Namespace) -> list[int]:
    pids = []
    for rank in range(args.workers):
        cmd = [sys.executable, __file__, "--role", "worker", "--rank", str(rank)]
        cmd += ["--workers", str(args.workers)]
        if args.pid_dir:
            cmd += ["--pid-dir", args.pid_dir]
        if args.worker_ignore_term:
            cmd.append("--worker-ignore-term")
        if args.setsid:
            cmd.append("--setsid")
        if args.grandchild:
            cmd.append("--grandchild")
        pids.append(subprocess.Popen(cmd).pid)
    return pids


def wait_for_workers(args: argparse.Namespace) -> None:
    """With --pid-dir, go on only once every worker is set up (setsid done, pid written), so
    tests know the whole tree exists before anything else happens."""
    if not args.pid_dir or not args.workers:
        return
    names = [f"worker-{r}.pid" for r in range(args.workers)]
    if args.setsid and args.grandchild:
        names.append(f"grandchild-{args.workers - 1}.pid")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all((Path(args.pid_dir) / n).exists() for n in names):
            return
        time.sleep(0.005)


# -- the scripted log -------------------------------------------------------------------------


def bar(desc: str, n: int, total: int, elapsed: float) -> str:
    pct = 100 * n / total if total else 100
    if n == 0:
        tail = "[00:00<?, ?it/s]"
    else:
        rate = elapsed / n if n else 0.0
        remaining = rate * (total - n)
        tail = f"[00:{int(elapsed):02d}<00:{int(remaining):02d}, {rate:5.2f}s/it]"
    return f"{desc}: {pct:3.0f}% Completed | {n}/{total} {tail}"


def startup(args: argparse.Namespace, worker_pids: list[int]) -> tuple[str, str, str]:
    me = os.getpid()
    api = f"(APIServer pid={me}) "
    core = f"(EngineCore_0 pid={me}) "
    w0 = f"(Worker_TP0 pid={worker_pids[0] if worker_pids else me}) "
    step = args.step_s
    line("", "INFO", "__init__.py:216", "Automatically detected platform cuda.")
    line(api, "INFO", "api_server.py:1839", "vLLM API server version 0.11.0")
    line(
        api,
        "INFO",
        "utils.py:233",
        f"non-default args: {{'model': '{MODEL}', 'tensor_parallel_size': {max(1, args.workers)}}}",
    )
    time.sleep(step)
    line(
        core,
        "INFO",
        "core.py:76",
        f"Initializing a V1 LLM engine (v0.11.0) with config: model='{MODEL}', dtype=torch.bfloat16, kv_cache_dtype=auto",
    )
    line(w0, "INFO", "gpu_model_runner.py:2602", f"Starting to load model {MODEL}...")
    line(w0, "INFO", "cuda.py:366", "Using Triton MLA backend.")
    time.sleep(step)
    return api, core, w0


def load_weights(args: argparse.Namespace, w0: str, stop_after: int | None = None) -> None:
    desc = "Loading safetensors checkpoint shards"
    total = args.shards
    t0 = time.monotonic()
    for n in range(total + 1):
        out(w0 + "\r" + bar(desc, n, total, time.monotonic() - t0) + "\n")
        if stop_after is not None and n >= stop_after:
            return
        if n < total:
            time.sleep(args.load_s / total)
    out(w0 + "\r" + bar(desc, total, total, time.monotonic() - t0) + "\n")  # tqdm close() redraw
    out(w0 + "\n")
    line(
        w0,
        "INFO",
        "default_loader.py:267",
        f"Loading weights took {time.monotonic() - t0:.2f} seconds",
    )
    for layer in range(2):
        for s in ("k", "v"):
            line(
                w0,
                "WARNING",
                "kv_cache.py:87",
                f"Found {s}_scale in the checkpoint (e.g. model.layers.{layer}.self_attn.{s}_scale), "
                f"but not found the expected name in the model (e.g. model.layers.{layer}.self_attn.attn.{s}_scale). "
                f"{s}_scale is not loaded.",
            )
    line(w0, "INFO", "gpu_model_runner.py:2653", "Model loading took 45.12 GiB and 5.20 seconds")


def finish_startup(args: argparse.Namespace, api: str, core: str, w0: str) -> None:
    line(core, "INFO", "gpu_worker.py:298", "Available KV cache memory: 20.50 GiB")
    line(core, "INFO", "kv_cache_utils.py:1087", "GPU KV cache size: 1,342,176 tokens")
    line(
        core,
        "INFO",
        "kv_cache_utils.py:1091",
        "Maximum concurrency for 8,192 tokens per request: 163.84x",
    )
    desc = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    out(w0 + f"\r{desc}:   0%|          | 0/67 [00:00<?, ?it/s]")
    out(f"\r{desc}:  49%|████▉     | 33/67 [00:01<00:01, 25.10it/s]")
    gate(args, "graph-bar")
    time.sleep(args.step_s)
    out(f"\r{desc}: 100%|██████████| 67/67 [00:02<00:00, 25.30it/s]\n")
    line(
        w0, "INFO", "gpu_model_runner.py:3480", "Graph capturing finished in 3 secs, took 0.45 GiB"
    )
    line(
        core,
        "INFO",
        "core.py:210",
        "init engine (profile, create kv cache, warmup model) took 25.12 seconds",
    )
    line(
        api,
        "INFO",
        "api_server.py:1912",
        f"Starting vLLM API server 0 on http://0.0.0.0:{args.port or 8000}",
    )
    line(api, "INFO", "launcher.py:34", "Available routes are:")
    out(f"{api}INFO:     Started server process [{os.getpid()}]\n")
    out(f"{api}INFO:     Waiting for application startup.\n")
    out(f"{api}INFO:     Application startup complete.\n")


def engine_failure(core: str, w0: str, oom: bool) -> None:
    src = "multiproc_executor.py:671"
    if oom:
        line(w0, "ERROR", src, "WorkerProc failed to start.", fd=2)
        for text in (
            "Traceback (most recent call last):",
            '  File "/opt/vllm/vllm/v1/executor/multiproc_executor.py", line 645, in worker_main',
            "    worker = WorkerProc(*args, **kwargs)",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
            "capacity of 94.97 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process "
            "has 93.94 GiB memory in use.",
        ):
            line(w0, "ERROR", src, text, fd=2)
    line(core, "ERROR", "core.py:708", "EngineCore failed to start.", fd=2)
    for text in (
        "Traceback (most recent call last):",
        '  File "/opt/vllm/vllm/v1/engine/core.py", line 699, in run_engine_core',
        "    engine_core = EngineCoreProc(*args, **kwargs)",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    ):
        line(core, "ERROR", "core.py:708", text, fd=2)


def bulk(args: argparse.Namespace) -> None:
    global RECORD
    RECORD = os.open(args.record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    api, core, w0 = startup(args, [])
    written = 0
    i = 0
    desc = "Capturing CUDA graphs (decode, FULL)"
    while written < args.bulk_bytes:
        i += 1
        before = os.lseek(RECORD, 0, os.SEEK_CUR)
        if i % 7 == 0:  # an animated bar: \r updates, no newline until the end
            for n in range(0, 51, 10):
                out(
                    f"\r{desc}: {2 * n:3d}%|{'█' * (n // 5):<10}| {n}/50 [00:0{n // 10}<00:00, 40.0it/s]"
                )
            out("\n")
        elif i % 5 == 0:
            out(
                w0
                + "\r"
                + bar("Loading safetensors checkpoint shards", i % 9, 8 + i % 9 // 8, 1.0)
                + "\n"
            )
        elif i % 11 == 0:
            out(
                f"{core}INFO {ts()} [loggers.py:123] multi\r\n{core}INFO {ts()} [loggers.py:123] line\n"
            )
        else:
            line(
                api,
                "INFO",
                "metrics.py:99",
                f"Avg prompt throughput: {i * 1.5:.1f} tokens/s, line {i} " + "x" * (i % 90),
            )
        written += os.lseek(RECORD, 0, os.SEEK_CUR) - before
        if i % 50 == 0:
            time.sleep(0.001)  # let the pump see several small reads
    os.close(RECORD)
    RECORD = None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--role", default="main", choices=["main", "worker", "grandchild"])
    p.add_argument("--scenario", default="serve")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--setsid", action="store_true", help="the last worker calls setsid()")
    p.add_argument("--grandchild", action="store_true", help="the setsid worker spawns a child")
    p.add_argument("--worker-ignore-term", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--pid-dir")
    p.add_argument("--gate-dir")
    p.add_argument("--step-s", type=float, default=0.01)
    p.add_argument("--load-s", type=float, default=0.05)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--record")
    p.add_argument("--bulk-bytes", type=int, default=200_000)
    args, _unknown = p.parse_known_args()  # accept vLLM's own flags and ignore them

    if args.role == "worker":
        worker_main(args)
        return 0
    if args.role == "grandchild":
        grandchild_main(args)
        return 0

    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:

        def on_term(signum: int, frame: object) -> None:
            out(f"(APIServer pid={os.getpid()}) INFO:     Shutting down\n")
            os._exit(0)

        signal.signal(signal.SIGTERM, on_term)
    write_pid(args.pid_dir, "main")
    if args.scenario == "exit":
        return args.exit_code
    if args.scenario == "bulk":
        bulk(args)
        return 0
    worker_pids = spawn_workers(args)
    wait_for_workers(args)
    api, core, w0 = startup(args, worker_pids)
    if args.scenario == "hang":
        load_weights(args, w0, stop_after=1)
        sleep_forever()
    load_weights(args, w0)
    if args.scenario in ("crash", "exit0-fatal"):
        engine_failure(core, w0, oom=args.scenario == "crash")
        return args.exit_code if args.scenario == "crash" else 0
    finish_startup(args, api, core, w0)
    if args.port:
        serve_health(args.port)
    sleep_forever()
    return 0


def serve_health(port: int) -> None:
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if self.path == "/health" else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
