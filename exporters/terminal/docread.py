"""Reading a `/status` document that may come from anywhere (another version of loadwatch, or
not loadwatch at all): each reader returns the value when it has the type and range the views
can draw, else None or empty, which they show as unknown. Never an exception."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

LARGEST = 1e18  # no figure a daemon sends comes near it (bytes of memory: about 1e12)


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def items(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()


def number(value: Any) -> float | None:
    """A finite number of sane size (NaN, infinities and 400-digit integers are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) and abs(f) < LARGEST else None


def amount(value: Any) -> float | None:
    """A number that cannot be negative: bytes, seconds taken, a ratio."""
    n = number(value)
    return n if n is not None and n >= 0 else None


def integer(value: Any) -> int | None:
    n = number(value)
    return int(n) if n is not None else None


def count(value: Any) -> int | None:
    """How many of something: a whole number, not negative."""
    n = amount(value)
    return int(n) if n is not None else None


def yes(value: Any) -> bool:
    """A flag: true only when the document says `true` (not "no", not 1)."""
    return value is True


def string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def strings(value: Any) -> list[str]:
    return [x for x in items(value) if isinstance(x, str)]


__all__ = ["amount", "count", "integer", "items", "mapping", "number", "string", "strings", "yes"]
