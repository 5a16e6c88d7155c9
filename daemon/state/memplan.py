"""The memory plan: weights per GPU, KV bytes per token, the KV budget, its capacity in tokens,
and whether ``--max-model-len`` fits. Pure arithmetic over values; no I/O.

It follows vLLM 0.32's own sizing (vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py,
vllm/v1/worker/gpu_worker.py, vllm/platforms/cpu.py), read, not copied:

- A page holds ``block_size`` tokens of one layer: full attention ``2 x kv_heads x head_size x
  dtype`` bytes per token (K and V), MLA ``(kv_lora_rank + qk_rope_head_dim) x dtype`` (one
  latent, no V; ``fp8_ds_mla`` packs it in 656 bytes). KV heads are split across TP, replicated
  when fewer than TP (at least one per GPU); the MLA latent is not split.
- ``num_blocks = available // (page x layers on this GPU)``; every GPU gets the smallest count.
- The capacity vLLM prints: ``int(num_blocks / cdiv(max_model_len, block_size) x
  max_model_len)`` tokens (``num_blocks x block_size`` when the length is a multiple).
- The admission check holds one block back (the null block): ``cdiv(max_model_len, block) x
  block bytes`` must fit in ``available - block bytes``, else vLLM raises "To serve at least one
  request with the model's max seq len (N), (X GiB KV cache is needed, which is larger than the
  available KV cache memory (Y GiB)"; nothing left at all is "No available memory for the cache
  blocks".
- Available memory: ``gpu_memory_utilization x total`` minus what profiling found in use
  (weights, the activation peak, non-torch memory such as NCCL buffers). CUDA graphs are
  captured later, in the ``1 - utilization`` headroom, unless
  VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1. ``--kv-cache-memory-bytes`` (on the CPU also
  ``VLLM_CPU_KVCACHE_SPACE`` GiB) sets it outright.
- Block size: ``--block-size``, else 16 on CUDA; on the CPU 16 for MLA, 128 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loadwatch.daemon.sources.inputs import ModelGeometry

GIB = 2**30
DEFAULT_UTILIZATION = 0.92  # vLLM 0.32's default (0.9 before)
FP8_DS_MLA_BYTES = 656  # per token and layer: 512 fp8 latent + 4 fp32 scales + 64 bf16 rope
Verdict = Literal["fits", "tight", "will_fail", "unknown"]

_DTYPE_BYTES = {
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "float32": 2.0,  # vLLM runs float32 checkpoints in a 16-bit dtype by default
    "float": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "fp8_inc": 1.0,
}


@dataclass(frozen=True, slots=True)
class Layout:
    """The vLLM command line's settings that decide memory (None: vLLM's default)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes or VLLM_CPU_KVCACHE_SPACE
    kv_memory_source: str | None = None
    block_size: int | None = None
    device: Literal["cuda", "cpu"] = "cuda"


@dataclass(frozen=True, slots=True)
class KvPerToken:
    """KV bytes one token takes on one GPU, over the layers that GPU holds."""

    attention: Literal["mla", "standard"]
    layers: int  # layers with a per-token KV cache on one GPU (the largest PP stage)
    bytes_per_layer: float
    dtype: str
    explain: str
    skipped_layers: int = 0  # linear-attention layers: a fixed state, no per-token KV
    sliding_layers: int = 0  # counted as full attention (vLLM gives them their window only)

    @property
    def bytes(self) -> float:
        return self.bytes_per_layer * self.layers


@dataclass(frozen=True, slots=True)
class Capacity:
    tokens: int
    blocks: int
    block_size: int
    max_len_fits: int  # the longest --max-model-len vLLM's admission check lets through


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    kv: KvPerToken | None
    block_size: int
    block_size_source: str
    max_model_len: int | None
    max_model_len_source: str
    weights_bytes: int | None  # per GPU
    weights_explain: str
    capacity_bytes: int | None  # per GPU
    capacity_source: str
    utilization: float
    reserve_low_bytes: int
    reserve_high_bytes: int
    reserve_explain: str
    available_low: int | None  # KV budget per GPU, pessimistic and optimistic
    available_high: int | None
    low: Capacity | None
    high: Capacity | None
    verdict: Verdict
    predicted_error: str | None
    fixes: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


