"""Seeded generators of vLLM server logs in the real byte format, with the ground truth they hold.

Two shapes, as an inference host sees them:
- a load-phase log: Kimi-K2.5-like startups (119 shards, 8 tensor-parallel workers, per-layer
  k/v scale warnings from every worker, milestones, `\\r` progress bars), repeated;
- a serving-phase log: one startup, then request and access lines, periodic engine statistics,
  rare warnings, and a few restarts with fresh loads (one of them failing with a CUDA OOM).

`python bench/loggen.py load|serving PATH [--lines N] [--seed S]` writes one and prints its truth.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Truth:
    lines: int = 0  # newline-terminated lines
    sessions: int = 0
    weight_updates: int = 0  # weight-loading bar updates (tqdm lines), doubled 100% lines included
    shards_total: int = 0  # of the last session
    shards_done: int = 0  # of the last session
    kv_scale_warnings: int = 0
    oom_failures: int = 0  # CUDA OOM failures (one per crash, however many lines show it)
    ready: int = 0  # sessions that reached "Application startup complete"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class _Clock:
    def __init__(self, start: int) -> None:
        self.t = start

    def tick(self, seconds: int = 1) -> str:
        self.t += seconds
        days, rem = divmod(self.t, 86400)
        h, rem = divmod(rem, 3600)
        m, s = divmod(rem, 60)
        return f"11-{1 + days % 28:02d} {h:02d}:{m:02d}:{s:02d}"


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m:02d}:{s:02d}"


def startup(
    rng: random.Random,
    clock: _Clock,
    truth: Truth,
    *,
    shards: int = 119,
    workers: int = 8,
    layers: int = 61,
    fail_oom_at: int | None = None,
) -> Iterator[str]:
    """One vLLM start of a Kimi-K2.5-NVFP4-like checkpoint, as a 2026 build logs it."""
    api = f"(APIServer pid={rng.randint(1000, 60000)}) "
    core = f"(EngineCore_DP0 pid={rng.randint(1000, 60000)}) "
    base_pid = rng.randint(1000, 60000)
    w = [f"(Worker_TP{i} pid={base_pid + i}) " for i in range(workers)]
    truth.sessions += 1
    truth.shards_total = shards
    truth.shards_done = 0
    yield f"{api}INFO {clock.tick()} [api_server.py:1272]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version 0.15.1\n"
    yield f"{api}INFO {clock.tick()} [utils.py:253] non-default args: {{'model_tag': '/models/Kimi-K2.5-NVFP4', 'tensor_parallel_size': {workers}}}\n"
    yield f"{api}INFO {clock.tick()} [model.py:541] Resolved architecture: KimiK25ForConditionalGeneration\n"
    yield f"{core}INFO {clock.tick(5)} [core.py:96] Initializing a V1 LLM engine (v0.15.1) with config: model='/models/Kimi-K2.5-NVFP4'\n"
    for i in range(workers):
        yield f"{w[i]}INFO {clock.tick(0)} [parallel_state.py:1208] rank {i} in world size {workers} is assigned as DP rank 0, PP rank 0, TP rank {i}, EP rank {i}\n"
    yield f"{w[0]}INFO {clock.tick(3)} [gpu_model_runner.py:4033] Starting to load model /models/Kimi-K2.5-NVFP4...\n"
    yield f"{w[0]}INFO {clock.tick(0)} [cuda.py:351] Using AttentionBackendEnum.TRITON_MLA backend.\n"
    desc = "Loading safetensors checkpoint shards"
    yield f"{w[0]}\r{desc}:   0% Completed | 0/{shards} [00:00<?, ?it/s]\n"
    truth.weight_updates += 1
    elapsed = 0.0
    layer = 0
    for n in range(1, shards + 1):
        step = rng.uniform(5.0, 11.0)
        elapsed += step
        clock.tick(int(step))
        # the k/v scale warnings of the layers in this shard, from every worker
        while layer < n * layers // shards:
            for i in range(workers):
                for sc in ("k", "v"):
                    yield (
                        f"{w[i]}WARNING {clock.tick(0)} [weight_utils.py:1398] Found {sc}_scale in the "
                        f"checkpoint (e.g. language_model.model.layers.{layer}.self_attn.{sc}_scale), but not "
                        f"found the expected name in the model (e.g. language_model.model.layers.{layer}."
                        f"self_attn.mla_attn.{sc}_scale). {sc}_scale is not loaded.\n"
                    )
                    truth.kv_scale_warnings += 1
            layer += 1
        if fail_oom_at is not None and n == fail_oom_at:
            yield from _oom(w[0], core, api, clock)
            truth.oom_failures += 1
            return
        rate = n / elapsed
        remaining = (shards - n) / rate
        yield f"{w[0]}\r{desc}: {100 * n // shards:3d}% Completed | {n}/{shards} [{_hms(elapsed)}<{_hms(remaining)}, {1 / rate:5.2f}s/it]\n"
        truth.weight_updates += 1
        truth.shards_done = n
    yield f"{w[0]}\r{desc}: 100% Completed | {shards}/{shards} [{_hms(elapsed)}<00:00, {elapsed / shards:5.2f}s/it]\n"
    truth.weight_updates += 1
    yield f"{w[0]}\n"
    yield f"{w[0]}INFO {clock.tick()} [default_loader.py:291] Loading weights took {elapsed:.2f} seconds\n"
    yield f"{w[0]}INFO {clock.tick()} [gpu_model_runner.py:4130] Model loading took 72.05 GiB memory and {elapsed + 1:.6f} seconds\n"
    yield f"{w[0]}INFO {clock.tick(20)} [monitor.py:34] torch.compile took 14.31 s in total\n"
    yield f"{w[0]}INFO {clock.tick(5)} [gpu_worker.py:356] Available KV cache memory: 13.61 GiB\n"
    yield f"{core}INFO {clock.tick()} [kv_cache_utils.py:1307] GPU KV cache size: 217,728 tokens\n"
    yield f"{core}INFO {clock.tick(0)} [kv_cache_utils.py:1312] Maximum concurrency for 262,144 tokens per request: 0.83x\n"
    yield f"{w[0]}INFO {clock.tick(8)} [gpu_model_runner.py:5063] Graph capturing finished in 5 secs, took 0.88 GiB\n"
    yield f"{core}INFO {clock.tick()} [core.py:272] init engine (profile, create kv cache, warmup model) took 49.57 s (compilation: 14.31 s)\n"
    yield f"{api}INFO {clock.tick(2)} [api_server.py:1020] Starting vLLM server on http://127.0.0.1:8000\n"
    yield f"{api}INFO:     Started server process [4242]\n"
    yield f"{api}INFO:     Waiting for application startup.\n"
    yield f"{api}INFO:     Application startup complete.\n"
    truth.ready += 1


def _oom(worker: str, core: str, api: str, clock: _Clock) -> Iterator[str]:
    ts = clock.tick()
    src = "[multiproc_executor.py:772]"
    yield f"{worker}ERROR {ts} {src} WorkerProc hit an exception.\n"
    yield f"{worker}ERROR {ts} {src} Traceback (most recent call last):\n"
    yield f'{worker}ERROR {ts} {src}   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 810, in worker_busy_loop\n'
    yield f"{worker}ERROR {ts} {src}     output = func(*args, **kwargs)\n"
    yield f"{worker}ERROR {ts} {src} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB of which 1.12 GiB is free.\n"
    yield f"{core}ERROR {ts} [core.py:946] EngineCore failed to start.\n"
    yield f"{api}RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}\n"


_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
_PROMPTS = (
    "Summarise the attached report",
    "Why does my job print CUDA out of memory? Traceback (most recent call last): ERROR",
    "Translate to French: the load finished",
    "Write a haiku about GPUs",
    "WARNING: explain this log line to me",
)


def serving(rng: random.Random, clock: _Clock, count: int) -> Iterator[str]:
    """Request, access and statistics lines of a busy server."""
    api = "(APIServer pid=51001) "
    for _ in range(count):
        r = rng.random()
        rid = f"chatcmpl-{rng.getrandbits(64):016x}"
        if r < 0.35:
            yield f'{api}INFO:     10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{rng.randint(30000, 60000)} - "POST {rng.choice(_PATHS)} HTTP/1.1" 200 OK\n'
        elif r < 0.65:
            yield f"{api}INFO {clock.tick(0)} [async_llm.py:412] Added request {rid}.\n"
        elif r < 0.95:
            prompt = rng.choice(_PROMPTS)
            yield f"{api}INFO {clock.tick(0)} [logger.py:71] Received request {rid}: prompt: '{prompt}', params: SamplingParams(n=1, temperature=0.7, top_p=0.95, max_tokens={rng.randint(16, 2048)}), prompt_token_ids: None, lora_request: None.\n"
        elif r < 0.9995:
            yield (
                f"{api}INFO {clock.tick(1)} [loggers.py:248] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(0, 5000):.1f} tokens/s, Avg generation throughput: {rng.uniform(0, 900):.1f} tokens/s, "
                f"Running: {rng.randint(0, 64)} reqs, Waiting: {rng.randint(0, 8)} reqs, GPU KV cache usage: "
                f"{rng.uniform(0, 100):.1f}%, Prefix cache hit rate: {rng.uniform(0, 100):.1f}%\n"
            )
        else:
            yield f"{api}WARNING {clock.tick(0)} [protocol.py:93] The following fields were present in the request but ignored: {{'user'}}\n"


def write(lines: Iterator[str], path: Path, truth: Truth) -> None:
    with path.open("wb") as f:
        for line in lines:
            data = line.encode()
            truth.lines += data.count(b"\n")
            f.write(data)


def load_log(path: Path, lines: int = 200_000, seed: int = 1) -> Truth:
    rng = random.Random(seed)
    clock = _Clock(86400 * 3)
    truth = Truth()

    def gen() -> Iterator[str]:
        produced = 0
        while produced < lines:
            for line in startup(rng, clock, truth):
                produced += line.count("\n")
                yield line

    write(gen(), path, truth)
    return truth


def serving_log(path: Path, lines: int = 1_000_000, seed: int = 1, restarts: int = 3) -> Truth:
    rng = random.Random(seed)
    clock = _Clock(86400 * 3)
    truth = Truth()
    per = lines // (restarts + 1)

    def gen() -> Iterator[str]:
        yield from startup(rng, clock, truth)
        for r in range(restarts + 1):
            yield from serving(rng, clock, per - 2000)
            if r < restarts:
                if r == 0:  # the first restart dies of a CUDA OOM half way, then starts cleanly
                    yield from startup(rng, clock, truth, fail_oom_at=60)
                yield from startup(rng, clock, truth)

    write(gen(), path, truth)
    return truth


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("shape", choices=("load", "serving"))
    ap.add_argument("path", type=Path)
    ap.add_argument("--lines", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.shape == "load":
        truth = load_log(args.path, args.lines or 200_000, args.seed)
    else:
        truth = serving_log(args.path, args.lines or 1_000_000, args.seed)
    print(truth.to_json())


if __name__ == "__main__":
    main()
