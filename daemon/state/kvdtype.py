"""The effective KV-cache dtype of a launch, and the known-benign rule for KV-scale warnings.

Missing k/v scales in a checkpoint only matter when the KV cache is stored quantized (FP8): the
scale then falls back to 1.0, which can cost accuracy. With a bf16/fp16 KV cache the scales are
never used and the warnings (one per layer) are noise. So the verdict needs the dtype vLLM
actually uses:

- an explicit `--kv-cache-dtype X` in the launch arguments wins (the last one, as argparse does;
  vLLM also accepts `--kv_cache_dtype`);
- `auto` (also the default when the flag is absent) means the checkpoint's declared KV dtype from
  vLLM 0.12 (2025-12) on, and the model's dtype (never FP8) before;
- the log itself can settle it: `Using KV cache scaling factor 1.0 for fp8...` is only printed
  on the FP8 path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.supervise import vllm_argv

Verdict = Literal["benign", "flagged", "unknown", "unrated"]

# `auto` follows the checkpoint's KV declaration from this release (2025-12) on.
AUTO_FOLLOWS_CHECKPOINT_FROM = (0, 12)
_UNQUANTIZED = frozenset(
    {"auto", "bfloat16", "float16", "half", "float", "float32", "bf16", "fp16"}
)

# Warning codes of the KV-scale family (the fold's codes, see state.py).
KV_SCALE_CODES = frozenset({"kv_scale_missing", "q_scale_from_k"})
# Printed by vLLM only when the KV cache or attention runs in FP8.
FP8_PATH_CODES = frozenset({"kv_scale_default", "q_prob_scale_default"})


@dataclass(frozen=True, slots=True)
class KvDtype:
    dtype: str | None  # what vLLM stores the KV cache in, e.g. "fp8_e4m3", "model dtype"
    quantized: bool | None  # FP8 (or another scaled format); None: not known
    source: Literal["argv", "checkpoint", "model", "log", "unknown"]
    reason: str  # one line


def argv_kv_dtype(argv: tuple[str, ...]) -> str | None:
    """The value of the last `--kv-cache-dtype` in `argv`, or None when absent."""
    value = vllm_argv.option(argv, "--kv-cache-dtype") or vllm_argv.option(argv, "--kv_cache_dtype")
    return value.strip().lower() if value is not None else None


def parse_version(text: str | None) -> tuple[int, int] | None:
    """`0.11.1rc2.dev5+gabc` -> (0, 11)."""
    if not text:
        return None
    parts = text.lstrip("v").split(".")
    if len(parts) < 2:
        return None
    digits = ["".join(ch for ch in p[:4] if ch.isdigit()) for p in parts[:2]]
    if not digits[0] or not digits[1] or not parts[1][:1].isdigit():
        return None
    return int(digits[0]), int(digits[1])


def is_quantized(dtype: str) -> bool:
    return dtype.lower() not in _UNQUANTIZED


def effective_kv_dtype(
    argv: tuple[str, ...] | None,
    model: ModelInfo | None,
    version: str | None,
    log_fp8: bool = False,
) -> KvDtype:
    """`argv` None: the launch arguments are not known (the log is followed without a supervisor)."""
    if log_fp8:
        return KvDtype("fp8", True, "log", "the log says vLLM stores the KV cache in FP8")
    if argv is None:
        return KvDtype(None, None, "unknown", "launch arguments not known")
    explicit = argv_kv_dtype(argv)
    if explicit is not None and explicit != "auto":
        q = is_quantized(explicit)
        return KvDtype(explicit, q, "argv", f"--kv-cache-dtype {explicit} on the command line")
    if explicit is None and any(a == "--config" or a.startswith("--config=") for a in argv):
        return KvDtype(None, None, "unknown", "launch arguments come partly from a --config file")
    ver = parse_version(version)
    if ver is not None and ver < AUTO_FOLLOWS_CHECKPOINT_FROM:
        return KvDtype(
            "model dtype",
            False,
            "model",
            f"--kv-cache-dtype auto on vLLM {version} keeps the model's dtype",
        )
    if model is None:
        return KvDtype(
            None, None, "unknown", "--kv-cache-dtype auto and the checkpoint not read yet"
        )
    assumed = "" if ver is not None else " (assuming vLLM 0.12 or later)"
    ckpt = model.checkpoint_kv_dtype
    if ckpt is None:
        return KvDtype(
            "model dtype",
            False,
            "checkpoint",
            f"--kv-cache-dtype auto and the checkpoint declares no KV dtype{assumed}",
        )
    q = is_quantized(ckpt)
    return KvDtype(
        ckpt, q, "checkpoint", f"--kv-cache-dtype auto follows the checkpoint's {ckpt}{assumed}"
    )


def warning_verdict(code: str, kv: KvDtype) -> tuple[Verdict, str]:
    """The verdict on one warning code, and its one-line reason."""
    if code in FP8_PATH_CODES:
        return "flagged", "printed only on the FP8 path: a default 1.0 scale can cost accuracy"
    if code not in KV_SCALE_CODES:
        return "unrated", "no rule for this message"
    if kv.quantized is None:
        return "unknown", f"KV-cache dtype unknown: {kv.reason}"
    if kv.quantized:
        return "flagged", f"KV cache is {kv.dtype}: missing scales fall back to 1.0 ({kv.reason})"
    return "benign", f"KV cache is not quantized, the scales are unused ({kv.reason})"


__all__ = [
    "AUTO_FOLLOWS_CHECKPOINT_FROM",
    "FP8_PATH_CODES",
    "KV_SCALE_CODES",
    "KvDtype",
    "Verdict",
    "argv_kv_dtype",
    "effective_kv_dtype",
    "is_quantized",
    "parse_version",
    "warning_verdict",
]
