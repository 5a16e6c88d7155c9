"""The remedies: named rules from a classified start-up failure to one change of the next start's
command. Which are tried, and in which order, is `[vllm] remedies`; the ladder that applies,
announces and reverts them is ladder.py.

- `max_model_len`: after `kv_cache_too_small` or `max_model_len`, start with the largest
  `--max-model-len` vLLM said would fit (its ValueError prints the estimate:
  parsers/vllm/catalog.py's `fitting_model_len`); when it says none, the largest the memory
  plan says fits (state/memplan_inputs.py's `plan_argv`, the plan the preflight shows); never
  below `[vllm] remedy_min_model_len`.
- `gpu_memory_utilization`: after `cuda_oom` in the KV-cache profiling or the CUDA-graph capture
  (what vLLM allocates beside its memory budget ran out), start with `--gpu-memory-utilization`
  lower by `[vllm] remedy_gpu_memory_step` (from 0.9 when not given: vLLM's default, 0.92 in
  0.32), never below
  `MIN_GPU_MEMORY_UTILIZATION`.
- `fp8_kv_unsupported`: after `fp8_kv_unsupported` (the attention backend refused the FP8 KV
  cache: TRITON_MLA on SM120), start with the model-dtype KV cache, as `[vllm] remedy_fp8` says:
  `flag` starts with `--kv-cache-dtype bfloat16` (no file changes), `patch` drops the checkpoint's
  FP8 KV declaration from its config files (`patch-model --drop-fp8-kv-cache`, reverted byte for
  byte when it did not help). Not applied when the memory plan says `--max-model-len` does not
  fit the model-dtype cache (twice the bytes per token): fp8_kv.py.
- `enforce_eager` (opt-in: only when listed): after a start stalled in `torch_compile` or
  `graph_capture` (the daemon's stall detection; the supervisor ends such a start as a failure
  of kind `stall` when this remedy is configured), start with `--enforce-eager`.

Some failures have no remedy, and the ladder says so instead of trying one: `cuda_oom` while the
weights load (the memory the weights need is not there; no setting of vLLM makes it so), and a
ZMQ IPC socket path too long for the OS (a shorter TMPDIR is the fix, not the command).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from loadwatch.daemon.state.crashloop import MAX_MESSAGE_CHARS, RemedyStep, diff_lines
from loadwatch.daemon.supervise.fp8_kv import (
    MODEL_DTYPE_FLAG,
    KvCostOf,
    apply_patch,
    revert_patch,
)
from loadwatch.parsers.vllm.argv import (
    kv_cache_dtype,
    model_path,
    option,
    with_flag,
    with_option,
)
from loadwatch.parsers.vllm.catalog import classify, fitting_model_len, ipc_path_too_long

REMEDY_NAMES = ("max_model_len", "gpu_memory_utilization", "fp8_kv_unsupported", "enforce_eager")
FP8_MODES = ("flag", "patch")  # `[vllm] remedy_fp8`
MAX_MODEL_LEN_KINDS = frozenset({"kv_cache_too_small", "max_model_len"})
# The start-up steps whose allocations come beside vLLM's memory budget (timeline.py's phases)
OOM_OUTSIDE_BUDGET_PHASES = frozenset({"kv_cache", "graph_capture"})
# vLLM's default when the flag is not given (vllm/config/cache.py, `gpu_memory_utilization`):
# 0.92 in 0.32, 0.9 before; the lower, so that a step down from it is below either.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
MIN_GPU_MEMORY_UTILIZATION = 0.5  # below this, the KV cache left is rarely worth serving
# A start the supervisor ended because it stalled (supervisor.py `note_stall`): the kind of its
# failure, and the start-up steps (timeline.py's phases) the `enforce_eager` remedy is for.
STALL = "stall"
EAGER_PHASES = frozenset({"torch_compile", "graph_capture"})
FLAG = ""  # the value of a change that gives a flag without one (`--enforce-eager`)
PREFLIGHT = "preflight"  # the phase of a failure the preflight predicts (its start never ran)


@dataclass(frozen=True, slots=True)
class Failed:
    """A failed start as the remedies judge it: its kind, the start-up phase it failed in, and
    the root cause's message (which may hold what vLLM says would work)."""

    kind: str
    phase: str
    message: str


