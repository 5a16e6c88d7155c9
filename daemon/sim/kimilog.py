"""What vLLM prints while it loads a Kimi-K2.5-NVFP4-like checkpoint, as a script of lines.

Used by the simulated vLLM of `loadwatch demo` (with real time, sped up) and by the benchmarks'
log generator (with a synthetic clock). The lines follow a 2026 vLLM build byte for byte: process
prefixes, `\\r` tqdm bars with their doubled 100% line, one k/v scale warning pair per layer from
every tensor-parallel worker, milestones, uvicorn's startup lines.

A `LogClock` decides what time passes between lines: `advance(seconds)` before a line (the
simulated vLLM sleeps, the generator only counts) and `stamp()` for the header (`MM-DD HH:MM:SS`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol


class LogClock(Protocol):
    def advance(self, seconds: float) -> None: ...

    def stamp(self) -> str: ...

    def shown(self, seconds: float) -> float:
        """How long `seconds` of the script take on this clock (what tqdm would print)."""
        ...


class SyntheticClock:
    """Time that only moves when told to: a log written as fast as the disk takes it, stamped
    as vLLM stamps it (local time, `MM-DD HH:MM:SS`)."""

    def __init__(self, start_s: float = 1_795_000_000.0) -> None:
        self.t = start_s

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def shown(self, seconds: float) -> float:
        return seconds

    def stamp(self) -> str:
        return time.strftime("%m-%d %H:%M:%S", time.localtime(self.t))


class RealClock:
    """Real local time; `advance` sleeps the time divided by `speed`."""

    def __init__(self, speed: float = 1.0, flush: object = None) -> None:
        self.speed = speed
        self.flush = flush

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            if callable(self.flush):
                self.flush()
            time.sleep(seconds / self.speed)

    def shown(self, seconds: float) -> float:
        return seconds / self.speed

    def stamp(self) -> str:
        return time.strftime("%m-%d %H:%M:%S")


@dataclass(frozen=True)
class Shape:
    model: str = "/models/Kimi-K2.5-NVFP4"
    shards: int = 119
    workers: int = 8
    layers: int = 61
    shard_s: tuple[float, float] = (5.0, 11.0)  # seconds per shard, drawn uniformly
    version: str = "0.15.1"
    port: int = 8000
    kv_scales: bool = True
    kv_cache_dtype: str | None = None  # a quantized KV cache ("fp8"): vLLM says so at start-up
    # How the workers' lines reach the log. "blocks": each worker's warnings of a layer one
    # after the other (the order one process writing for all would give); "interleaved": the
    # workers are processes writing to one stream, each its own warnings in layer order, the
    # lines merged as they come.
    warnings: Literal["blocks", "interleaved"] = "blocks"
    # The weights bar: "lone_prefix": `(Worker_TP0 pid=N) ` then tqdm's `\r` then the bar, the
    # prefix a record of its own (tests/fixtures/v1-2026-sm120.log); "same_record": the prefix
    # and the bar in one record (the `\r` gone, as a log shipper that drops it writes it)
    bar: Literal["lone_prefix", "same_record"] = "lone_prefix"
    # Each process prefix coloured, `ESC[1;36m(NAME pid=N)ESC[0;0m `: what vLLM printed before
    # 2025-11 whatever the output was (tests/fixtures/v1-2025.log)
    coloured: bool = False
    # The KV cache: what profiling leaves per GPU, and the MLA latent vLLM keeps per token and
    # layer (Kimi-K2.5's config.json: kv_lora_rank 512 + qk_rope_head_dim 64), not split by TP.
    kv_available_gib: float = 13.61
    kv_latent: int = 512 + 64
    max_model_len: int = 262144  # the model's max_position_embeddings: no --max-model-len
    block_size: int = 16  # vLLM's on CUDA when --block-size is not given


def kv_cache_tokens(shape: Shape) -> tuple[int, float]:
    """(the tokens `GPU KV cache size` says, the concurrency `Maximum concurrency` says) for the
    shape's KV budget, as vLLM works them out: whole blocks of `block_size` tokens in every
    layer, each token's latent in the KV dtype (one byte for FP8, else bfloat16's two)."""
    per_token = shape.kv_latent * (1 if shape.kv_cache_dtype else 2)
    blocks = int(shape.kv_available_gib * (1 << 30)) // (
        per_token * shape.block_size * shape.layers
    )
    tokens = blocks * shape.block_size
    return tokens, tokens / shape.max_model_len


@dataclass
class Counts:
    """What a script printed: the ground truth the benchmarks compare against."""

    sessions: int = 0
    weight_updates: int = 0  # weight-bar updates, the doubled 100% line included
    shards_total: int = 0
    shards_done: int = 0
    kv_scale_warnings: int = 0
    oom_failures: int = 0
    ready: int = 0


def _rate(per_s: float) -> str:
    """tqdm's rate: `N.NNit/s`, or `N.NNs/it` below one item a second."""
    return f"{per_s:5.2f}it/s" if per_s >= 1 else f"{1 / per_s:5.2f}s/it"


def hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


# Added to every pid drawn: Linux gives no process a pid of 2**22 (PID_MAX_LIMIT) or more, so a
# simulated log never names a process running here. A daemon watching such a log looks the pid
# up; one that held a drawn pid by chance (a test machine cycles through the pids) was refused
# with a problem line, at random.
PID_BASE = 1 << 22


class Prefixes:
    def __init__(self, rng: random.Random, workers: int, coloured: bool = False) -> None:
        def prefix(name: str, pid: int) -> str:
            return f"\x1b[1;36m({name} pid={pid})\x1b[0;0m " if coloured else f"({name} pid={pid}) "

        self.api_pid = PID_BASE + rng.randint(1000, 60000)
        self.api = prefix("APIServer", self.api_pid)
        self.core = prefix("EngineCore_DP0", PID_BASE + rng.randint(1000, 60000))
        base = PID_BASE + rng.randint(1000, 60000)
        self.workers = [prefix(f"Worker_TP{i}", base + i) for i in range(workers)]


def startup(
    rng: random.Random,
    clock: LogClock,
    shape: Shape = Shape(),
    counts: Counts | None = None,
    *,
    fail: str | None = None,  # "oom", "nccl", "fp8_kv" or None
    fail_at_shard: int = 0,
    stall_at_shard: int | None = None,
    silent_worker: tuple[int, int] | None = None,
    prefixes: Prefixes | None = None,
) -> Iterator[str]:
    """One start of vLLM, to ready (or to the failure asked for). A stall stops the script.
    `silent_worker` (worker, shard): that worker prints nothing after the shard, the others
    read on to the weights' end, where the script stops (the ranks wait on the silent one)."""
    c = counts if counts is not None else Counts()
    p = prefixes or Prefixes(rng, shape.workers, shape.coloured)
    api, core, w = p.api, p.core, p.workers
    c.sessions += 1
    c.shards_total, c.shards_done = shape.shards, 0
    yield f"{api}INFO {clock.stamp()} [api_server.py:1272]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version {shape.version}\n"
    yield f"{api}INFO {clock.stamp()} [utils.py:253] non-default args: {{'model_tag': '{shape.model}', 'tensor_parallel_size': {shape.workers}}}\n"
    clock.advance(3)
    if shape.kv_cache_dtype is not None:  # as in tests/fixtures/v1-2026-sm120.log
        yield (
            f"{api}INFO {clock.stamp()} [cache.py:190] Using {shape.kv_cache_dtype} data type to "
            "store kv cache. It reduces the GPU memory footprint and boosts the performance. "
            "Meanwhile, it may cause accuracy drop without a proper scaling factor.\n"
        )
    yield f"{api}INFO {clock.stamp()} [model.py:541] Resolved architecture: KimiK25ForConditionalGeneration\n"
    yield (
        f"{api}WARNING {clock.stamp()} [model.py:1893] Default vLLM sampling parameters have been "
        "overridden by the model's `generation_config.json`: `{'temperature': 1.0}`. If this is not "
        "intended, please relaunch vLLM instance with `--generation-config vllm`.\n"
    )
    clock.advance(5)
    yield f"{core}INFO {clock.stamp()} [core.py:96] Initializing a V1 LLM engine (v{shape.version}) with config: model='{shape.model}'\n"
    if fail == "nccl":
        yield from _nccl_failure(w[min(1, len(w) - 1)], core, api, clock)
        return
    clock.advance(4)
    for i in range(shape.workers):
        yield f"{w[i]}INFO {clock.stamp()} [parallel_state.py:1208] rank {i} in world size {shape.workers} is assigned as DP rank 0, PP rank 0, TP rank {i}, EP rank {i}\n"
    clock.advance(2)
    yield f"{w[0]}INFO {clock.stamp()} [gpu_model_runner.py:4033] Starting to load model {shape.model}...\n"
    if fail == "fp8_kv":
        yield from _fp8_kv_failure(w[0], core, api, clock)
        return
    yield f"{w[0]}INFO {clock.stamp()} [cuda.py:351] Using AttentionBackendEnum.TRITON_MLA backend.\n"
    desc = "Loading safetensors checkpoint shards"
    bar = w[0] if shape.bar == "same_record" else f"{w[0]}\r"
    yield f"{bar}{desc}:   0% Completed | 0/{shape.shards} [00:00<?, ?it/s]\n"
    c.weight_updates += 1
    elapsed = 0.0
    layer = 0
    for n in range(1, shape.shards + 1):
        if stall_at_shard is not None and n > stall_at_shard:
            return  # the process hangs: nothing more is printed
        step = rng.uniform(*shape.shard_s)
        elapsed += step
        # the k/v scale warnings of the layers in this shard, from every worker
        first = layer
        while shape.kv_scales and layer < n * shape.layers // shape.shards:
            if shape.warnings == "blocks":
                clock.advance(step / 4)
                step -= step / 4
                for i in range(shape.workers):
                    if _hushed(silent_worker, i, n):
                        continue
                    for sc in ("k", "v"):
                        yield _kv_warning(w[i], clock.stamp(), layer, sc)
                        c.kv_scale_warnings += 1
            layer += 1
        if shape.warnings == "interleaved" and layer > first:
            clock.advance(step / 4)
            step -= step / 4
            for i, at, sc in _interleaved(rng, shape.workers, range(first, layer)):
                if _hushed(silent_worker, i, n):
                    continue
                yield _kv_warning(w[i], clock.stamp(), at, sc)
                c.kv_scale_warnings += 1
        clock.advance(step)
        if fail == "oom" and n == fail_at_shard:
            yield from _oom(w[0], core, api, clock)
            c.oom_failures += 1
            return
        shown = clock.shown(elapsed)
        rate = n / max(shown, 1e-6)
        remaining = (shape.shards - n) / rate
        yield f"{bar}{desc}: {100 * n // shape.shards:3d}% Completed | {n}/{shape.shards} [{hms(shown)}<{hms(remaining)}, {_rate(rate)}]\n"
        c.weight_updates += 1
        c.shards_done = n
    if silent_worker is not None:
        return
    shown = clock.shown(elapsed)
    yield f"{bar}{desc}: 100% Completed | {shape.shards}/{shape.shards} [{hms(shown)}<00:00, {_rate(shape.shards / max(shown, 1e-6))}]\n"
    c.weight_updates += 1
    yield f"{w[0]}\n"
    clock.advance(1)
    yield f"{w[0]}INFO {clock.stamp()} [default_loader.py:291] Loading weights took {shown:.2f} seconds\n"
    yield f"{w[0]}INFO {clock.stamp()} [gpu_model_runner.py:4130] Model loading took 72.05 GiB memory and {shown + clock.shown(1):.6f} seconds\n"
    clock.advance(20)
    yield f"{w[0]}INFO {clock.stamp()} [monitor.py:34] torch.compile took 14.31 s in total\n"
    clock.advance(5)
    tokens, concurrency = kv_cache_tokens(shape)
    yield f"{w[0]}INFO {clock.stamp()} [gpu_worker.py:356] Available KV cache memory: {shape.kv_available_gib:.2f} GiB\n"
    yield f"{core}INFO {clock.stamp()} [kv_cache_utils.py:1307] GPU KV cache size: {tokens:,} tokens\n"
    yield f"{core}INFO {clock.stamp()} [kv_cache_utils.py:1312] Maximum concurrency for {shape.max_model_len:,} tokens per request: {concurrency:.2f}x\n"
    clock.advance(8)
    yield f"{w[0]}INFO {clock.stamp()} [gpu_model_runner.py:5063] Graph capturing finished in 5 secs, took 0.88 GiB\n"
    yield f"{core}INFO {clock.stamp()} [core.py:272] init engine (profile, create kv cache, warmup model) took 49.57 s (compilation: 14.31 s)\n"
    clock.advance(2)
    yield f"{api}INFO {clock.stamp()} [api_server.py:1020] Starting vLLM server on http://127.0.0.1:{shape.port}\n"
    yield f"{api}INFO:     Started server process [{p.api_pid}]\n"
    yield f"{api}INFO:     Waiting for application startup.\n"
    yield f"{api}INFO:     Application startup complete.\n"
    c.ready += 1


