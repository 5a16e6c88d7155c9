"""The processes of a session, for `loadwatch analyze`: `/status`'s `session.processes[]`
(daemon/state/ranks.py) with the log's line numbers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessReport:  # `/status`'s `session.processes[]`, with line numbers
    name: str
    pid: int | None
    first_line: int | None
    first_offset: int
    first_at: float
    last_line: int | None
    last_offset: int
    last_at: float
    silent_s: float
    phase: str
    step: str | None
    shard: int | None
    bar_done: int | None
    bar_total: int | None
    silent_while_peers_moved_on: bool