def dtype_bytes(kv_dtype: str, model_dtype: str | None) -> float | None:
    name = (kv_dtype or "auto").lower()
    if name == "auto":
        return _DTYPE_BYTES.get((model_dtype or "bfloat16").lower())
    return _DTYPE_BYTES.get(name)


def pp_stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them (get_pp_indices): evenly, and the remainder
    one each to the stages before the last, counting back from it (the last holds the norm)."""
    pp = max(1, pp)
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[pp - i] += 1
    return parts


def kv_per_token(
    geo: ModelGeometry, kv_dtype: str, tensor_parallel: int = 1, pipeline_parallel: int = 1
) -> KvPerToken | None:
    """KV bytes per token on one GPU; None when config.json lacks what it needs."""
    if not geo.num_layers:
        return None
    types = geo.layer_types  # () means every layer is full attention (counted, not listed)
    skipped = sum(1 for t in types if t not in ("full_attention", "sliding_attention"))
    sliding = sum(1 for t in types if t == "sliding_attention")
    kv_layers = len(types) - skipped if types else geo.num_layers
    per_stage = max(pp_stage_layers(kv_layers, pipeline_parallel))
    shown = "model dtype" if kv_dtype == "auto" else kv_dtype
    if geo.kv_lora_rank is not None:
        latent = geo.kv_lora_rank + (geo.qk_rope_head_dim or 0)
        if kv_dtype == "fp8_ds_mla":
            per_layer: float = FP8_DS_MLA_BYTES
            how = f"MLA fp8_ds_mla: {FP8_DS_MLA_BYTES} B per layer"
        else:
            size = dtype_bytes(kv_dtype, geo.torch_dtype)
            if size is None:
                return None
            per_layer = latent * size
            how = (
                f"MLA: (kv_lora_rank {geo.kv_lora_rank} + qk_rope_head_dim "
                f"{geo.qk_rope_head_dim or 0}) x {size:g} B ({shown}), one latent, not split "
                "across TP"
            )
        return KvPerToken("mla", per_stage, per_layer, kv_dtype, how, skipped, sliding)
    if not geo.num_kv_heads or not geo.head_dim:
        return None
    size = dtype_bytes(kv_dtype, geo.torch_dtype)
    if size is None:
        return None
    heads = max(1, geo.num_kv_heads // max(1, tensor_parallel))
    split = (
        f"{geo.num_kv_heads} KV heads / TP {tensor_parallel} = {heads} per GPU"
        if geo.num_kv_heads >= tensor_parallel
        else f"{geo.num_kv_heads} KV heads < TP {tensor_parallel}: replicated, 1 per GPU"
    )
    per_layer = 2 * heads * geo.head_dim * size
    how = f"2 (K, V) x {split} x head_dim {geo.head_dim} x {size:g} B ({shown})"
    return KvPerToken("standard", per_stage, per_layer, kv_dtype, how, skipped, sliding)


def default_block_size(layout: Layout, attention: str | None) -> tuple[int, str]:
    if layout.block_size:
        return layout.block_size, "--block-size"
    if layout.device == "cpu":
        if attention == "mla":
            return 16, "vLLM's CPU MLA backend (16)"
        return 128, "vLLM's CPU default (128)"
    return 16, "vLLM's default (16; some backends take larger blocks, a rounding of < 1 block)"


def capacity(
    kv: KvPerToken, available: int, block_size: int, max_model_len: int | None
) -> Capacity:
    """What vLLM prints for ``available`` bytes per GPU (``GPU KV cache size: N tokens``)."""
    block_bytes = int(kv.bytes_per_layer * block_size) * kv.layers
    blocks = max(0, available // block_bytes) if block_bytes > 0 else 0
    if max_model_len:
        per_request = -(-max_model_len // block_size)
        tokens = int(blocks / per_request * max_model_len)
    else:
        tokens = blocks * block_size
    usable = max(0, (available - block_bytes) // block_bytes) if block_bytes > 0 else 0
    return Capacity(tokens, blocks, block_size, usable * block_size)


def needed_bytes(kv: KvPerToken, block_size: int, max_model_len: int) -> int:
    """KV memory one request of ``max_model_len`` tokens needs on one GPU, as vLLM counts it."""
    return -(-max_model_len // block_size) * int(kv.bytes_per_layer * block_size) * kv.layers


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def reserve(layout: Layout, gpus: int) -> tuple[int, int, str]:
    """The non-KV, non-weights memory vLLM's profiling finds in use: a range, because it moves
    with --max-num-batched-tokens, the MoE kernels, the driver and NCCL."""
    if layout.kv_cache_memory_bytes is not None:
        return 0, 0, f"none: the KV budget is set outright ({layout.kv_memory_source})"
    low = int(0.3 * GIB) + int(0.5 * GIB)  # non-torch (CUDA context, cuBLAS) + activation peak
    high = int(1.0 * GIB) + int(3.0 * GIB)
    why = "non-torch 0.3-1.0 GiB (CUDA context, cuBLAS), activation peak 0.5-3.0 GiB"
    if gpus > 1:
        high += int(0.5 * GIB)
        why += ", NCCL buffers up to 0.5 GiB"
    why += "; CUDA graphs are captured after the KV cache, in the 1 - utilization headroom"
    return low, high, why


def plan(
    geo: ModelGeometry,
    kv_dtype: str,
    layout: Layout,
    *,
    weights_bytes: int | None,
    weights_explain: str,
    capacity_bytes: int | None,
    capacity_source: str,
) -> MemoryPlan:
    tp, pp = max(1, layout.tensor_parallel), max(1, layout.pipeline_parallel)
    kv = kv_per_token(geo, kv_dtype, tp, pp)
    block, block_src = default_block_size(layout, kv.attention if kv else None)
    mml = layout.max_model_len or geo.max_position_embeddings
    mml_src = (
        "--max-model-len"
        if layout.max_model_len
        else "config.json max_position_embeddings"
        if mml
        else "unknown"
    )
    util = layout.gpu_memory_utilization or DEFAULT_UTILIZATION
    r_low, r_high, r_why = reserve(layout, tp * pp)
    notes: list[str] = []
    if kv is not None and kv.sliding_layers:
        notes.append(
            f"{kv.sliding_layers} sliding-window layer(s) counted as full attention: an upper "
            "bound on bytes per token (vLLM's hybrid allocator keeps only their window)"
        )
    if kv is not None and kv.skipped_layers:
        notes.append(f"{kv.skipped_layers} linear-attention layer(s): fixed state, not counted")
    if kv is not None and kv.layers == 0:
        notes.append("no layer keeps a per-token KV cache: the cache's size is not planned")
    if layout.expert_parallel and layout.data_parallel > 1:
        notes.append(
            "experts split over TP x DP with expert parallelism: weights are an upper bound"
        )

    a_low: int | None = None
    a_high: int | None = None
    if layout.kv_cache_memory_bytes is not None:
        a_low = a_high = layout.kv_cache_memory_bytes
    elif capacity_bytes is not None and weights_bytes is not None:
        budget = int(capacity_bytes * util) - weights_bytes
        a_low, a_high = budget - r_high, budget - r_low
    low = capacity(kv, a_low, block, mml) if kv and a_low is not None and a_low > 0 else None
    high = capacity(kv, a_high, block, mml) if kv and a_high is not None and a_high > 0 else None
    verdict, error, fixes = _verdict(
        kv, block, mml, a_low, a_high, low, high, layout, util, capacity_bytes, weights_bytes
    )
    return MemoryPlan(
        kv=kv,
        block_size=block,
        block_size_source=block_src,
        max_model_len=mml,
        max_model_len_source=mml_src,
        weights_bytes=weights_bytes,
        weights_explain=weights_explain,
        capacity_bytes=capacity_bytes,
        capacity_source=capacity_source,
        utilization=util,
        reserve_low_bytes=r_low,
        reserve_high_bytes=r_high,
        reserve_explain=r_why,
        available_low=a_low,
        available_high=a_high,
        low=low,
        high=high,
        verdict=verdict,
        predicted_error=error,
        fixes=tuple(fixes),
        notes=tuple(notes),
    )


def _verdict(
    kv: KvPerToken | None,
    block: int,
    mml: int | None,
    a_low: int | None,
    a_high: int | None,
    low: Capacity | None,
    high: Capacity | None,
    layout: Layout,
    util: float,
    capacity_bytes: int | None,
    weights_bytes: int | None,
) -> tuple[Verdict, str | None, list[str]]:
    block_bytes = int(kv.bytes_per_layer * block) * kv.layers if kv is not None else 0
    # A page of no bytes (no layer with a per-token cache) or no length: no tokens to judge by.
    if kv is None or a_high is None or not mml or block_bytes <= 0:
        return "unknown", None, []
    if capacity_bytes is not None and weights_bytes is not None and weights_bytes > capacity_bytes:
        return (
            "will_fail",
            "CUDA out of memory while loading the weights "
            f"({_gib(weights_bytes)} per GPU on {_gib(capacity_bytes)})",
            ["more GPUs (a larger --tensor-parallel-size or --pipeline-parallel-size)"],
        )
    if a_high <= 0:
        return (
            "will_fail",
            "No available memory for the cache blocks",
            [
                "a higher --gpu-memory-utilization",
                "more GPUs (a larger --tensor-parallel-size)",
            ],
        )
    need = needed_bytes(kv, block, mml)
    # One request of max_model_len tokens must fit beside the null block, in the bytes and in
    # the capacity vLLM will print: a plan of fewer tokens is never `fits`.
    fits_high = need <= a_high - block_bytes and high is not None and high.tokens >= mml
    fits_low = (
        a_low is not None and need <= a_low - block_bytes and low is not None and low.tokens >= mml
    )
    if fits_low:
        return "fits", None, []
    fixes = _fixes(
        kv,
        need,
        block_bytes,
        a_low if a_low and a_low > 0 else a_high,
        low or high,
        layout,
        util,
        capacity_bytes,
    )
    if fits_high:
        return "tight", None, fixes
    avail = a_high
    est = high.max_len_fits if high else 0
    error = (
        f"To serve at least one request with the model's max seq len ({mml}), "
        f"({need / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
        f"memory ({avail / GIB:.2f} GiB). Based on the available memory, the estimated maximum "
        f"model length is {est}."
    )
    return "will_fail", error, fixes


def _fixes(
    kv: KvPerToken,
    need: int,
    block_bytes: int,
    avail: int,
    cap: Capacity | None,
    layout: Layout,
    util: float,
    capacity_bytes: int | None,
) -> list[str]:
    fixes = []
    if cap is not None and cap.max_len_fits > 0:
        fixes.append(f"--max-model-len {cap.max_len_fits}")
    short = need + block_bytes - avail
    if capacity_bytes and layout.kv_cache_memory_bytes is None:
        wanted = util + short / capacity_bytes
        if wanted < 0.99:
            fixes.append(f"--gpu-memory-utilization {min(0.99, wanted + 0.005):.2f}")
    quantized = kv.dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")
    if not quantized and need / 2 + block_bytes / 2 <= avail:
        fixes.append("--kv-cache-dtype fp8 (half the bytes per token)")
    fixes.append("more GPUs (a larger --tensor-parallel-size)")
    return fixes