def _hushed(silent_worker: tuple[int, int] | None, worker: int, shard: int) -> bool:
    """Whether `worker` has stopped printing by `shard` (`startup`'s `silent_worker`)."""
    return silent_worker is not None and worker == silent_worker[0] and shard > silent_worker[1]


def _kv_warning(prefix: str, stamp: str, layer: int, sc: str) -> str:
    """weight_utils.py's warning for a scale the model has no parameter for (as in
    tests/fixtures/v1-2026-sm120.log)."""
    return (
        f"{prefix}WARNING {stamp} [weight_utils.py:1398] Found {sc}_scale in the checkpoint (e.g. "
        f"language_model.model.layers.{layer}.self_attn.{sc}_scale), but not found the expected "
        f"name in the model (e.g. language_model.model.layers.{layer}.self_attn.mla_attn."
        f"{sc}_scale). {sc}_scale is not loaded.\n"
    )


def _interleaved(rng: random.Random, workers: int, layers: range) -> Iterator[tuple[int, int, str]]:
    """(worker, layer, scale) of every worker's warnings for `layers`: each worker's in its own
    order, the workers' merged at random, as processes writing to one stream are."""
    queues = [[(i, at, sc) for at in layers for sc in ("k", "v")] for i in range(workers)]
    heads = [0] * workers
    live = list(range(workers))
    while live:
        j = rng.randrange(len(live))
        i = live[j]
        yield queues[i][heads[i]]
        heads[i] += 1
        if heads[i] == len(queues[i]):
            live.pop(j)


