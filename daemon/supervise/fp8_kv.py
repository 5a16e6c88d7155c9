"""What the `fp8_kv_unsupported` remedy (remedies.py) needs beyond the command: the memory plan of
a start with the model-dtype KV cache instead of the FP8 one, and the reversible config patch.

The model-dtype (bf16) cache takes twice the bytes per token of the FP8 one, so the same memory
holds half the tokens: before the remedy is applied, the plan (state/memplan_inputs.py's
`plan_start`, the one the preflight uses) says whether `--max-model-len` still fits, and what the
change costs in KV tokens per GPU (the line the `vllm.remedy` event shows).

The patch is `loadwatch patch-model --drop-fp8-kv-cache` (tools/patch.py), called as a function:
its originals are kept byte for byte beside the files, and `revert` puts them back (the remedy
did not help) exactly as `patch-model --revert` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from loadwatch.daemon.state.crashloop import MAX_DIFF_LINES
from loadwatch.daemon.state.memplan_inputs import plan_argv
from loadwatch.daemon.tools.patch import EXIT_OK, drop_fp8_kv_cache, revert_model
from loadwatch.daemon.tools.patch_plan import SAID, tokens_text

# The flag's value: vLLM's `auto` takes the checkpoint's FP8 declaration since 2025-12
# (tools/preflight.py's AUTO_TAKES_CHECKPOINT_SINCE), so the model dtype is named outright, as
# the preflight's own fix says.
MODEL_DTYPE_FLAG = "bfloat16"


@dataclass(frozen=True, slots=True)
class KvCost:
    """A start with the model-dtype KV cache: whether `--max-model-len` fits, and the line that
    says what it costs."""

    fits: bool
    line: str


KvCostOf = Callable[[Sequence[str]], "KvCost | None"]


def kv_cost(
    argv: Sequence[str], env: Mapping[str, str], capacity: tuple[int, str] | None
) -> KvCost | None:
    """The memory plan of `argv` with the FP8 and with the model-dtype KV cache; None when it
    cannot be planned (no model directory, no attention shapes)."""
    before = plan_argv(argv, env, capacity, "fp8_e4m3")
    after = plan_argv(argv, env, capacity, "auto")
    if before is None or after is None or after.kv is None:
        return None
    line = (
        f"KV tokens per GPU: with FP8 {tokens_text(before)}, with the model dtype "
        f"{tokens_text(after)} (twice the bytes per token)"
    )
    if after.max_model_len:
        line += f"; --max-model-len {after.max_model_len:,} {SAID[after.verdict]} with it"
    fits = after.verdict != "will_fail"
    if not fits and after.predicted_error:
        line += f": expect {after.predicted_error}"
    return KvCost(fits, line)


def _lines(text: str) -> tuple[str, ...]:
    return tuple(text.rstrip("\n").splitlines()[:MAX_DIFF_LINES])


def apply_patch(model_dir: str) -> tuple[bool, tuple[str, ...]]:
    """Drop the checkpoint's FP8 KV declaration: (whether files changed, the report's lines:
    the diff of each file, or why nothing changed)."""
    text, code = drop_fp8_kv_cache(model_dir)
    changed = code == EXIT_OK and not text.startswith("nothing to change")
    return changed, _lines(text)


def revert_patch(model_dir: str) -> tuple[str, ...]:
    """Put the originals back byte for byte: the report's lines (the diff back, or why not)."""
    text, _code = revert_model(model_dir)
    return _lines(text)


__all__ = [
    "MODEL_DTYPE_FLAG",
    "KvCost",
    "KvCostOf",
    "apply_patch",
    "kv_cost",
    "revert_patch",
]
