"""Read the few settings loadwatch needs out of the vLLM command line (an argv list)."""

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
