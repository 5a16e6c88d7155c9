"""A tqdm bar's context across records: whose it is and when it was drawn.

A bar redrawn with `\\r` alone repeats neither the process prefix nor a logging header: an update
belongs to whoever drew that bar (by its description) last, and its time is the bar's start, from
its own elapsed field when it began (or went back), plus its elapsed. Any engine that loads with
tqdm prints such bars; a grammar's stream keeps one `Bars`.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadwatch.parsers.events import ShardProgress
from loadwatch.parsers.recipes import set_fields


@dataclass(slots=True)
class _Anchor:
    start_ts: float
    last_done: int


class Bars:
    """The owner and the start time of each bar seen."""

    def __init__(self) -> None:
        self._owner: dict[str, tuple[str, int | None]] = {}
        self._anchors: dict[tuple[str | None, str], _Anchor] = {}

    def own(self, event: ShardProgress) -> ShardProgress:
        """An update with a process names its bar's owner; one without gets the owner's."""
        if event.process is not None:
            self._owner[event.desc] = (event.process, event.pid)
            return event
        owner = self._owner.get(event.desc)
        if owner is not None:
            set_fields(event, process=owner[0], pid=owner[1])
        return event

    def time(
        self, process: str | None, desc: str, done: int, elapsed_s: float, last_ts: float
    ) -> float:
        """A bar update's time, its record having no header (`last_ts`: the time of the last
        record that had one)."""
        key = (process, desc)
        anchor = self._anchors.get(key)
        if anchor is None or done < anchor.last_done or done == 0:
            anchor = _Anchor(last_ts - elapsed_s, done)
            self._anchors[key] = anchor
        anchor.last_done = done
        return anchor.start_ts + elapsed_s
