"""A simulated vLLM server for `loadwatch demo` and the tests: a real process that behaves as one.

    python -m loadwatch.daemon.sim.vllm_server --model DIR [--scenario S] [--speed X] [--port P]
                                       [--tensor-parallel-size N] [--shards N]

It prints what vLLM prints while it loads a Kimi-K2.5-NVFP4-like checkpoint (daemon/sim/kimilog.py),
sped up `--speed` times, with one worker process per tensor-parallel rank as vLLM has (they hold
no GPU, they only exist to be found and stopped), answers `GET /health` once it is ready, and
on SIGTERM logs its shutdown, ends its workers and exits 0. Scenarios:

- success: load, get ready, serve until stopped;
- stall: the load stops printing at 40% and the process hangs;
- oom: a CUDA out-of-memory traceback at 75% of the load, exit 1;
- crash-loop: an NCCL error right at start, exit 1, every time;
- fp8-kv-on-sm120: fails like vLLM on an SM120 GPU with an FP8 KV-cache checkpoint (no MLA
  backend takes it), exit 1 -- as long as the start's KV cache is FP8: the model directory
  declares one and `--kv-cache-dtype` is `auto` (or an FP8 one); once `loadwatch patch-model
  --drop-fp8-kv-cache` removed the declaration, or with `--kv-cache-dtype bfloat16`, the load
  succeeds, as vLLM's does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loadwatch.daemon.sim.kimilog import Prefixes, RealClock, Shape, serving, shutdown, startup
from loadwatch.daemon.sources.model.modelfiles import ModelFileError, read_json

SCENARIOS = ("success", "stall", "oom", "crash-loop", "fp8-kv-on-sm120")


class _Stop(Exception):
    pass


def _on_term(signum: int, frame: Any) -> None:
    # A stop often comes as several signals at once (to the group, then to each process): ignore
    # the rest before unwinding, or the second would interrupt the shutdown the first started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise _Stop


def _kv_cache_dtype(flag: str, model: Path) -> str | None:
    """The quantized KV-cache dtype this start uses (vLLM >= 0.12: `auto` follows the checkpoint),
    or None for the model's dtype."""
    if flag == "auto":
        return "fp8" if _declares_fp8_kv(model) else None
    return flag if flag.startswith(("fp8", "nvfp4")) else None


def _declares_fp8_kv(model: Path) -> bool:
    for name, keys in (("hf_quant_config.json", ("quantization", "kv_cache_quant_algo")),):
        try:
            doc = read_json(model, name)
        except (OSError, ModelFileError):
            continue
        node: Any = doc
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, str) and node.upper().startswith("FP8"):
            return True
    try:
        cfg = read_json(model, "config.json")
    except (OSError, ModelFileError):
        return False
    q = (cfg.get("quantization_config") if isinstance(cfg, dict) else None) or {}
    return isinstance(q, dict) and bool(q.get("kv_cache_scheme") or q.get("kv_cache_quant_algo"))


_OUT_LOCK = threading.Lock()


class _Health(BaseHTTPRequestHandler):
    """What a ready vLLM answers that loadwatch asks: `/health`, and for the servable check the
    OpenAI routes' shapes (`/v1/models` lists the served model, `/v1/completions` answers one
    choice)."""

    served_model = "model"

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": self.served_model, "object": "model"}]})
            return
        code = 200 if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        try:
            model = json.loads(self.rfile.read(min(size, 1 << 20)) or b"{}").get("model")
        except (ValueError, AttributeError):
            model = None
        if self.path != "/v1/completions":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if isinstance(model, str) and model != self.served_model:
            # vLLM 0.32's line for a model it does not serve (openai/chat_completion/serving.py
            # `logger.error("Error with model %s", ...)`): text the client chose, in the log
            stamp = time.strftime("%m-%d %H:%M:%S")
            line = (
                f"(APIServer pid={os.getpid()}) ERROR {stamp} [serving.py:274] Error with model "
                f"error=ErrorInfo(message='The model `{model}` does not exist. Valid aliases: "
                "<path>', type='NotFoundError', param='model', code=404)\n"
            )
            with _OUT_LOCK:
                sys.stdout.write(line.replace("\r", " ").replace("\n", " ").rstrip() + "\n")
                sys.stdout.flush()
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._json({"object": "text_completion", "choices": [{"index": 0, "text": " "}]})

    def _json(self, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _workers(n: int) -> list[int]:
    pids = []
    # A SIGTERM between fork and the child's own handler must not run the parent's handler in it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:  # a worker: wait to be ended
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                try:
                    while True:
                        signal.pause()
                finally:
                    os._exit(0)
            pids.append(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return pids


def _end(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="simvllm", description="A simulated vLLM server.")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--scenario", choices=SCENARIOS, default="success")
    ap.add_argument(
        "--scenario-file", type=Path, help="read the scenario from this file at start (it wins)"
    )
    ap.add_argument("--speed", type=float, default=15.0)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--tensor-parallel-size", type=int, default=8)
    ap.add_argument("--shards", type=int, default=None, help="default: the model's shard count")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument(
        "--leave-workers",
        action="store_true",
        help="on a failure, exit without ending the workers (a main process that dies first)",
    )
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    if args.scenario_file is not None:
        # a supervised run's command is fixed; a file lets each restart play another scenario
        wanted = args.scenario_file.read_text().strip() if args.scenario_file.exists() else ""
        if wanted in SCENARIOS:
            args.scenario = wanted
    shards = args.shards or len(list(args.model.glob("*.safetensors"))) or 119
    shape = Shape(
        model=str(args.model),
        shards=shards,
        workers=args.tensor_parallel_size,
        layers=args.layers,
        port=args.port,
        kv_cache_dtype=_kv_cache_dtype(args.kv_cache_dtype, args.model),
    )
    rng = random.Random(args.seed if args.seed is not None else os.getpid())
    out = sys.stdout
    clock = RealClock(args.speed, flush=out.flush)
    prefixes = Prefixes(rng, shape.workers, shape.coloured)
    workers = _workers(shape.workers - 1)
    server: ThreadingHTTPServer | None = None
    try:
        fail: str | None = None
        fail_at = 0
        stall_at: int | None = None
        if args.scenario == "crash-loop":
            fail = "nccl"
        elif args.scenario == "oom":
            fail, fail_at = "oom", max(1, shards * 3 // 4)
        elif args.scenario == "stall":
            stall_at = max(1, shards * 2 // 5)
        elif (
            args.scenario == "fp8-kv-on-sm120"
            and args.kv_cache_dtype in ("auto", "fp8", "fp8_e4m3")
            and _declares_fp8_kv(args.model)
        ):
            fail = "fp8_kv"
        lines: Iterator[str] = startup(
            rng,
            clock,
            shape,
            fail=fail,
            fail_at_shard=fail_at,
            stall_at_shard=stall_at,
            prefixes=prefixes,
        )
        for line in lines:
            out.write(line)
        out.flush()
        if fail is not None:
            time.sleep(0.2)
            if args.leave_workers:
                workers = []  # (not ended: the supervisor finds them alive after the exit)
            return 1
        if stall_at is not None:
            while True:
                time.sleep(3600)
        _Health.served_model = str(args.model)
        server = ThreadingHTTPServer((args.host, args.port), _Health)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        while True:
            for line in serving(rng, clock, 40, api=prefixes.api):
                out.write(line)
            out.flush()
            clock.advance(10)
    except _Stop:
        for line in shutdown(clock, prefixes):
            out.write(line)
        out.flush()
        return 0
    finally:
        if server is not None:
            server.shutdown()
        _end(workers)


if __name__ == "__main__":
    sys.exit(main())
