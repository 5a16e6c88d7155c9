"""The memory plan against what vLLM reports: decided once, here, for the snapshot.

Before vLLM sizes its KV cache the view holds the plan alone (from the checkpoint's config.json
and shard sizes, the supervised command line, and the GPUs' capacity as NVML reads it). Once the
log says ``Available KV cache memory: X GiB`` (the CPU: ``Explicitly set (X/..) GiB for KV
cache``) and ``GPU KV cache size: N tokens``, it also holds the tokens loadwatch's bytes per
token give for vLLM's own X: a difference beyond 2% means the KV dtype, the attention layout or
the parallel layout differs from what loadwatch knows (a wrong plan, said so rather than hidden),
and the actual budget against the planned range says whether the reserve was as estimated."""

from __future__ import annotations

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.state.kvdtype import KvDtype
from loadwatch.daemon.state.memplan import GIB, capacity
from loadwatch.daemon.state.memplan_inputs import layout_from_argv, plan_start
from loadwatch.daemon.state.session import Session, StateData
from loadwatch.daemon.state.snapshot import MemoryPlanView

TOLERANCE = 0.02


def _kv_name(kv: KvDtype) -> str | None:
    if kv.dtype is None:
        return None
    return "auto" if kv.dtype in ("model dtype", "auto") else kv.dtype


def memory_plan_view(state: StateData, s: Session | None, kv: KvDtype) -> MemoryPlanView | None:
    model = state.model
    dtype = _kv_name(kv)
    if model is None or model.geometry is None or dtype is None:
        return None
    size = s.milestones.get("kv_cache.size") if s is not None else None
    avail = s.milestones.get("kv_cache.available_memory") if s is not None else None
    totals = [g.sample.memory_total_bytes for g in state.gpus.values()]
    argv = s.argv if s is not None else None
    logged = s.launch_args if s is not None and not argv else None
    key = (
        dtype,
        argv or logged,
        next((t for t in totals if t), None),
        None if size is None else (size.tokens, size.value),
        None if avail is None else avail.gib,
        logged is not None,
    )
    last = _LAST[0]
    if last is not None and last[0] is model and last[1] == key:
        return last[2]
    view = _view(model, *key)
    _LAST[0] = (model, key, view)
    return view


# A snapshot is built after every change and the plan's inputs change a few times per load:
# the last view is kept, keyed on the model object itself (hashing its shard list costs more
# than the plan) and the few other inputs.
_LAST: list[tuple[ModelInfo, tuple[object, ...], MemoryPlanView] | None] = [None]


def _view(
    model: ModelInfo,
    dtype: str,
    argv: tuple[str, ...] | None,
    cap: int | None,
    size: tuple[int | None, str | None] | None,
    avail_gib: float | None,
    logged: bool,
) -> MemoryPlanView:
    device = "cpu" if size is not None and size[1] == "CPU" else "cuda"
    layout = layout_from_argv(argv or (), device=device)
    p = plan_start(model, dtype, layout, cap, "NVML" if cap else "unknown")
    assert p is not None  # (the caller checked the geometry)
    actual_bytes = int(avail_gib * GIB) if avail_gib is not None else None
    actual_tokens = size[0] if size is not None else None
    expected = None
    if p.kv is not None and actual_bytes is not None:
        expected = capacity(p.kv, actual_bytes, p.block_size, p.max_model_len).tokens
    status, explain = _compare(
        p.available_low, p.available_high, actual_bytes, actual_tokens, expected
    )
    if not argv:
        explain += " (launch arguments unknown: planned as TP 1, PP 1)"
    elif logged:
        explain += " (launch arguments as vLLM logged them at start)"
    return MemoryPlanView(
        verdict=p.verdict,
        predicted_error=p.predicted_error,
        kv_dtype=dtype,
        kv_bytes_per_token=None if p.kv is None else p.kv.bytes,
        block_size=p.block_size,
        max_model_len=p.max_model_len,
        weights_bytes_per_gpu=p.weights_bytes,
        capacity_bytes_per_gpu=p.capacity_bytes,
        budget_low_bytes=p.available_low,
        budget_high_bytes=p.available_high,
        planned_tokens_low=None if p.low is None else p.low.tokens,
        planned_tokens_high=None if p.high is None else p.high.tokens,
        actual_available_bytes=actual_bytes,
        actual_tokens=actual_tokens,
        expected_tokens=expected,
        actual_vs_plan=status,
        explain=explain,
    )


def _compare(
    low: int | None,
    high: int | None,
    actual_bytes: int | None,
    actual_tokens: int | None,
    expected: int | None,
) -> tuple[str, str]:
    if actual_tokens is None or actual_bytes is None or expected is None:
        return "pending", "vLLM has not sized its KV cache yet"
    off = (actual_tokens - expected) / expected if expected else 1.0
    if abs(off) > TOLERANCE:
        return (
            "differs",
            f"vLLM holds {actual_tokens:,} tokens in {actual_bytes / GIB:.2f} GiB where the plan's "
            f"bytes per token give {expected:,} ({off:+.1%}): the KV dtype or the layout differs "
            "from what loadwatch knows",
        )
    tokens = f"{actual_tokens:,} tokens as planned for {actual_bytes / GIB:.2f} GiB ({off:+.1%})"
    if low is None or high is None:
        return "as_planned", tokens
    if actual_bytes < low:
        return "below_budget", f"{tokens}; the budget is below the planned {low / GIB:.2f} GiB"
    if actual_bytes > high:
        return "above_budget", f"{tokens}; the budget is above the planned {high / GIB:.2f} GiB"
    return "as_planned", f"{tokens}, within the planned budget"
