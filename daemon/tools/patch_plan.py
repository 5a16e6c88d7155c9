"""What ``patch-model --drop-fp8-kv-cache`` does to the memory plan: the KV bytes per token and
the tokens with the FP8 KV cache the checkpoint declares and with the model-dtype (bf16) cache
it leaves, and whether --max-model-len still fits."""

from __future__ import annotations

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.state.memplan import Layout, MemoryPlan
from loadwatch.daemon.state.memplan_inputs import NO_CAPACITY, plan_start

SAID = {"fits": "fits", "tight": "tight", "will_fail": "will not fit", "unknown": "unknown"}


def tokens_text(p: MemoryPlan) -> str:
    lo, hi = p.low, p.high
    if lo is None and hi is None:
        return "unknown (give --gpu-memory-gib or --gpu-model)"
    if lo is not None and hi is not None and lo.tokens != hi.tokens:
        return f"{lo.tokens:,}-{hi.tokens:,}"
    one = lo or hi
    assert one is not None
    return f"{one.tokens:,}"


def patch_effect_lines(
    info: ModelInfo, layout: Layout, capacity: tuple[int, str] | None, dry_run: bool
) -> list[str]:
    """Lines for the patch report; none when the checkpoint declares no FP8 KV cache."""
    if info.checkpoint_kv_dtype != "fp8":
        return []
    before = plan_start(info, "fp8_e4m3", layout, *(capacity or NO_CAPACITY))
    after = plan_start(info, "auto", layout, *(capacity or NO_CAPACITY))
    if before is None or after is None or before.kv is None or after.kv is None:
        return ["memory plan: config.json lacks the attention shapes: not planned"]
    verb = "would change" if dry_run else "changes"
    out = [f"what the patch {verb} in the memory plan, per GPU:"]
    out.append(
        f"  KV bytes/token   fp8_e4m3 {before.kv.bytes:,.0f} -> model dtype "
        f"{after.kv.bytes:,.0f} ({after.kv.bytes / before.kv.bytes:.1f}x)"
    )
    out.append(f"  KV tokens        with FP8 {tokens_text(before)}; with bf16 {tokens_text(after)}")
    if after.max_model_len:
        out.append(
            f"  --max-model-len  {after.max_model_len:,} ({after.max_model_len_source}): "
            f"{SAID[before.verdict]} with FP8, {SAID[after.verdict]} with bf16"
        )
    if after.predicted_error:
        out.append(f"  expect           {after.predicted_error}")
    if after.fixes and after.verdict in ("will_fail", "tight"):
        fixes = [f for f in after.fixes if not f.startswith("--kv-cache-dtype")]
        out.append(f"  fixes            {'; '.join(fixes)}")
    return out
