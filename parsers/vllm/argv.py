"""vLLM's command line (an argv list): the few settings loadwatch reads out of it."""

from __future__ import annotations

from collections.abc import Sequence


def option(argv: Sequence[str], name: str) -> str | None:
    """The value of ``name X`` or ``name=X``; the last one wins, as with argparse."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def model_path(argv: Sequence[str]) -> str | None:
    """``--model X``, else the positional after ``serve`` (``vllm serve MODEL ...``)."""
    explicit = option(argv, "--model")
    if explicit is not None:
        return explicit
    for i, arg in enumerate(argv[:-1]):
        if arg == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def kv_cache_dtype(argv: Sequence[str]) -> str | None:
    return option(argv, "--kv-cache-dtype")


# What vLLM's `--kv-cache-dtype` accepts: vLLM 0.32's `CacheDType` (vllm/config/cache.py), which
# holds every earlier release's names too.
KV_CACHE_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4",
    "nvfp4_ds_mla",
    "nvfp4_4over6",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
)


def with_flag(argv: Sequence[str], name: str) -> tuple[str, ...]:
    """``argv`` with the flag ``name`` (``--enforce-eager``) given once, at the end: every
    ``name``, ``name=X`` and its negation (``--no-enforce-eager``, argparse's
    BooleanOptionalAction) taken out first."""
    negation = "--no-" + name.removeprefix("--")
    kept = [a for a in argv if a not in (name, negation) and not a.startswith(name + "=")]
    return (*kept, name)


def with_option(argv: Sequence[str], name: str, value: str | None) -> tuple[str, ...]:
    """``argv`` with every ``name X`` / ``name=X`` taken out and, unless ``value`` is None,
    ``name value`` appended (argparse takes the last one; one is clearer)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == name and i + 1 < len(argv):
            skip = True
            continue
        if arg.startswith(name + "="):
            continue
        out.append(arg)
    if value is not None:
        out += [name, value]
    return tuple(out)
