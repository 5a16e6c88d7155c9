"""The history of finished starts, in the state directory: one JSON file the daemon reads when
it starts and writes each time a start gets ready (daemon/state/learned.py says what is kept
and what it is for).

The file is written and read as every state file is (statefile.py: whole or not at all; one
that cannot be read as a history is set aside with one `daemon.problem` line, and the daemon
goes on with none). To clear the history, delete the file while the daemon
is stopped (a running daemon keeps what it read and writes it back at the next ready).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadwatch.daemon.state.learned import PER_KEY, TOTAL, PastStart, StartKey, entry_of, remember
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.snapshot import STARTUP_PHASES, Transition
from loadwatch.daemon.statefile import BadDocument, StateFile, bounded_list, document

FILE_NAME = "starts.json"
FORMAT = 1
MAX_BYTES = 1024 * 1024  # 200 starts take well under a quarter of this
_KEY_TEXT = ("model", "version", "layout", "gpu", "kv_dtype")


class BadHistory(BadDocument):
    pass


def to_json(history: tuple[PastStart, ...]) -> bytes:
    starts = []
    for e in history:
        key = {n: getattr(e.key, n) for n in StartKey.__slots__ if getattr(e.key, n) is not None}
        starts.append(
            {
                "key": key,
                "ready_at": e.ready_at,
                "steps": [[p, s] for p, s in e.steps],
                "ready_s": e.ready_s,
                "weights_bytes_per_s": e.weights_bytes_per_s,
            }
        )
    return json.dumps({"format": FORMAT, "starts": starts}, indent=1).encode() + b"\n"


def _seconds(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise BadHistory(f"{what} is not a number of seconds")
    return float(v)


def _entry(d: Any) -> PastStart:
    if not isinstance(d, dict):
        raise BadHistory("a start is not an object")
    k = d.get("key")
    if not isinstance(k, dict) or set(k) - set(StartKey.__slots__):
        raise BadHistory("a start's key is not one")
    for name in _KEY_TEXT:
        if k.get(name) is not None and (not isinstance(k[name], str) or len(k[name]) > 4096):
            raise BadHistory(f"a start's {name} is not text")
    if k.get("cache") not in (None, "warm", "cold"):
        raise BadHistory("a start's cache is not warm or cold")
    size = k.get("model_bytes")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise BadHistory("a start's model_bytes is not a size")
    steps = d.get("steps")
    if not isinstance(steps, list) or not steps or len(steps) > 64:
        raise BadHistory("a start's steps are not a list")
    out = []
    for step in steps:
        if not isinstance(step, list) or len(step) != 2 or step[0] not in STARTUP_PHASES:
            raise BadHistory("a start's step is not [phase, seconds]")
        out.append((str(step[0]), _seconds(step[1], "a step")))
    rate = d.get("weights_bytes_per_s")
    return PastStart(
        key=StartKey(**k),
        ready_at=_seconds(d.get("ready_at"), "ready_at"),
        steps=tuple(out),
        ready_s=_seconds(d.get("ready_s"), "ready_s"),
        weights_bytes_per_s=_seconds(rate, "the read rate") if rate is not None else None,
    )


def from_json(data: bytes) -> tuple[PastStart, ...]:
    starts = bounded_list(document(data, FORMAT, "a history"), "starts", TOTAL)
    history: tuple[PastStart, ...] = ()
    for d in starts:
        history = remember(history, _entry(d))  # (bounded per key as it is read)
    return history


class StartHistory:
    """The history file of one state directory (statefile.py); `problem` says one line of what
    went wrong."""

    def __init__(self, state_dir: Path, problem: Callable[[str], None]) -> None:
        self.file: StateFile[tuple[PastStart, ...]] = StateFile(
            state_dir,
            FILE_NAME,
            what="start history",
            max_bytes=MAX_BYTES,
            parse=from_json,
            none=(),
            problem=problem,
        )
        self.path = self.file.path

    def load(self) -> tuple[PastStart, ...]:
        """The history; none when there is no file, or one set aside as corrupt."""
        return self.file.load()

    def save(self, history: tuple[PastStart, ...]) -> None:
        self.file.save(to_json(history))

    def learn(self, state: LoadState, t: Transition) -> LoadState:
        """`state` with the start that transition `t` made ready added to its history, which is
        saved; `state` itself for any other transition."""
        s = state.session
        if t.kind != "phase" or t.phase_to != "ready" or s is None or t.session != s.id:
            return state
        entry = entry_of(state.model, state.gpus, s)
        if entry is None:
            return state
        history = remember(state.config.history, entry)
        self.save(history)
        return replace(state, config=replace(state.config, history=history))


__all__ = ["FILE_NAME", "PER_KEY", "TOTAL", "BadHistory", "StartHistory", "from_json", "to_json"]