@dataclass(frozen=True, slots=True)
class Change:
    """One argument of the command set to a new value (`before` None: it was not given), or
    (`option` None) the model directory's config patched: `patch_dir`, and once applied
    (`carry_out`) the files changed as diff lines."""

    option: str | None
    before: str | None
    after: str | None
    reason: str
    patch_dir: str | None = None
    files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Settings:
    min_model_len: int = 2048
    gpu_memory_step: float = 0.05
    fp8_mode: str = "flag"  # FP8_MODES
    kv_cost: KvCostOf | None = None  # the memory plan with the model-dtype KV cache
    # The largest --max-model-len the memory plan says fits a command (None: it cannot say)
    planned_len: Callable[[Sequence[str]], int | None] | None = None


def _max_model_len(failed: Failed, argv: Sequence[str], settings: Settings) -> Change | str | None:
    if failed.kind not in MAX_MODEL_LEN_KINDS:
        return None
    fits = fitting_model_len(failed.message)
    said = "vLLM's estimate"
    if fits is None and settings.planned_len is not None:
        fits, said = settings.planned_len(argv), "the memory plan's"
    if fits is None:
        return "neither vLLM nor the memory plan said which --max-model-len would fit"
    current = option(argv, "--max-model-len")
    if current is not None and current.isdigit() and fits >= int(current):
        return f"{said} ({fits}) is not below --max-model-len {current}"
    if fits < settings.min_model_len:
        return (
            f"{said} ({fits}) is below the floor (remedy_min_model_len = {settings.min_model_len})"
        )
    if said == "vLLM's estimate":
        how = "vLLM estimated that a maximum model length of"
        where = "the KV cache memory it found"
    else:  # (vLLM gave no estimate: No available memory for the cache blocks, say)
        how = "vLLM gave no estimate; the memory plan says a maximum model length of"
        where = "the KV cache budget it expects"
    why = f"{failed.kind}: {how} {fits} fits {where}"
    return Change("--max-model-len", current, str(fits), why)


def _gpu_memory_utilization(
    failed: Failed, argv: Sequence[str], settings: Settings
) -> Change | str | None:
    if failed.kind != "cuda_oom" or failed.phase not in OOM_OUTSIDE_BUDGET_PHASES:
        return None
    current = option(argv, "--gpu-memory-utilization")
    try:
        now = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if current is None else float(current)
    except ValueError:
        return f"--gpu-memory-utilization {current!r} is not a number"
    lower = round(now - settings.gpu_memory_step, 2)
    if lower < MIN_GPU_MEMORY_UTILIZATION:
        return f"{lower:g} would be below {MIN_GPU_MEMORY_UTILIZATION:g}"
    was = f"{now:g}" + (" (vLLM's default)" if current is None else "")
    why = (
        f"cuda_oom in {failed.phase}: what vLLM allocates beside its memory budget did not fit; "
        f"--gpu-memory-utilization {was} lowered by {settings.gpu_memory_step:g} to leave it room"
    )
    return Change("--gpu-memory-utilization", current, f"{lower:g}", why)


def _fp8_kv_unsupported(
    failed: Failed, argv: Sequence[str], settings: Settings
) -> Change | str | None:
    if failed.kind != "fp8_kv_unsupported":
        return None
    cost = settings.kv_cost(argv) if settings.kv_cost is not None else None
    if cost is not None and not cost.fits:
        return f"the model-dtype KV cache would not fit: {cost.line}"
    why = (
        "fp8_kv_unsupported: the attention backend refused the FP8 KV cache; the next start "
        "keeps it in the model dtype"
    )
    cost_line = f"; {cost.line}" if cost is not None else ""
    flag = kv_cache_dtype(argv)
    if settings.fp8_mode == "flag":
        if flag == MODEL_DTYPE_FLAG:
            return f"--kv-cache-dtype is {flag} already"
        reason = f"{why} (--kv-cache-dtype {MODEL_DTYPE_FLAG}){cost_line}"
        return Change(
            "--kv-cache-dtype", option(argv, "--kv-cache-dtype"), MODEL_DTYPE_FLAG, reason
        )
    if flag is not None and flag.lower() != "auto":
        return f"--kv-cache-dtype {flag} is given: a patch of the checkpoint does not change it"
    model = model_path(argv)
    if model is None:
        return "the command names no model directory to patch"
    reason = f"{why} (its config's FP8 KV declaration dropped, originals kept){cost_line}"
    return Change(None, None, None, reason, patch_dir=model)


