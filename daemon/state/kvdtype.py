"""The effective KV-cache dtype of a launch, and the known-benign rule for KV-scale warnings.

Missing k/v scales in a checkpoint only matter when the KV cache is stored quantized (FP8): the
scale then falls back to 1.0, which can cost accuracy. With a bf16/fp16 KV cache the scales are
never used and the warnings (one per layer) are noise. So the verdict needs the dtype vLLM
actually uses, decided here once (the live daemon and `analyze` both read it from the snapshot)
from everything that says it, strongest first:

1. an explicit `--kv-cache-dtype X` in the live argv (the supervised command, or
   `/proc/PID/cmdline` of the vLLM that runs here; the last one wins, as argparse does; vLLM also
   accepts `--kv_cache_dtype`), or in vLLM's own `non-default args: {...}` line;
2. the engine config's `kv_cache_dtype=` (`Initializing a V1 LLM engine ... with config: ...`);
3. `Using fp8_e4m3 data type to store kv cache` (or an FP8-path-only warning): printed only
   when the cache is quantized;
4. a log that shows the start-up with no line of (3): vLLM prints it while it builds its
   configuration, before the model loads, whenever the cache is quantized (what vLLM did,
   stronger than what the checkpoint asks for);
5. `auto` (also the default when the flag is absent) means the checkpoint's declared KV dtype
   from vLLM 0.12 (2025-12) on, and the model's dtype (never FP8) before: the model directory
   (given, or the engine config's `model=` path when it is readable here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.parsers.vllm import argv as vllm_argv

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
    source: Literal["argv", "log_args", "engine_config", "checkpoint", "model", "log", "unknown"]
    reason: str  # one line


@dataclass(frozen=True, slots=True)
class KvEvidence:
    """What one vLLM start's log said about its KV cache, as the fold saw it."""

    args: str | None = None  # `non-default args`' kv_cache_dtype ("auto" when not given)
    engine: str | None = None  # the engine config's kv_cache_dtype=
    stored: str | None = None  # `Using X data type to store kv cache`
    fp8_path: bool = False  # a warning vLLM prints only on the FP8 path
    model_path: str | None = None  # the engine config's model=


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


def decide_kv_dtype(
    argv: tuple[str, ...] | None,
    log: KvEvidence,
    model: ModelInfo | None,
    version: str | None,
    startup_passed: bool = False,
) -> KvDtype:
    """The dtype from everything known, strongest first (the module doc). `argv` None: the
    launch arguments are not known; `startup_passed`: the log showed vLLM's start (its version)
    and then the model load begin, so the configuration, and its KV-cache dtype line, is past."""
    explicit = argv_kv_dtype(argv) if argv is not None else None
    if explicit is not None and explicit != "auto":
        return KvDtype(
            explicit,
            is_quantized(explicit),
            "argv",
            f"--kv-cache-dtype {explicit} on the command line",
        )
    if log.args is not None and log.args != "auto":
        return KvDtype(
            log.args,
            is_quantized(log.args),
            "log_args",
            f"--kv-cache-dtype {log.args} in the arguments vLLM logged",
        )
    if log.engine is not None and log.engine != "auto":
        return KvDtype(
            log.engine,
            is_quantized(log.engine),
            "engine_config",
            f"kv_cache_dtype={log.engine} in vLLM's engine config",
        )
    if log.stored is not None:
        return KvDtype(
            log.stored,
            is_quantized(log.stored),
            "log",
            f"the log says vLLM stores the KV cache in {log.stored}",
        )
    if log.fp8_path:
        return KvDtype("fp8", True, "log", "the log says vLLM stores the KV cache in FP8")
    given = explicit is not None or log.args is not None or log.engine is not None
    if (
        argv is not None
        and not given
        and any(a == "--config" or a.startswith("--config=") for a in argv)
    ):
        return KvDtype(None, None, "unknown", "launch arguments come partly from a --config file")
    ver = parse_version(version)
    if ver is not None and ver < AUTO_FOLLOWS_CHECKPOINT_FROM:
        return KvDtype(
            "model dtype",
            False,
            "model",
            f"--kv-cache-dtype auto on vLLM {version} keeps the model's dtype",
        )
    if startup_passed:
        return KvDtype(
            "model dtype",
            False,
            "log",
            "no KV-cache dtype line at start-up (vLLM logs one when it stores the KV cache "
            "quantized)",
        )
    if model is not None and not model.errors:
        kv = effective_kv_dtype(argv if argv is not None else (), model, version)
        if kv.quantized is not None and not given and argv is None:
            return KvDtype(
                kv.dtype,
                kv.quantized,
                kv.source,
                kv.reason + "; the log does not show the start-up, assuming no --kv-cache-dtype",
            )
        return kv
    if argv is None and not given:
        return KvDtype(None, None, "unknown", "launch arguments not known")
    return KvDtype(None, None, "unknown", "--kv-cache-dtype auto and the checkpoint not read yet")


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
    "KvEvidence",
    "Verdict",
    "argv_kv_dtype",
    "decide_kv_dtype",
    "effective_kv_dtype",
    "is_quantized",
    "parse_version",
    "warning_verdict",
]
