"""The memory plan as preflight prints it: text lines (each figure with where it came from) and
the JSON document for --json."""

from __future__ import annotations

from typing import Any

from loadwatch.daemon.state.memplan import GIB, Capacity, MemoryPlan


def _gib(n: int | float | None) -> str:
    return "unknown" if n is None else f"{n / GIB:.2f} GiB"


def _range(low: int | None, high: int | None, unit: str = "") -> str:
    if low is None and high is None:
        return "unknown"
    if low == high or low is None or high is None:
        v = high if low is None else low
        return f"{v:,}{unit}"
    return f"{low:,}-{high:,}{unit}"


def _cap_dict(c: Capacity | None) -> dict[str, int] | None:
    if c is None:
        return None
    return {"tokens": c.tokens, "blocks": c.blocks, "max_model_len_fits": c.max_len_fits}


def plan_dict(p: MemoryPlan) -> dict[str, Any]:
    kv = p.kv
    return {
        "verdict": p.verdict,
        "predicted_error": p.predicted_error,
        "fixes": list(p.fixes),
        "kv_bytes_per_token": None if kv is None else kv.bytes,
        "kv_layers_per_gpu": None if kv is None else kv.layers,
        "kv_bytes_per_token_per_layer": None if kv is None else kv.bytes_per_layer,
        "kv_dtype": None if kv is None else kv.dtype,
        "kv_explain": None if kv is None else kv.explain,
        "block_size": p.block_size,
        "block_size_source": p.block_size_source,
        "max_model_len": p.max_model_len,
        "max_model_len_source": p.max_model_len_source,
        "weights_bytes_per_gpu": p.weights_bytes,
        "weights_explain": p.weights_explain,
        "capacity_bytes_per_gpu": p.capacity_bytes,
        "capacity_source": p.capacity_source,
        "gpu_memory_utilization": p.utilization,
        "reserve_bytes": [p.reserve_low_bytes, p.reserve_high_bytes],
        "reserve_explain": p.reserve_explain,
        "kv_budget_bytes_per_gpu": [p.available_low, p.available_high],
        "kv_capacity_low": _cap_dict(p.low),
        "kv_capacity_high": _cap_dict(p.high),
        "max_concurrency": _concurrency(p),
        "notes": list(p.notes),
    }


def _concurrency(p: MemoryPlan) -> list[float | None] | None:
    if not p.max_model_len:
        return None
    return [None if c is None else round(c.tokens / p.max_model_len, 2) for c in (p.low, p.high)]


def plan_lines(p: MemoryPlan) -> list[str]:
    """Indented lines for ``loadwatch preflight``'s text output."""
    kv = p.kv
    out = ["  memory plan, per GPU:"]
    out.append(f"    weights      {_gib(p.weights_bytes)}  ({p.weights_explain})")
    if kv is None:
        out.append("    KV/token     unknown (config.json lacks the attention shapes)")
    else:
        out.append(
            f"    KV/token     {kv.bytes:,.0f} B = {kv.layers} layers x {kv.bytes_per_layer:g} B "
            f"({kv.explain})"
        )
    out.append(f"    capacity     {_gib(p.capacity_bytes)}  ({p.capacity_source})")
    if p.available_low is not None and p.available_low == p.available_high:
        out.append(f"    KV budget    {_gib(p.available_high)}  ({p.reserve_explain})")
    else:
        out.append(
            f"    KV budget    {_gib(p.available_low)} - {_gib(p.available_high)}  "
            f"(utilization {p.utilization:g} x capacity - weights - reserve "
            f"{_gib(p.reserve_low_bytes)}-{_gib(p.reserve_high_bytes)}: {p.reserve_explain})"
        )
    lo, hi = p.low, p.high
    toks = _range(lo.tokens if lo else None, hi.tokens if hi else None, " tokens")
    blocks = _range(lo.blocks if lo else None, hi.blocks if hi else None)
    out.append(
        f"    KV cache     {toks}, {blocks} blocks of {p.block_size} ({p.block_size_source})"
    )
    conc = _concurrency(p)
    if conc is not None and p.max_model_len:
        shown = " - ".join("?" if c is None else f"{c:.2f}x" for c in conc)
        out.append(
            f"    max-model-len {p.max_model_len:,} ({p.max_model_len_source}): concurrency {shown}"
        )
    out.extend(f"    note: {n}" for n in p.notes)
    verdict = {
        "fits": "fits",
        "tight": "tight: fits only if the reserve is small",
        "will_fail": "will fail",
        "unknown": "unknown",
    }[p.verdict]
    out.append(f"    verdict      {verdict}")
    if p.predicted_error:
        out.append(f"    expect       {p.predicted_error}")
    if p.fixes:
        out.append(f"    fixes        {'; '.join(p.fixes)}")
    return out


def memory_check_message(p: MemoryPlan) -> str:
    """One line for the preflight check list."""
    hi, lo = p.high, p.low
    if p.verdict == "unknown":
        return "not planned: " + (
            "GPU capacity unknown (give --gpu-memory-gib or --gpu-model)"
            if p.capacity_bytes is None and p.available_high is None
            else "config.json lacks the shapes, or no weights"
        )
    toks = _range(lo.tokens if lo else 0, hi.tokens if hi else 0)
    mml = f"--max-model-len {p.max_model_len:,}" if p.max_model_len else "max-model-len"
    if p.verdict == "fits":
        return f"KV cache {toks} tokens per GPU: {mml} fits"
    if p.verdict == "tight":
        return f"KV cache {toks} tokens per GPU: {mml} fits only with a small reserve"
    return f"{mml} will not fit: expect {p.predicted_error}"
