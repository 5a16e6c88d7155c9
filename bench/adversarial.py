"""Hostile records for every pattern of the grammar, and the time the parser takes on each.

    .venv/bin/python bench/adversarial.py [--size BYTES] [--top N]

Every regular expression of the parser (each catalog entry, the failure classifier, the
exception-line patterns, the launch-argument and layer patterns, the record anatomy of lines.py)
has a sample record that reaches it through the real parse path. Each sample is mutated into
records of about `--size` bytes (1 MiB by default):

- every kind of character run in it (digits, spaces, letters, each punctuation character: the
  parentheses, dots, colons, brackets...) blown up, at its first and at its last occurrence;
- its prefix up to a third, two thirds and all but one character, repeated (a near match
  begun again and again: what makes a backtracking pattern quadratic);
- the whole record repeated; a run of junk after it; process prefixes nested in front of it.

Each record goes through `ChunkScanner.feed`, as the daemon hands over what the follower read,
with a fresh parser primed with the sample's preceding records (a traceback opened, for the
exception-line patterns). The pattern is also searched directly over the mutated text, which
the parse path may never do (windows, anchors, pre-filters): a figure, not a promise.

Printed: the worst cases, and side by side in one run the time of a plain 1 MiB record without
any needle (what reading costs anyway), as a ratio. The last line is key=value pairs. Nothing is
asserted here; tests/reliability/test_adversarial.py runs the same cases smaller with a bound.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

from loadwatch.parsers import ChunkScanner, EventStream, traceback
from loadwatch.parsers.entries import (
    BARE,
    FAILURE,
    MESSAGE,
    WARNING,
    Entry,
)
from loadwatch.parsers.vllm import builders, catalog, lines
from loadwatch.parsers.vllm.catalog import (
    CATALOG,
)

MB = 1 << 20
REF_TS = 1796083200.0
PREFIX = "(Worker_TP0 pid=4242) "
STAMP = "11-30 10:00:00"

# Bodies for the entries no recorded log holds; the rest come from these too, so that the cases
# do not depend on the fixtures.
ENTRY_BODIES: dict[str, str] = {
    "progress.tqdm": "Loading safetensors checkpoint shards:  42% Completed | 50/119 [06:12<08:33, 7.45s/it]",
    # vllm-log-formats.md section 9, InstantTensor's bar after vLLM PR #46868
    "progress.tqdm_bytes": "Loading safetensors using InstantTensor loader:   9% Completed | 13.3G/155G [00:01<00:10, 14.3GB/s]",
    "progress.prefetch": "Prefetching checkpoint files: 10% (12/119)",
    # vllm-project/vllm#46367: FlashInfer's autotuner bar
    "progress.autotuner": "[AutoTuner]: Tuning flashinfer::trtllm_fp8_block_scale_moe:   5%|▍         | 1/21 [00:00<00:06,  3.29profile/s]",
    "warn.kv_scale_missing": "Found k_scale in the checkpoint (e.g. model.layers.3.self_attn.k_scale), but not found the expected name in the model (e.g. model.layers.3.self_attn.attn.k_scale). k_scale is not loaded.",
    "warn.kv_scale_deprecated": "DEPRECATED. Found kv_scale in the checkpoint. This format is deprecated in favor of separate k_scale and v_scale tensors and will be removed in a future release.",
    "warn.kv_scale_default": "Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues.",
    "warn.q_scale_from_k": "Checkpoint does not provide a q scaling factor. Setting it to k_scale.",
    "warn.q_prob_scale_default": "Using Q scale 1.0 and prob scale 1.0 with fp8 attention. This may cause accuracy issues.",
    "ms.version": "vLLM API server version 0.8.3, serving model /models/Llama-3.1-8B",
    "ms.version_logo": " \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version 0.32.0",
    "ms.launch_args": "non-default args: {'model_tag': '/models/m', 'kv_cache_dtype': 'fp8', 'tensor_parallel_size': 8}",
    "ms.model_load_start": "Starting to load model /models/Llama-3.1-405B-FP8...",
    "ms.checkpoint_info": "Filesystem type for checkpoints: EXT4. Checkpoint size: 1.12 GiB. Available RAM: 21.80 GiB.",
    "ms.gguf_shards": "Discovered 3 GGUF shard files",
    # vLLM's format string (default_loader.py, PR #37136) with a deployment's values
    "ms.ep_weight_filter": "EP weight filter: ep_size=8, ep_rank=0, loading 32/256 experts",
    "node.parallel_init": "world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.0.1.1:29501 backend=nccl",
    "node.headless_tp_pp": "Launching vLLM (v0.32.0) headless multiproc executor, with head node address 127.0.0.1:29611 for torch.distributed process group.",
    "node.headless_dp": "Launching 1 data parallel engine(s) in headless mode, with head node address tcp://10.10.71.96:29550.",
    "ms.attention_backend": "Using AttentionBackendEnum.TRITON_MLA backend.",
    "ms.model_init": "Initializing model took 0.350298 seconds",
    "ms.weights_loaded": "Loading weights took 3.82 seconds",
    "ms.model_memory": "Model loading took 16.0953 GiB and 4.550321 seconds",
    "ms.compile_cache_dir": "Using cache directory: /root/.cache/vllm/torch_compile_cache/8c1e3d/rank_0_0/backbone for vLLM's torch.compile",
    "ms.compile_dynamo": "Dynamo bytecode transform time: 18.47 s",
    "ms.compile_graph": "Compiling a graph for dynamic shape takes 50.88 s",
    "ms.compile_cache_load": "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 6.711 s",
    "ms.compile_total": "torch.compile takes 69.35 s in total",
    # vllm-project/vllm#35061 (backends.py), and vllm/compilation/decorators.py's AOT lines
    "ms.compile_cache_save": "Cache the graph of compile range (1, 32768) for later use",
    "ms.compile_aot_load": "Directly load AOT compilation from path /root/.cache/vllm/torch_compile_cache/torch_aot_compile/8fc6bc4f/rank_0_0/model",
    "ms.compile_aot_save": "saving AOT compiled function to /tmp/cache/vllm/torch_compile_cache/torch_aot_compile/082f3e10/rank_0_0/model",
    # vllm/compilation/monitor.py (PR #36098)
    "ms.profiling_run": "Initial profiling/warmup run took 117.91 s",
    "ms.kv_available": "Available KV cache memory: 51.77 GiB",
    "ms.kv_explicit": "Explicitly set (1.0/10.96) GiB for KV cache on node 0.",
    "ms.kv_dtype": "Using fp8_e4m3 data type to store kv cache. It reduces the GPU memory footprint.",
    "ms.kv_size": "CPU KV cache size: 155,344 tokens, Maximum concurrency for 512 tokens per request: 303.41x",
    "ms.kv_blocks": "# GPU blocks: 61234, # CPU blocks: 8738",
    "ms.kv_concurrency": "Maximum concurrency for 262,144 tokens per request: 0.83x",
    "ms.graph_capture": "Graph capturing finished in 7 secs, took 0.55 GiB",
    "ms.engine_init": "init engine (profile, create kv cache, warmup model) took 49.57 s (compilation: 14.31 s)",
    "ms.runai_stream": "[RunAI Streamer] Overall time to stream 3.3 GiB of all files: 0.94s, 3.5 GiB/s",
    "ms.engine_config": "Initializing a V1 LLM engine (v0.10.1.1) with config: model='/models/DeepSeek-V3'",
    "ms.api_server": "Starting vLLM server on http://127.0.0.1:8321",
    "ms.uvicorn_running": "Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
    "ms.routes": "Available routes are:",
    "ms.uvicorn_started": "Started server process [22386]",
    "ms.app_waiting": "Waiting for application startup.",
    "ms.app_complete": "Application startup complete.",
    "ms.shutdown": "[shutdown] Executor: waiting for worker exit count=1",
    "stall.shm_broadcast": "No available shared memory broadcast block found in 60 seconds.",
    "fail.engine_core_start": "EngineCore failed to start.",
    "fail.engine_fatal": "Worker proc VllmWorker-0 died unexpectedly, shutting down executor.",
    "fail.error_executing": "Error executing method 'load_model'. This might cause deadlock in distributed execution.",
    "fail.bare_exception": "ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB KV cach",
    "fail.cuda_check": "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:164 'invalid argument'",
    "fail.classified": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB of which 1.12 GiB is free.",
}

TRACEBACK = "Traceback (most recent call last):"
# The other patterns: (name, pattern, the records that reach it; the last one is mutated).
OTHER: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    *(
        (f"classify.{kind}", pattern, (f"{PREFIX}ERROR {STAMP} [core.py:1] {text}",))
        for (pattern, kind), text in zip(
            catalog._CLASSIFY,
            (
                # (tests/fixtures/real-v0.32-zmq-ipc-path-too-long.log)
                "zmq.error.ZMQError: ipc path \"/tmp/r2real/sweeps/llama-tiny-max_model_len-512-max_num_seqs-4/run-0001/scratch/44c821ad-8d5e-4ae9-94b4-17aec908eeae\" is longer than 107 characters (sizeof(sockaddr_un.sun_path)). zmq.IPC_PATH_MAX_LEN constant can be used to check addr length (if it is defined). (addr='ipc:///tmp/r2real/sweeps/llama-tiny-max_model_len-512-max_num_seqs-4/run-0001/scratch/44c821ad-8d5e-4ae9-94b4-17aec908eeae')",
                "ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, kv_cache_dtype=fp8, use_mla=True). Reasons: {TRITON_MLA: [kv_cache_dtype not supported]}.",
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
                "ValueError: User-specified max_model_len (262144) is greater than the derived max_model_len (max_position_embeddings=131072).",
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled system error, NCCL version 2.27.3",
                "TimeoutError: Timed out waiting for engines to send initial message on input socket.",
                "RuntimeError: Engine core initialization failed. See root cause above.",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered a fatal error.",
            ),
            strict=True,
        )
    ),
    (
        "traceback.EXCEPTION_LINE",
        traceback.EXCEPTION_LINE,
        (
            f"{PREFIX}ERROR {STAMP} [x.py:1] {TRACEBACK}",
            "torch.OutOfMemoryError: CUDA out of memory.",
        ),
    ),
    (
        "traceback.EXCEPTION_LINE_LOOSE",
        traceback.EXCEPTION_LINE_LOOSE,
        (TRACEBACK, '  File "x.py", line 1, in f', "vllm.v1.engine.exceptions.EngineGone: gone"),
    ),
    (
        "builders.KV_ARG",
        builders.KV_ARG,
        (f"{PREFIX}INFO {STAMP} [utils.py:1] {ENTRY_BODIES['ms.launch_args']}",),
    ),
    (
        "builders.LAYER",
        builders.LAYER,
        (f"{PREFIX}WARNING {STAMP} [w.py:1] {ENTRY_BODIES['warn.kv_scale_missing']}",),
    ),
    (
        "lines._ANSI",
        lines._ANSI,
        (f"\x1b[1;36m{PREFIX}\x1b[0;0mINFO {STAMP} [x.py:1] Loading weights took 3.82 seconds",),
    ),
    (
        "lines._PREFIX",
        lines._PREFIX,
        (
            f"(APIServer pid=1) (VllmWorker rank=1 pid=9) (RayWorkerWrapper pid=5, ip=10.0.0.2) INFO {STAMP} [x.py:1] Loading weights took 1 seconds",
        ),
    ),
    (
        "lines._MIDLINE_PREFIX",
        lines._MIDLINE_PREFIX,
        (
            PREFIX,
            "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]"
            f"(EngineCore_DP0 pid=7) INFO {STAMP} [x.py:1] Loading weights took 1 seconds",
        ),
    ),
    (
        "lines._RAY_REPEAT",
        lines._RAY_REPEAT,
        (
            f"{PREFIX}WARNING {STAMP} [x.py:1] Found k_scale in the checkpoint (e.g. a.b) [repeated 7x across cluster]",
        ),
    ),
    (
        "lines._HEADER",
        lines._HEADER,
        (
            f"{PREFIX}my-prefix INFO {STAMP}.123 [gpu_model_runner.py:4033] Starting to load model /m...",
        ),
    ),
    ("lines._UVICORN", lines._UVICORN, (f"{PREFIX}INFO:     Application startup complete.",)),
    (
        "lines._DATED",
        lines._DATED,
        ("2025-11-21 10:26:22,420 - WARNING - Found k_scale in the checkpoint (e.g. a.b)",),
    ),
)


def _header(e: Entry) -> str:
    """A header of the level and one of the loggers (catalog `loggers`) of entry `e`."""
    logger = e.loggers[0].replace("*", "gpu_", 1) if e.loggers else "core.py"
    if e.levels == FAILURE:
        return f"{PREFIX}ERROR {STAMP} [{logger}:1] "
    if e.levels == WARNING:
        return f"{PREFIX}WARNING {STAMP} [{logger}:1] "
    assert e.levels <= MESSAGE | {"WARNING"}, e.levels
    return f"{PREFIX}INFO {STAMP} [{logger}:1] "


@dataclass(frozen=True)
class Target:
    name: str
    pattern: re.Pattern[str]
    records: tuple[str, ...]  # the last one is the one mutated


def targets() -> list[Target]:
    """Every pattern of the grammar, each with records that reach it."""
    out = []
    for e in CATALOG:
        body = ENTRY_BODIES[e.id]
        if (
            e.levels == BARE
        ):  # a bar: its process prefix, then `\r` and the bar, a record of its own
            out.append(Target(e.id, e.pattern, (PREFIX, body)))
        else:
            out.append(Target(e.id, e.pattern, (_header(e) + body,)))
    out += [Target(n, p, r) for n, p, r in OTHER]
    return out


def _kind(c: str) -> str:
    if c.isdigit():
        return "digits"
    if c.isspace():
        return "spaces"
    if c.isalpha() or c == "_":
        return "letters"
    return repr(c)  # each punctuation character is a kind of its own


def _runs(text: str) -> dict[str, list[tuple[int, int]]]:
    """Maximal runs of one kind of character, by kind."""
    kinds: dict[str, list[tuple[int, int]]] = {}
    i = 0
    while i < len(text):
        kind = _kind(text[i])
        j = i + 1
        while j < len(text) and _kind(text[j]) == kind:
            j += 1
        kinds.setdefault(kind, []).append((i, j))
        i = j
    return kinds


def mutations(record: str, size: int) -> Iterator[tuple[str, str]]:
    """(name, record of about `size` characters) for one sample record (no terminator in it)."""
    assert "\r" not in record and "\n" not in record, record
    for kind, spans in sorted(_runs(record).items()):
        chosen = {spans[0], spans[-1]}
        for n, (a, b) in enumerate(sorted(chosen)):
            fill = record[a] * max(1, size - len(record))
            yield f"run {kind} #{n}", record[:a] + fill + record[b:]
    for frac in (3, 2):
        cut = max(1, len(record) * (frac - 1) // frac)
        yield f"near match 1/{frac}", (record[:cut] * (size // cut + 1))[:size]
    yield "near match -1", (record[:-1] * (size // max(1, len(record) - 1) + 1))[:size]
    yield "repeated", (record * (size // len(record) + 1))[:size]
    yield "junk after", record + "x" * (size - len(record))
    yield "nested prefixes", PREFIX * ((size - len(record)) // len(PREFIX)) + record


@dataclass(frozen=True)
class Result:
    target: str
    mutation: str
    size: int
    parse_s: float  # ChunkScanner.feed of the record, as the daemon does
    search_s: float  # the pattern searched directly over the mutated record


def _parse_time(target: Target, record: str) -> float:
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS))
    offset = 0
    for before in target.records[:-1]:
        data = (before + "\n").encode()
        scanner.feed(data, offset)
        offset += len(data)
    data = (record + "\n").encode()
    t0 = time.perf_counter()
    scanner.feed(data, offset)
    scanner.stream.flush()
    return time.perf_counter() - t0


def run(size: int, *, search: bool = True) -> list[Result]:
    out = []
    for t in targets():
        for name, record in mutations(t.records[-1], size):
            parse_s = _parse_time(t, record)
            search_s = 0.0
            if search:
                t0 = time.perf_counter()
                t.pattern.search(record)
                search_s = time.perf_counter() - t0
            out.append(Result(t.name, name, len(record.encode()), parse_s, search_s))
    return out


def plain_time(size: int) -> float:
    """A plain warning (a needle, a header, a body the catalog does not know): the parse path's
    floor. (A record with no needle never reaches the parser: the C candidate search skips it
    in a few microseconds, which says nothing about the parser's cost per byte.)"""
    record = "(APIServer pid=1) WARNING 11-30 10:00:00 [x.py:1] " + "a b c d e " * (size // 10)
    return min(_parse_time(Target("plain", re.compile("x"), (record,)), record) for _ in range(3))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=MB, help="bytes per hostile record")
    ap.add_argument("--top", type=int, default=10, help="how many of the worst to print")
    args = ap.parse_args(argv)
    floor = plain_time(args.size)
    t0 = time.perf_counter()
    results = run(args.size)
    took = time.perf_counter() - t0
    names = {r.target for r in results}
    print(
        f"{len(results)} hostile records of {args.size / MB:.2f} MiB over {len(names)} patterns "
        f"in {took:.1f} s; a plain warning of that size parses in {floor * 1e3:.2f} ms"
    )
    print(f"\nworst {args.top} by parse time (ChunkScanner.feed):")
    for r in sorted(results, key=lambda r: -r.parse_s)[: args.top]:
        print(f"  {r.parse_s * 1e3:8.2f} ms  x{r.parse_s / floor:6.1f}  {r.target}: {r.mutation}")
    print(f"\nworst {args.top} by a direct search of the pattern (not a path the parser takes):")
    for r in sorted(results, key=lambda r: -r.search_s)[: args.top]:
        print(f"  {r.search_s * 1e3:8.2f} ms  {r.target}: {r.mutation}")
    worst = max(results, key=lambda r: r.parse_s)
    worst_search = max(results, key=lambda r: r.search_s)
    print(
        f"\ncases={len(results)} patterns={len(names)} size_bytes={args.size} "
        f"worst_parse_ms={worst.parse_s * 1e3:.2f} worst_parse_ratio={worst.parse_s / floor:.1f} "
        f"plain_ms={floor * 1e3:.2f} worst_search_ms={worst_search.search_s * 1e3:.2f} "
        f"over_50ms={sum(1 for r in results if r.parse_s > 0.05)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
