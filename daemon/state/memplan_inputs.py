"""What the memory plan is fed: the parallel layout from the vLLM argv (and environment), the
weights per GPU from the shard sizes, and the GPU's capacity when NVML cannot say."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.sources.model.modelfiles import ModelFileError
from loadwatch.daemon.state.memplan import GIB, Layout, MemoryPlan, plan
from loadwatch.parsers.vllm import argv as vllm_argv

# Total memory NVML reports for common datacenter and workstation GPUs (MiB), for planning on a
# machine without them (--gpu-model). Matched by a case-insensitive fragment of the name.
GPU_MODELS_MIB: tuple[tuple[str, int], ...] = (
    ("rtx pro 6000", 97887),
    ("rtx 5090", 32607),
    ("b200", 183359),
    ("h200", 143771),
    ("h100", 81559),
    ("h20", 97871),
    ("a100-40", 40960),
    ("a100", 81920),
    ("l40s", 46068),
    ("rtx 4090", 24564),
)


def gpu_model_capacity(name: str) -> tuple[int, str] | None:
    low = name.lower()
    for fragment, mib in GPU_MODELS_MIB:
        if fragment in low:
            return (
                mib * 2**20,
                f"--gpu-model {name!r}: {mib} MiB as NVML reports a {fragment.upper()}",
            )
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def parse_bytes(text: str | None) -> int | None:
    """vLLM's --kv-cache-memory-bytes takes a plain number or a suffixed one (4G, 512M)."""
    if text is None:
        return None
    t = text.strip().upper().removesuffix("B")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    value = _float(t[:-1] if scale > 1 else t)
    return int(value * scale) if value is not None else None


def layout_from_argv(
    argv: Sequence[str], env: Mapping[str, str] | None = None, device: str | None = None
) -> Layout:
    """The memory-relevant settings of a ``vllm serve`` command line (dashes or underscores)."""

    def opt(name: str) -> str | None:
        underscored = "--" + name[2:].replace("-", "_")
        return vllm_argv.option(argv, name) or vllm_argv.option(argv, underscored)

    def short(long: str, short_name: str) -> str | None:
        return opt(long) or vllm_argv.option(argv, short_name)

    env = env or {}
    kv_bytes = parse_bytes(opt("--kv-cache-memory-bytes"))
    kv_src = "--kv-cache-memory-bytes" if kv_bytes is not None else None
    dev = device or ("cpu" if "VLLM_CPU_KVCACHE_SPACE" in env else "cuda")
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if dev == "cpu" and space.strip():
        gib = _int(space)
        if gib is not None:  # vLLM's CPU platform lets the variable win over the flag
            kv_bytes, kv_src = gib * GIB, f"VLLM_CPU_KVCACHE_SPACE={gib}"
    flags = set(argv)
    ep = (
        "--enable-expert-parallel" in flags or "--enable_expert_parallel" in flags or "-ep" in flags
    )
    return Layout(
        tensor_parallel=_int(short("--tensor-parallel-size", "-tp")) or 1,
        pipeline_parallel=_int(short("--pipeline-parallel-size", "-pp")) or 1,
        data_parallel=_int(short("--data-parallel-size", "-dp")) or 1,
        expert_parallel=ep,
        max_model_len=_int(opt("--max-model-len")),
        gpu_memory_utilization=_float(opt("--gpu-memory-utilization")),
        kv_cache_memory_bytes=kv_bytes,
        kv_memory_source=kv_src,
        block_size=_int(opt("--block-size")),
        device="cpu" if dev == "cpu" else "cuda",
    )


# Tensors vLLM keeps whole on every TP rank (ReplicatedLinear in its DeepSeek-V2/V3 model):
# MLA's latent down-projections and the MoE router. Their bytes are estimated from config.json's
# shapes in bf16, which quantised checkpoints leave them in.
def _replicated_bytes(info: ModelInfo) -> tuple[int, list[str]]:
    geo = info.geometry
    if geo is None or not geo.hidden_size or not geo.num_layers:
        return 0, []
    parts: list[str] = []
    total = 0
    fams = set(geo.index_families)
    if "mla_latent" in fams and geo.kv_lora_rank:
        n = geo.num_layers * geo.hidden_size * (geo.kv_lora_rank + (geo.qk_rope_head_dim or 0)) * 2
        total += n
        parts.append(f"MLA kv_a_proj_with_mqa {n / GIB:.2f} GiB")
    if "mla_q_latent" in fams and geo.q_lora_rank:
        n = geo.num_layers * geo.hidden_size * geo.q_lora_rank * 2
        total += n
        parts.append(f"q_a_proj {n / GIB:.2f} GiB")
    if "router" in fams and geo.n_routed_experts:
        moe_layers = geo.num_layers - (geo.first_k_dense_replace or 0)
        n = moe_layers * geo.hidden_size * geo.n_routed_experts * 2
        total += n
        parts.append(f"router {n / GIB:.2f} GiB")
    return total, parts