def _oom(worker: str, core: str, api: str, clock: LogClock) -> Iterator[str]:
    ts = clock.stamp()
    src = "[multiproc_executor.py:772]"
    yield f"{worker}ERROR {ts} {src} WorkerProc hit an exception.\n"
    yield f"{worker}ERROR {ts} {src} Traceback (most recent call last):\n"
    yield f'{worker}ERROR {ts} {src}   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/executor/multiproc_executor.py", line 810, in worker_busy_loop\n'
    yield f"{worker}ERROR {ts} {src}     output = func(*args, **kwargs)\n"
    yield f"{worker}ERROR {ts} {src} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB of which 1.12 GiB is free.\n"
    yield f"{core}ERROR {ts} [core.py:946] EngineCore failed to start.\n"
    yield f"{api}RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}\n"


def _nccl_failure(worker: str, core: str, api: str, clock: LogClock) -> Iterator[str]:
    clock.advance(2)
    ts = clock.stamp()
    src = "[multiproc_executor.py:772]"
    yield f"{worker}ERROR {ts} {src} WorkerProc failed to start.\n"
    yield f"{worker}ERROR {ts} {src} Traceback (most recent call last):\n"
    yield f'{worker}ERROR {ts} {src}   File "/usr/local/lib/python3.12/dist-packages/vllm/distributed/parallel_state.py", line 1190, in init_distributed_environment\n'
    yield f"{worker}ERROR {ts} {src} torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error, NCCL version 2.27.3\n"
    yield f"{core}ERROR {ts} [core.py:946] EngineCore failed to start.\n"
    yield f"{api}RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}\n"


