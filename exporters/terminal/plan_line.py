"""The status screen's memory-plan row, from /status's `memory_plan` (a JSON document: the
screen also draws a remote daemon's status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text

STYLE = {"fits": "green", "tight": "yellow", "will_fail": "red"}


def _int(doc: Mapping[str, Any], key: str) -> int | None:
    v = doc.get(key)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def plan_line(doc: Any) -> Text | None:
    if not isinstance(doc, Mapping):
        return None
    verdict = str(doc.get("verdict") or "unknown")
    low, high = _int(doc, "planned_tokens_low"), _int(doc, "planned_tokens_high")
    line = Text()
    if low is not None and high is not None:
        planned = f"{low:,}" if low == high else f"{low:,}-{high:,}"
        line.append(f"{verdict.replace('_', ' ')}: {planned} tokens planned", STYLE.get(verdict))
    per_token = doc.get("kv_bytes_per_token")
    if isinstance(per_token, int | float):
        line.append((" · " if line else "") + f"{per_token:,.0f} B/token")
    tokens, avail = _int(doc, "actual_tokens"), _int(doc, "actual_available_bytes")
    if tokens is not None and avail is not None:
        cmp = str(doc.get("actual_vs_plan") or "")
        line.append(f" · vLLM {tokens:,} tokens in {avail / 2**30:.2f} GiB ")
        line.append(f"({cmp.replace('_', ' ')})", "red" if cmp == "differs" else "dim")
    return line if line else None
