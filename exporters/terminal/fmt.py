"""Small text helpers shared by the analyze report and the status screen: times in the log's
own form, durations, sizes, short lists (plain text: the consoles that draw it are console.py's)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from loadwatch.daemon.state.durations import duration as duration

PIPE_WIDTH = 100  # text width when stdout is not a terminal (COLUMNS overrides)


def _local(form: str, ts: float | None) -> str:
    if ts is None:
        return "-"
    try:
        return time.strftime(form, time.localtime(ts))
    except (OverflowError, OSError, ValueError):  # no such time: a bad figure from elsewhere
        return "?"


def clock(ts: float | None) -> str:
    """A log-style local time, `MM-DD HH:MM:SS`, the form vLLM prints (easy to grep for)."""
    return _local("%m-%d %H:%M:%S", ts)


def hms(ts: float | None) -> str:
    return _local("%H:%M:%S", ts)


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def ranges(values: Sequence[int], limit: int = 6) -> str:
    """`0-60` or `1-2, 5, 9-11`: layer numbers, compactly."""
    if not values:
        return "-"
    spans: list[tuple[int, int]] = []
    for v in sorted(values):
        if spans and v == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], v)
        else:
            spans.append((v, v))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit]]
    if len(spans) > limit:
        parts.append("…")
    return ", ".join(parts)


def few(names: Sequence[str], limit: int = 3) -> str:
    if not names:
        return "-"
    shown = ", ".join(names[:limit])
    return shown + (f" +{len(names) - limit}" if len(names) > limit else "")


def clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pipe_width() -> int:
    try:
        return max(40, int(os.environ.get("COLUMNS", "")))
    except ValueError:
        return PIPE_WIDTH


__all__ = [
    "clip",
    "clock",
    "duration",
    "few",
    "hms",
    "pipe_width",
    "ranges",
    "size",
]
