"""The status screen's memory-plan row, from /status's `memory_plan` (a JSON document: the
screen also draws a remote daemon's status)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from loadwatch.exporters.terminal.docread import amount, count, mapping, string

STYLE = {"fits": "green", "tight": "yellow", "will_fail": "red"}


def plan_line(value: Any) -> Text | None:
    doc = mapping(value)
    if not doc:
        return None
    verdict = string(doc.get("verdict")) or "unknown"
    low, high = count(doc.get("planned_tokens_low")), count(doc.get("planned_tokens_high"))
    line = Text()
    if low is not None and high is not None:
        planned = f"{low:,}" if low == high else f"{low:,}-{high:,}"
        line.append(f"{verdict.replace('_', ' ')}: {planned} tokens planned", STYLE.get(verdict))
    per_token = amount(doc.get("kv_bytes_per_token"))
    if per_token is not None:
        line.append((" · " if line else "") + f"{per_token:,.0f} B/token")
    tokens, avail = count(doc.get("actual_tokens")), amount(doc.get("actual_available_bytes"))
    if tokens is not None and avail is not None:
        cmp = string(doc.get("actual_vs_plan")) or ""
        line.append(f" · vLLM {tokens:,} tokens in {avail / 2**30:.2f} GiB ")
        line.append(f"({cmp.replace('_', ' ')})", "red" if cmp == "differs" else "dim")
    return line if line else None
