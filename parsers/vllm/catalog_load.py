"""The catalog's entries for a load as it goes: progress bars, KV-cache scale warnings,
milestones in load order, and where this node stands in a multi-node deployment."""

from __future__ import annotations

from loadwatch.parsers.vllm.builders import (
    _GIB,
    _SEC,
    BARE,
    WARNING,
    Entry,
    _backend,
    _byte_progress,
    _c,
    _deprecated_kv,
    _engine_config,
    _ep_filter,
    _headless,
    _kv_scale,
    _launch_args,
    _milestone,
    _parallel_init,
    _prefetch,
    _progress,
    _scale_factor,
)
from loadwatch.parsers.vllm.catalog_compile import COMPILE, WARMUP

LOAD: tuple[Entry, ...] = (
    # -- progress bars ---------------------------------------------------------------------
    Entry(
        "progress.tqdm",
        ("it/s]", "s/it]"),
        _c(
            # The description starts where a run of its characters starts: a search then tries
            # the run once, not again from each of its characters (linear on a long run).
            r"(?<![^\r\n:|])(?P<desc>[^\r\n:|]{1,200}+):\s{0,8}+(?P<pct>\d{1,3}+)%"
            r"(?: Completed \| ?|\|[^|\r\n]{0,400}+\| ?| )"  # tqdm's compact form has no bar
            r"(?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?it/s|\d{1,9}+(?:\.\d{1,9}+)?(?:it/s|s/it))\]"
        ),
        _progress,
        "info",
        levels=BARE,
    ),
    Entry(
        "progress.tqdm_bytes",
        ("B/s]",),
        _c(
            # tqdm with unit="B", unit_scale=True: InstantTensor's bar since vLLM PR #46868
            r"(?<![^\r\n:|])(?P<desc>[^\r\n:|]{1,200}+):\s{0,8}+(?P<pct>\d{1,3}+)%"
            r"(?: Completed \| ?|\|[^|\r\n]{0,400}+\| ?| )"
            r"(?P<n>\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?)/(?P<total>\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?B/s|\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?B/s)\]"
        ),
        _byte_progress,
        "info",
        levels=BARE,
    ),
    Entry(
        "progress.prefetch",
        ("Prefetching checkpoint",),
        _c(
            r"Prefetching checkpoint files: (?P<pct>\d{1,3}+)% \((?P<n>\d{1,9}+)/(?P<total>\d{1,9}+)\)"
        ),
        _prefetch,
        "info",
        loggers=("weight_utils.py",),
    ),
    # -- KV-cache scale warnings -----------------------------------------------------------
    Entry(
        "warn.kv_scale_missing",
        ("in the checkpoint (e.g.",),
        _c(
            r"(?P<dep>DEPRECATED\. )?Found (?P<name>[.A-Za-z_ -]{1,40}?) in the checkpoint "
            r"\(e\.g\. (?P<ckpt>[^()\s]{0,400}+)\), but not found the expected name in the model "
            r"\(e\.g\. (?P<model>[^()\s]{0,400}+)\)"
        ),
        _kv_scale,
        "warning",
        levels=WARNING,
        loggers=("weight_utils.py", "utils.py", "kv_cache.py"),
    ),
    Entry(
        "warn.kv_scale_deprecated",
        ("DEPRECATED. Found kv_scale",),
        _c(r"DEPRECATED\. Found kv_scale in the checkpoint\. "),
        _deprecated_kv,
        "warning",
        levels=WARNING,
        loggers=("weight_utils.py", "utils.py"),
    ),
    Entry(
        "warn.kv_scale_default",
        ("KV cache scaling factor",),
        _c(r"Using KV cache scaling factor 1\.0 for fp8"),
        _scale_factor("kv_scale_default"),
        "warning",
        levels=WARNING,
        loggers=("kv_cache.py", "fp8.py", "layer.py"),
    ),
    Entry(
        "warn.q_scale_from_k",
        ("q scaling factor",),
        _c(r"Checkpoint does not provide a q scaling factor"),
        _scale_factor("q_scale_from_k"),
        "warning",
        levels=WARNING,
        loggers=("kv_cache.py", "layer.py"),
    ),
    Entry(
        "warn.q_prob_scale_default",
        ("Q scale", "uncalibrated q_scale"),
        _c(r"Using (?:Q scale \S{1,20}+ and prob scale|uncalibrated q_scale)"),
        _scale_factor("q_prob_scale_default"),
        "warning",
        levels=WARNING,
        loggers=("kv_cache.py", "layer.py"),
    ),
    # -- milestones, in load order ---------------------------------------------------------
    Entry(
        "ms.version",
        ("server version",),
        _c(
            r"vLLM (?:API )?server version (?P<v>[^\s,]{1,80}+)(?:, serving model (?P<model>\S{1,400}+))?"
        ),
        _milestone("version", value="v"),
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
        _c(r"^[\s\u2580-\u259f]{3,80}+version\s{1,8}+(?P<v>\S{1,80}+)\s*+$"),
        _milestone("version", value="v"),
        "info",
        serving=True,
        loggers=("utils.py", "api_server.py", "api_utils.py"),
    ),
    Entry(
        "ms.launch_args",
        ("non-default args: {", "args: Namespace("),
        _c(r"^(?:non-default args: \{|args: Namespace\()"),
        _launch_args,
        "info",
        loggers=("api_server.py", "cli_args.py", "utils.py", "api_utils.py", "run_batch.py"),
    ),
    Entry(
        "ms.engine_config",
        ("LLM engine (v",),
        _c(
            r"^Initializing an? (?:V\d{1,2}+ )?LLM engine \(v?[^)\s]{1,80}+\) with config: "
            r"(?:model='(?P<model>[^']{1,4000}+)')?"
        ),
        _engine_config,
        "info",
        loggers=("core.py", "llm_engine.py", "async_llm_engine.py"),
    ),
    Entry(
        "ms.model_load_start",
        ("Starting to load model",),
        _c(r"Starting to load model (?P<model>\S{1,400}?)(?:\.\.\.)?\s*+$"),
        _milestone("model_load_start", value="model"),
        "info",
        serving=True,
        loggers=("*model_runner.py", "*worker.py"),
    ),
    Entry(
        "ms.checkpoint_info",
        ("Filesystem type for checkpoints", "Checkpoint size:"),
        _c(
            r"(?:Filesystem type for checkpoints: (?P<fs>[^.\s]{1,40}+)\.\s{0,4}+)?"
            r"Checkpoint size: " + _GIB + r" GiB"
        ),
        _milestone("checkpoint_info", value="fs", gib="gib"),
        "info",
        loggers=("weight_utils.py", "*loader.py"),
    ),
    # -- where this node stands in a multi-node deployment ----------------------------------
    Entry(
        "ms.ep_weight_filter",
        ("EP weight filter:",),
        _c(
            r"EP weight filter: ep_size=(?P<size>\d{1,7}+), ep_rank=(?P<rank>\d{1,7}+), "
            r"loading (?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) experts"
        ),
        _ep_filter,
        "info",
        loggers=("weight_utils.py", "*loader.py", "layer.py", "*model_runner.py"),
    ),
    Entry(
        "node.parallel_init",
        ("distributed_init_method=",),
        _c(
            r"world_size=(?P<ws>\d{1,7}+) rank=(?P<rank>\d{1,7}+) local_rank=(?P<local>\d{1,7}+) "
            r"distributed_init_method=(?P<method>\S{1,400}+) backend=(?P<backend>\w{1,40}+)"
        ),
        _parallel_init,
        "info",
        loggers=("parallel_state.py",),
    ),
    Entry(
        "node.headless_tp_pp",
        ("headless multiproc executor",),
        _c(
            r"Launching vLLM (?:\(v?[^()\s]{1,60}+\) )?headless multiproc executor, with head "
            r"node address (?P<addr>[^\s,]{1,200}+) for torch"
        ),
        _headless("headless_tp_pp"),
        "info",
        loggers=("serve.py", "multiproc_executor.py"),
    ),
    Entry(
        "node.headless_dp",
        ("in headless mode, with head node",),
        _c(
            r"Launching (?P<n>\d{1,7}+) data parallel engine\(s\) in headless mode, with head "
            r"node address (?P<addr>[^\s,]{1,200}?)\.?(?:\s|$)"
        ),
        _headless("headless_dp"),
        "info",
        loggers=("serve.py", "core.py", "engine_core.py"),
    ),
    Entry(
        "ms.gguf_shards",
        ("GGUF shard files",),
        _c(r"Discovered (?P<n>\d{1,9}+) GGUF shard files"),
        _milestone("gguf_shards", count="n"),
        "info",
        loggers=("*loader.py", "weight_utils.py"),
    ),
    Entry(
        "ms.attention_backend",
        ("backend",),
        _c(
            r"^Using (?:AttentionBackendEnum\.)?"
            r"(?P<b>[A-Za-z0-9_]{1,40}+(?: (?:Attention|MLA|SDPA))?) (?:attention )?backend"
            r"(?: on V1 engine)?(?:\.|,| out of potential backends|\s*+$)"
        ),
        _backend,
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
        _c(r"^Initializing model took " + _SEC + r" s"),
        _milestone("model_init", seconds="sec"),
        "info",
        loggers=("*loader.py", "*model_runner.py"),
    ),
    Entry(
        "ms.weights_loaded",
        ("Loading weights took",),
        _c(r"Loading weights took " + _SEC + r" s"),
        _milestone("weights_loaded", seconds="sec"),
        "info",
        loggers=("*loader.py", "tpu.py"),
    ),
    Entry(
        "ms.runai_stream",
        ("Overall time to stream",),
        _c(
            r"(?:\[RunAI (?:Distributed )?Streamer\] )?Overall time to stream "
            + _GIB
            + r" ?GiB of all files(?: to cpu)?: "
            + _SEC
            + r" ?s"
        ),
        _milestone("weights_loaded", detail="runai_stream", gib="gib", seconds="sec"),
        "info",
        levels=WARNING,  # the streamer prints it without a header; vLLM may log it
        loggers=("file_streamer.py", "*loader.py", "weight_utils.py"),
    ),
    Entry(
        "ms.model_memory",
        ("Model loading took", "Loading model weights took"),
        _c(
            r"(?:Model loading took|Loading model weights took) "
            + _GIB
            + r" ?(?:GiB|GB)(?: memory)?(?: and "
            + _SEC
            + r" s)?"
        ),
        _milestone("model_memory", gib="gib", seconds="sec"),
        "info",
        loggers=("*model_runner.py", "*worker.py"),
    ),
    *COMPILE,
    Entry(
        "ms.kv_available",
        ("KV cache memory:",),
        _c(r"Available KV cache memory: " + _GIB + r" ?GiB"),
        _milestone("kv_cache", detail="available_memory", gib="gib"),
        "info",
        loggers=("*worker.py", "*model_runner.py"),
    ),
    Entry(
        "ms.kv_explicit",
        ("GiB for KV cache",),
        _c(r"Explicitly set \((?P<gib>\d{1,9}+(?:\.\d{1,9}+)?)/[\d.]{1,20}+\) GiB for KV cache"),
        _milestone("kv_cache", detail="available_memory", gib="gib"),
        "info",
        loggers=("*worker.py", "*model_runner.py"),
    ),
    Entry(
        "ms.kv_dtype",
        ("data type to store kv cache",),
        _c(r"Using (?P<dtype>[A-Za-z0-9_]{1,40}+) data type to store kv cache"),
        _milestone("kv_cache", detail="dtype", value="dtype"),
        "info",
        loggers=("cache.py", "config.py"),
    ),
    Entry(
        "ms.kv_size",
        ("KV cache size:",),
        _c(r"(?P<dev>GPU|CPU|XPU|TPU)? ?KV cache size: (?P<tok>[\d,]{1,20}+) tokens"),
        _milestone("kv_cache", detail="size", tokens="tok", value="dev"),
        "info",
        more=True,  # the CPU backend prints the concurrency on the same line
        loggers=("kv_cache_utils.py",),
    ),
    Entry(
        "ms.kv_blocks",
        ("blocks:",),
        _c(r"# (?:GPU|cuda|CUDA|gpu) blocks: (?P<b>\d{1,12}+)"),
        _milestone("kv_cache", detail="blocks", blocks="b"),
        "info",
        loggers=("*executor.py", "executor_base.py", "kv_cache_utils.py"),
    ),
    Entry(
        "ms.kv_concurrency",
        ("Maximum concurrency for",),
        _c(
            r"Maximum concurrency for (?P<tok>[\d,]{1,20}+) tokens per request: (?P<x>\d{1,9}+(?:\.\d{1,9}+)?)x"
        ),
        _milestone("kv_cache", detail="concurrency", tokens="tok", value="x"),
        "info",
        loggers=("kv_cache_utils.py", "*executor.py", "executor_base.py"),
    ),
    *WARMUP,
    Entry(
        "ms.graph_capture",
        ("Graph capturing finished",),
        _c(r"Graph capturing finished in " + _SEC + r" secs?(?:, took " + _GIB + r" GiB)?"),
        _milestone("graph_capture", seconds="sec", gib="gib"),
        "info",
        loggers=("*model_runner.py", "cuda_graph.py", "*worker.py"),
    ),
    Entry(
        "ms.engine_init",
        ("init engine",),
        _c(r"init engine \(profile, create kv cache, warmup model\) took " + _SEC + r" s"),
        _milestone("engine_init", seconds="sec"),
        "info",
        loggers=("core.py", "llm_engine.py"),
    ),
)