def _fp8_kv_failure(worker: str, core: str, api: str, clock: LogClock) -> Iterator[str]:
    clock.advance(1)
    ts = clock.stamp()
    src = "[multiproc_executor.py:772]"
    yield f"{worker}ERROR {ts} {src} WorkerProc failed to start.\n"
    yield f"{worker}ERROR {ts} {src} Traceback (most recent call last):\n"
    yield f'{worker}ERROR {ts} {src}   File "/usr/local/lib/python3.12/dist-packages/vllm/platforms/cuda.py", line 371, in get_attn_backend_cls\n'
    yield (
        f"{worker}ERROR {ts} {src} ValueError: No valid attention backend found for cuda with "
        "AttentionSelectorConfig(head_size=576, dtype=torch.bfloat16, kv_cache_dtype=fp8, use_mla=True). "
        "Reasons: {FLASH_ATTN_MLA: [compute capability not supported], FLASHMLA: [compute capability not "
        "supported], FLASHINFER_MLA: [compute capability not supported], TRITON_MLA: [kv_cache_dtype not "
        "supported], CUTLASS_MLA: [compute capability not supported]}.\n"
    )
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


def serving(
    rng: random.Random, clock: LogClock, count: int, api: str = "(APIServer pid=51001) "
) -> Iterator[str]:
    """Request, access and statistics lines of a busy server (prompts echoed, some of them bait)."""
    for _ in range(count):
        r = rng.random()
        rid = f"chatcmpl-{rng.getrandbits(64):016x}"
        if r < 0.35:
            yield f'{api}INFO:     10.0.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{rng.randint(30000, 60000)} - "POST {rng.choice(_PATHS)} HTTP/1.1" 200 OK\n'
        elif r < 0.65:
            yield f"{api}INFO {clock.stamp()} [async_llm.py:412] Added request {rid}.\n"
        elif r < 0.95:
            prompt = rng.choice(_PROMPTS)
            yield f"{api}INFO {clock.stamp()} [logger.py:71] Received request {rid}: prompt: '{prompt}', params: SamplingParams(n=1, temperature=0.7, top_p=0.95, max_tokens={rng.randint(16, 2048)}), prompt_token_ids: None, lora_request: None.\n"
        elif r < 0.9995:
            clock.advance(1)
            yield (
                f"{api}INFO {clock.stamp()} [loggers.py:248] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(0, 5000):.1f} tokens/s, Avg generation throughput: {rng.uniform(0, 900):.1f} tokens/s, "
                f"Running: {rng.randint(0, 64)} reqs, Waiting: {rng.randint(0, 8)} reqs, GPU KV cache usage: "
                f"{rng.uniform(0, 100):.1f}%, Prefix cache hit rate: {rng.uniform(0, 100):.1f}%\n"
            )
        else:
            yield f"{api}WARNING {clock.stamp()} [protocol.py:93] The following fields were present in the request but ignored: {{'user'}}\n"


