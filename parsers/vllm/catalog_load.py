"""The catalog's entries for a load as it goes: progress bars, KV-cache scale warnings,
milestones in load order, and where this node stands in a multi-node deployment."""

from __future__ import annotations

from loadwatch.parsers.entries import (
    BARE,
    GIB,
    SEC,
    WARNING,
    Entry,
    rx,
)
from loadwatch.parsers.vllm.builders import (
    backend,
    byte_progress,
    deprecated_kv,
    engine_config,
    ep_filter,
    headless,
    kv_scale,
    launch_args,
    milestone,
    parallel_init,
    prefetch,
    progress,
    scale_factor,
)
from loadwatch.parsers.vllm.catalog_compile import COMPILE, WARMUP

LOAD: tuple[Entry, ...] = (
    # -- progress bars ---------------------------------------------------------------------
    Entry(
        "progress.tqdm",
        ("it/s]", "s/it]"),
        rx(
            # The description starts where a run of its characters starts: a search then tries
            # the run once, not again from each of its characters (linear on a long run).
            r"(?<![^\r\n:|])(?P<desc>[^\r\n:|]{1,200}+):\s{0,8}+(?P<pct>\d{1,3}+)%"
            r"(?: Completed \| ?|\|[^|\r\n]{0,400}+\| ?| )"  # tqdm's compact form has no bar
            r"(?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?it/s|\d{1,9}+(?:\.\d{1,9}+)?(?:it/s|s/it))\]"
        ),
        progress,
        "info",
        levels=BARE,
    ),
    Entry(
        "progress.tqdm_bytes",
        ("B/s]",),
        rx(
            # tqdm with unit="B", unit_scale=True: InstantTensor's bar since vLLM PR #46868
            r"(?<![^\r\n:|])(?P<desc>[^\r\n:|]{1,200}+):\s{0,8}+(?P<pct>\d{1,3}+)%"
            r"(?: Completed \| ?|\|[^|\r\n]{0,400}+\| ?| )"
            r"(?P<n>\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?)/(?P<total>\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?B/s|\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?B/s)\]"
        ),
        byte_progress,
        "info",
        levels=BARE,
    ),
    Entry(
        "progress.prefetch",
        ("Prefetching checkpoint",),
        rx(
            r"Prefetching checkpoint files: (?P<pct>\d{1,3}+)% \((?P<n>\d{1,9}+)/(?P<total>\d{1,9}+)\)"
        ),
        prefetch,
        "info",
        loggers=("weight_utils.py",),
    ),
    # -- KV-cache scale warnings -----------------------------------------------------------
    Entry(
        "warn.kv_scale_missing",
        ("in the checkpoint (e.g.",),
        rx(
            r"(?P<dep>DEPRECATED\. )?Found (?P<name>[.A-Za-z_ -]{1,40}?) in the checkpoint "
            r"\(e\.g\. (?P<ckpt>[^()\s]{0,400}+)\), but not found the expected name in the model "
            r"\(e\.g\. (?P<model>[^()\s]{0,400}+)\)"
        ),
        kv_scale,
        "warning",
        levels=WARNING,
        loggers=("weight_utils.py", "utils.py", "kv_cache.py"),
    ),
    Entry(
        "warn.kv_scale_deprecated",
        ("DEPRECATED. Found kv_scale",),
        rx(r"DEPRECATED\. Found kv_scale in the checkpoint\. "),
        deprecated_kv,
        "warning",
        levels=WARNING,
        loggers=("weight_utils.py", "utils.py"),
    ),
    Entry(
        "warn.kv_scale_default",
        ("KV cache scaling factor",),
        rx(r"Using KV cache scaling factor 1\.0 for fp8"),
        scale_factor("kv_scale_default"),
        "warning",
        levels=WARNING,
        loggers=("kv_cache.py", "fp8.py", "layer.py"),
    ),
    Entry(
        "warn.q_scale_from_k",
        ("q scaling factor",),
        rx(r"Checkpoint does not provide a q scaling factor"),
        scale_factor("q_scale_from_k"),
        "warning",
        levels=WARNING,
        loggers=("kv_cache.py", "layer.py"),
    ),
    Entry(
        "warn.q_prob_scale_default",
        ("Q scale", "uncalibrated q_scale"),
        rx(r"Using (?:Q scale \S{1,20}+ and prob scale|uncalibrated q_scale)"),
        scale_factor("q_prob_scale_default"),
        "warning",
        levels=WARNING,
        loggers=("kv_cache.py", "layer.py"),
    ),
    # -- milestones, in load order ---------------------------------------------------------
    Entry(
        "ms.version",
        ("server version",),
        rx(
            r"vLLM (?:API )?server version (?P<v>[^\s,]{1,80}+)(?:, serving model (?P<model>\S{1,400}+))?"
        ),
        milestone("version", value="v"),
        "info",
        serving=True,
        loggers=(
            "api_server.py",
            "utils.py",
            "api_utils.py",
            "run_batch.py",
            "launcher.py",
            "entry.py",
        ),
    ),
    Entry(
        "ms.version_logo",
        ("  version ",),
        rx(r"^[\s\u2580-\u259f]{3,80}+version\s{1,8}+(?P<v>\S{1,80}+)\s*+$"),
        milestone("version", value="v"),
        "info",
        serving=True,
        loggers=("utils.py", "api_server.py", "api_utils.py"),
    ),
    Entry(
        "ms.launch_args",
        ("non-default args: {", "args: Namespace("),
        rx(r"^(?:non-default args: \{|args: Namespace\()"),
        launch_args,
        "info",
        loggers=("api_server.py", "cli_args.py", "utils.py", "api_utils.py", "run_batch.py"),
    ),
    Entry(
        "ms.engine_config",
        ("LLM engine (v",),
        rx(
            r"^Initializing an? (?:V\d{1,2}+ )?LLM engine \(v?[^)\s]{1,80}+\) with config: "
            r"(?:model='(?P<model>[^']{1,4000}+)')?"
        ),
        engine_config,
        "info",
        loggers=("core.py", "llm_engine.py", "async_llm_engine.py"),
    ),
    Entry(
        "ms.model_load_start",
        ("Starting to load model",),
        rx(r"Starting to load model (?P<model>\S{1,400}?)(?:\.\.\.)?\s*+$"),
        milestone("model_load_start", value="model"),
        "info",
        serving=True,
        loggers=("*model_runner.py", "*worker.py"),
    ),
    Entry(
        "ms.checkpoint_info",
        ("Filesystem type for checkpoints", "Checkpoint size:"),
        rx(
            r"(?:Filesystem type for checkpoints: (?P<fs>[^.\s]{1,40}+)\.\s{0,4}+)?"
            r"Checkpoint size: " + GIB + r" GiB"
        ),
        milestone("checkpoint_info", value="fs", gib="gib"),
        "info",
        loggers=("weight_utils.py", "*loader.py"),
    ),
    # -- where this node stands in a multi-node deployment ----------------------------------
    Entry(
        "ms.ep_weight_filter",
        ("EP weight filter:",),
        rx(
            r"EP weight filter: ep_size=(?P<size>\d{1,7}+), ep_rank=(?P<rank>\d{1,7}+), "
            r"loading (?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) experts"
        ),
        ep_filter,
        "info",
        loggers=("weight_utils.py", "*loader.py", "layer.py", "*model_runner.py"),
    ),
    Entry(
        "node.parallel_init",
        ("distributed_init_method=",),
        rx(
            r"world_size=(?P<ws>\d{1,7}+) rank=(?P<rank>\d{1,7}+) local_rank=(?P<local>\d{1,7}+) "
            r"distributed_init_method=(?P<method>\S{1,400}+) backend=(?P<backend>\w{1,40}+)"
        ),
        parallel_init,
        "info",
        loggers=("parallel_state.py",),
    ),
    Entry(
        "node.headless_tp_pp",
        ("headless multiproc executor",),
        rx(
            r"Launching vLLM (?:\(v?[^()\s]{1,60}+\) )?headless multiproc executor, with head "
            r"node address (?P<addr>[^\s,]{1,200}+) for torch"
        ),
        headless("headless_tp_pp"),
        "info",
        loggers=("serve.py", "multiproc_executor.py"),
    ),
    Entry(
        "node.headless_dp",
        ("in headless mode, with head node",),
        rx(
            r"Launching (?P<n>\d{1,7}+) data parallel engine\(s\) in headless mode, with head "
            r"node address (?P<addr>[^\s,]{1,200}?)\.?(?:\s|$)"
        ),
        headless("headless_dp"),
        "info",
        loggers=("serve.py", "core.py", "engine_core.py"),
    ),
    Entry(
        "ms.gguf_shards",
        ("GGUF shard files",),
        rx(r"Discovered (?P<n>\d{1,9}+) GGUF shard files"),
        milestone("gguf_shards", count="n"),
        "info",
        loggers=("*loader.py", "weight_utils.py"),
    ),
    Entry(
        "ms.attention_backend",
        ("backend",),
        rx(
            r"^Using (?:AttentionBackendEnum\.)?"
            r"(?P<b>[A-Za-z0-9_]{1,40}+(?: (?:Attention|MLA|SDPA))?) (?:attention )?backend"
            r"(?: on V1 engine)?(?:\.|,| out of potential backends|\s*+$)"
        ),
        backend,
        "info",
        loggers=(
            "selector.py",
            "cuda.py",
            "rocm.py",
            "xpu.py",
            "cpu.py",
            "tpu.py",
            "hpu.py",
            "openvino.py",
            "interface.py",
        ),
    ),
    Entry(
        "ms.model_init",
        ("Initializing model took",),
        rx(r"^Initializing model took " + SEC + r" s"),
        milestone("model_init", seconds="sec"),
        "info",
        loggers=("*loader.py", "*model_runner.py"),
    ),
    Entry(
        "ms.weights_loaded",
        ("Loading weights took",),
        rx(r"Loading weights took " + SEC + r" s"),
        milestone("weights_loaded", seconds="sec"),
        "info",
        loggers=("*loader.py", "tpu.py"),
    ),
    Entry(
        "ms.runai_stream",
        ("Overall time to stream",),
        rx(
            r"(?:\[RunAI (?:Distributed )?Streamer\] )?Overall time to stream "
            + GIB
            + r" ?GiB of all files(?: to cpu)?: "
            + SEC
            + r" ?s"
        ),
        milestone("weights_loaded", detail="runai_stream", gib="gib", seconds="sec"),
        "info",
        levels=WARNING,  # the streamer prints it without a header; vLLM may log it
        loggers=("file_streamer.py", "*loader.py", "weight_utils.py"),
    ),
    Entry(
        "ms.model_memory",
        ("Model loading took", "Loading model weights took"),
        rx(
            r"(?:Model loading took|Loading model weights took) "
            + GIB
            + r" ?(?:GiB|GB)(?: memory)?(?: and "
            + SEC
            + r" s)?"
        ),
        milestone("model_memory", gib="gib", seconds="sec"),
        "info",
        loggers=("*model_runner.py", "*worker.py"),
    ),
    *COMPILE,
    Entry(
        "ms.kv_available",
        ("KV cache memory:",),
        rx(r"Available KV cache memory: " + GIB + r" ?GiB"),
        milestone("kv_cache", detail="available_memory", gib="gib"),
        "info",
        loggers=("*worker.py", "*model_runner.py"),
    ),
    Entry(
        "ms.kv_explicit",
        ("GiB for KV cache",),
        rx(r"Explicitly set \((?P<gib>\d{1,9}+(?:\.\d{1,9}+)?)/[\d.]{1,20}+\) GiB for KV cache"),
        milestone("kv_cache", detail="available_memory", gib="gib"),
        "info",
        loggers=("*worker.py", "*model_runner.py"),
    ),
    Entry(
        "ms.kv_dtype",
        ("data type to store kv cache",),
        rx(r"Using (?P<dtype>[A-Za-z0-9_]{1,40}+) data type to store kv cache"),
        milestone("kv_cache", detail="dtype", value="dtype"),
        "info",
        loggers=("cache.py", "config.py"),
    ),
    Entry(
        "ms.kv_size",
        ("KV cache size:",),
        rx(r"(?P<dev>GPU|CPU|XPU|TPU)? ?KV cache size: (?P<tok>[\d,]{1,20}+) tokens"),
        milestone("kv_cache", detail="size", tokens="tok", value="dev"),
        "info",
        more=True,  # the CPU backend prints the concurrency on the same line
        loggers=("kv_cache_utils.py",),
    ),
    Entry(
        "ms.kv_blocks",
        ("blocks:",),
        rx(r"# (?:GPU|cuda|CUDA|gpu) blocks: (?P<b>\d{1,12}+)"),
        milestone("kv_cache", detail="blocks", blocks="b"),
        "info",
        loggers=("*executor.py", "executor_base.py", "kv_cache_utils.py"),
    ),
    Entry(
        "ms.kv_concurrency",
        ("Maximum concurrency for",),
        rx(
            r"Maximum concurrency for (?P<tok>[\d,]{1,20}+) tokens per request: (?P<x>\d{1,9}+(?:\.\d{1,9}+)?)x"
        ),
        milestone("kv_cache", detail="concurrency", tokens="tok", value="x"),
        "info",
        loggers=("kv_cache_utils.py", "*executor.py", "executor_base.py"),
    ),
    *WARMUP,
    Entry(
        "ms.graph_capture",
        ("Graph capturing finished",),
        rx(r"Graph capturing finished in " + SEC + r" secs?(?:, took " + GIB + r" GiB)?"),
        milestone("graph_capture", seconds="sec", gib="gib"),
        "info",
        loggers=("*model_runner.py", "cuda_graph.py", "*worker.py"),
    ),
    Entry(
        "ms.engine_init",
        ("init engine",),
        rx(r"init engine \(profile, create kv cache, warmup model\) took " + SEC + r" s"),
        milestone("engine_init", seconds="sec"),
        "info",
        loggers=("core.py", "llm_engine.py"),
    ),
)