def weights_per_gpu(info: ModelInfo, layout: Layout) -> tuple[int | None, str]:
    """Bytes of weights on the most loaded GPU: the shard bytes split by TP x PP, with the
    replicated parts (where the index names them) kept whole on every TP rank, and, with
    expert parallelism, the experts split over TP x DP.

    The replicated bytes are exact when the safetensors headers were read (``family_bytes``),
    else estimated from config.json's shapes. vLLM splits embeddings and lm_head by vocabulary
    across TP (VocabParallelEmbedding, ParallelLMHead), so they are sharded, not replicated;
    under PP they sit on the first and last stage only, counted here as spread like the rest."""
    if not info.total_bytes:
        return None, "no weight files: unknown"
    tp, pp = max(1, layout.tensor_parallel), max(1, layout.pipeline_parallel)
    exact = dict(info.geometry.family_bytes) if info.geometry else {}
    if exact:
        names = {
            "mla_latent": "MLA kv_a_proj_with_mqa",
            "mla_q_latent": "q_a_proj",
            "router": "router",
        }
        repl = sum(exact.get(k, 0) for k in names)
        parts = [f"{v} {exact[k] / GIB:.2f} GiB" for k, v in names.items() if exact.get(k)]
        source = "from the safetensors headers"
    else:
        repl, parts = _replicated_bytes(info)
        source = "bf16, from config.json shapes"
    repl = min(repl, info.total_bytes)
    experts = exact.get("experts", 0) if layout.expert_parallel and layout.data_parallel > 1 else 0
    sharded = info.total_bytes - repl - experts
    per_gpu = sharded // (tp * pp) + repl // pp + experts // (tp * layout.data_parallel * pp)
    how = f"{info.total_bytes / GIB:.1f} GiB of shards / (TP {tp} x PP {pp})"
    if repl:
        how += f", replicated on every TP rank: {', '.join(parts)} ({source})"
    if experts:
        how += f"; experts {experts / GIB:.1f} GiB over TP x DP {tp * layout.data_parallel} (EP)"
    fams = set(info.geometry.index_families) if info.geometry else set()
    if fams & {"embed_tokens", "lm_head"}:
        how += "; embeddings and lm_head split by vocabulary across TP"
    return per_gpu, how


NO_CAPACITY: tuple[int | None, str] = (None, "unknown")  # (bytes per GPU, where that came from)


def plan_start(
    model: ModelInfo,
    kv_dtype: str,
    layout: Layout,
    capacity_bytes: int | None,
    capacity_source: str,
) -> MemoryPlan | None:
    """The memory plan of one start: the one way from a model directory, a KV dtype, a layout
    and a capacity to a plan, for the preflight before a start and the live view during it alike
    (so the two cannot say different things of the same start)."""
    if model.geometry is None:
        return None
    weights, how = weights_per_gpu(model, layout)
    if layout.device == "cpu" and capacity_bytes is None:
        capacity_source = "the CPU: the KV budget is set outright"
    return plan(
        model.geometry,
        kv_dtype,
        layout,
        weights_bytes=weights,
        weights_explain=how,
        capacity_bytes=capacity_bytes,
        capacity_source=capacity_source,
    )


def plan_argv(
    argv: Sequence[str],
    env: Mapping[str, str],
    capacity: tuple[int | None, str] | None,
    kv_dtype: str | None = None,
) -> MemoryPlan | None:
    """The memory plan of a vLLM command: its model directory read (shard sizes included), its
    layout, and its `--kv-cache-dtype` unless `kv_dtype` is given; None when it cannot be
    planned (no model directory, no attention shapes)."""
    model = vllm_argv.model_path(argv)
    if model is None:
        return None
    try:
        info = read_model_dir(model, tensor_bytes=True)
    except (ModelFileError, OSError):
        return None
    dtype = kv_dtype or vllm_argv.kv_cache_dtype(argv) or "auto"
    return plan_start(info, dtype, layout_from_argv(argv, dict(env)), *(capacity or NO_CAPACITY))


def fitting_len(plan: MemoryPlan | None) -> int | None:
    """The longest `--max-model-len` a plan says fits: by its pessimistic budget where it has
    one (a remedy that fits only the optimistic one may fail the same way again)."""
    cap = None if plan is None else (plan.low or plan.high)
    return cap.max_len_fits if cap is not None and cap.max_len_fits > 0 else None