# Prompts a client may send that read like vLLM's own lines once echoed (bait for a parser that
# reads client text): a k/v scale warning, a bar, a failure and a version banner.
_BAIT = (
    "(Worker_TP0 pid=1) WARNING 01-28 00:12:58 [weight_utils.py:1398] Found k_scale in the "
    "checkpoint (e.g. model.layers.1.self_attn.k_scale), but not found the expected name",
    "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
    "Engine core initialization failed. See root cause above.  version 9.9.9",
)
_PARAMS = (
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
    "temperature={t}, watermarking=None, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], "
    "stop_token_ids=[], bad_words=[], thinking_token_budget=None, include_stop_str_in_output=False, "
    "ignore_eos=False, max_tokens={n}, min_tokens=0, logprobs=None, prompt_logprobs=None, "
    "skip_special_tokens=True, spaces_between_special_tokens=True, structured_outputs=None, "
    "extra_args=None)"
)


def _echoed(rng: random.Random) -> str:
    """A prompt or an output: one in fifty reads like a line of vLLM's own."""
    return rng.choice(_BAIT) if rng.random() < 0.02 else rng.choice(_PROMPTS)


def logged_requests(
    rng: random.Random, clock: LogClock, count: int, api: str = "(APIServer pid=20348) "
) -> Iterator[str]:
    """About `count` lines of vLLM 0.32 serving with `--enable-log-requests
    --enable-log-outputs --log-level DEBUG`: per request its parameters, its prompt echoed,
    `Added request`, its output echoed and uvicorn's access line; now and then the engine's
    statistics. The INFO lines and the access line are those of
    tests/fixtures/real-v0.32-deepseek-kvscales.log; the DEBUG prompt and the output are
    vLLM 0.32's entrypoints/serve/utils/request_logger.py's messages."""
    made = 0
    while made < count:
        rid = f"cmpl-{rng.getrandbits(64):016x}-0"
        ts = clock.stamp()
        params = _PARAMS.format(t=rng.choice(("0.0", "0.7", "1.0")), n=rng.randint(4, 2048))
        prompt = _echoed(rng)
        tokens = ", ".join(str(rng.randint(1, 120000)) for _ in range(rng.randint(3, 12)))
        yield f"{api}INFO {ts} [request_logger.py:65] Received request {rid}: params: {params}, lora_request: None.\n"
        yield f"{api}DEBUG {ts} [request_logger.py:55] Request {rid} details: prompt: {prompt!r}, prompt_token_ids: [{tokens}], prompt_embeds shape: None.\n"
        yield f"{api}INFO {ts} [async_llm.py:578] Added request {rid}-{rng.getrandbits(32):08x}.\n"
        clock.advance(rng.uniform(0.0, 0.05))
        output = _echoed(rng)
        yield f"{api}INFO {clock.stamp()} [request_logger.py:108] Generated response {rid}: output: {output!r}, finish_reason: stop\n"
        path = rng.choice(_PATHS)
        status = "200 OK" if rng.random() < 0.98 else "500 Internal Server Error"
        yield f'INFO:     127.0.0.1:{rng.randint(30000, 60000)} - "POST {path} HTTP/1.1" {status}\n'
        made += 5
        if rng.random() < 0.05:
            made += 1
            yield (
                f"{api}INFO {clock.stamp()} [loggers.py:335] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(0, 5000):.1f} tokens/s, Avg generation throughput: "
                f"{rng.uniform(0, 900):.1f} tokens/s, Running: {rng.randint(0, 64)} reqs, Waiting: "
                f"{rng.randint(0, 8)} reqs, GPU KV cache usage: {rng.uniform(0, 100):.1f}%, "
                f"Prefix cache hit rate: {rng.uniform(0, 100):.1f}%\n"
            )


def shutdown(clock: LogClock, prefixes: Prefixes) -> Iterator[str]:
    """What vLLM prints after SIGTERM."""
    yield f"{prefixes.core}INFO {clock.stamp()} [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM\n"
    yield f"{prefixes.api}INFO {clock.stamp()} [launcher.py:254] [shutdown] API server: shutdown triggered\n"
    yield f"{prefixes.api}INFO:     Shutting down\n"
    yield f"{prefixes.api}INFO:     Waiting for application shutdown.\n"
    yield f"{prefixes.api}INFO:     Application shutdown complete.\n"
