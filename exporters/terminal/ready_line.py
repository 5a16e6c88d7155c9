"""The status screen's row of the time left to ready that earlier starts give, from /status's
`session.startup_eta` (daemon/state/learned.py), or why there is none while the start loads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.text import Text

from loadwatch.exporters.terminal.docread import amount, mapping, number, string
from loadwatch.exporters.terminal.fmt import duration, hms

LOADING = ("starting", "loading_weights", "post_load", "stalled")


def ready_line(session: Mapping[str, Any]) -> Text | None:
    eta = mapping(session.get("startup_eta"))
    rem = amount(eta.get("remaining_s"))
    if rem is not None:
        line = Text(f"in {duration(rem)}", "bold")
        low, high = amount(eta.get("remaining_low_s")), amount(eta.get("remaining_high_s"))
        line.append(f" ({duration(low)} – {duration(high)})")
        at = number(eta.get("ready_at"))
        if at is not None:
            line.append(f", about {hms(at)}")
        line.append(f" · {string(eta.get('basis')) or 'earlier starts'}", "dim")
        return line
    if session.get("phase") in LOADING:
        why = string(session.get("startup_eta_reason")) or "not known"
        return Text(f"no ETA yet: {why}", "dim")
    return None


__all__ = ["ready_line"]