def _enforce_eager(failed: Failed, argv: Sequence[str], settings: Settings) -> Change | str | None:
    if failed.kind != STALL or failed.phase not in EAGER_PHASES:
        return None
    if "--enforce-eager" in argv:
        return "--enforce-eager is given already"
    why = (
        f"stall in {failed.phase}: the next start runs eagerly (--enforce-eager: no "
        "torch.compile, no CUDA graphs), slower per token but without the step that hung"
    )
    return Change("--enforce-eager", None, FLAG, why)


_RULES = {
    "max_model_len": _max_model_len,
    "gpu_memory_utilization": _gpu_memory_utilization,
    "fp8_kv_unsupported": _fp8_kv_unsupported,
    "enforce_eager": _enforce_eager,
}


def predicted(reason: str) -> Failed:
    """The failure the preflight predicts, in vLLM's own words where its memory plan gives them
    (estimate included), as the remedies judge it: in phase `preflight`."""
    text = reason[:MAX_MESSAGE_CHARS]
    return Failed(classify(None, text), PREFLIGHT, text)


def with_change(argv: Sequence[str], option: str, after: str | None) -> tuple[str, ...]:
    """The command with one remedy's change of an argument: `after` FLAG gives a flag."""
    if after == FLAG:
        return with_flag(argv, option)
    return with_option(argv, option, after)


def propose(
    name: str, failed: Failed, argv: Sequence[str], settings: Settings
) -> Change | str | None:
    """What remedy `name` would change for `failed`: a `Change`; a reason it cannot, for a
    failure it is about; None for a failure it is not about."""
    return _RULES[name](failed, argv, settings)


def carry_out(change: Change) -> Change | str:
    """Do what a change needs beyond the command (the patch of the model's config): the change
    with the files changed, or why it could not be done (nothing was changed then)."""
    if change.patch_dir is None:
        return change
    changed, lines = apply_patch(change.patch_dir)
    if not changed:
        return "; ".join(lines) or "the patch changed nothing"
    return replace(change, files=lines)


def step_diff(change: Change) -> tuple[str, ...]:
    """A change as diff lines: of the command, or the files the patch changed."""
    return change.files or diff_lines(change.option, change.before, change.after)


def undo(step: RemedyStep) -> tuple[str, ...]:
    """Revert a remedy that did not help: the diff back (its files restored byte for byte)."""
    if step.patched is not None:
        return revert_patch(step.patched)
    return diff_lines(step.option, step.after, step.before)


def no_remedy(failed: Failed) -> str | None:
    """Why no remedy can help this failure, for failures known to have none."""
    if failed.kind == "cuda_oom" and failed.phase == "weights":
        return (
            "CUDA out of memory while loading weights: the memory the weights need is not there, "
            "no setting of vLLM frees it; no remedy"
        )
    if ipc_path_too_long(failed.message):
        return (
            "vLLM's ZMQ IPC socket path is longer than the OS allows (sockaddr_un.sun_path): a "
            "shorter TMPDIR (or VLLM_RPC_BASE_PATH) fixes it, no option of the command does; "
            "no remedy"
        )
    return None


__all__ = [
    "EAGER_PHASES",
    "FLAG",
    "FP8_MODES",
    "MAX_MODEL_LEN_KINDS",
    "MIN_GPU_MEMORY_UTILIZATION",
    "OOM_OUTSIDE_BUDGET_PHASES",
    "PREFLIGHT",
    "REMEDY_NAMES",
    "STALL",
    "Change",
    "Failed",
    "Settings",
    "carry_out",
    "no_remedy",
    "predicted",
    "propose",
    "step_diff",
    "undo",
    "with_change",
]
