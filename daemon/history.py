"""The history of finished starts, in the state directory: one JSON file the daemon reads when
it starts and writes each time a start gets ready (daemon/state/learned.py says what is kept
and what it is for).

The file is written whole or not at all (a temporary file, fsync, rename, fsync of the
directory). One that cannot be read as a history (not JSON, a wrong shape, a value out of
range, larger than `MAX_BYTES`) is set aside as `<name>.corrupt` with one `daemon.problem`
line, and the daemon goes on with none. To clear the history, delete the file while the daemon
is stopped (a running daemon keeps what it read and writes it back at the next ready).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadwatch.daemon.state.learned import PER_KEY, TOTAL, PastStart, StartKey, entry_of, remember
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.snapshot import STARTUP_PHASES, Transition
from loadwatch.daemon.tools.patch_files import atomic_write

FILE_NAME = "starts.json"
FORMAT = 1
MAX_BYTES = 1024 * 1024  # 200 starts take well under a quarter of this
_KEY_TEXT = ("model", "version", "layout", "gpu", "kv_dtype")


class BadHistory(ValueError):
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
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadHistory(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadHistory(f"not a history of format {FORMAT}")
    starts = doc.get("starts")
    if not isinstance(starts, list) or len(starts) > TOTAL:
        raise BadHistory(f"its starts are not a list of at most {TOTAL}")
    history: tuple[PastStart, ...] = ()
    for d in starts:
        history = remember(history, _entry(d))  # (bounded per key as it is read)
    return history


class StartHistory:
    """The history file of one state directory; `problem` says one line of what went wrong."""

    def __init__(self, state_dir: Path, problem: Callable[[str], None]) -> None:
        self.path = state_dir / FILE_NAME
        self.problem = problem

    def load(self) -> tuple[PastStart, ...]:
        """The history; none when there is no file, or one set aside as corrupt."""
        try:
            with self.path.open("rb") as f:
                data = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return ()
        except OSError as e:
            self.problem(f"start history {self.path}: cannot read it: {e.strerror}")
            return ()
        try:
            if len(data) > MAX_BYTES:
                raise BadHistory(f"larger than {MAX_BYTES} bytes")
            return from_json(data)
        except BadHistory as e:
            self._set_aside(str(e))
            return ()

    def _set_aside(self, why: str) -> None:
        aside = self.path.with_name(self.path.name + ".corrupt")
        try:
            os.replace(self.path, aside)
            self.problem(f"start history {self.path}: {why}; set aside as {aside.name}")
        except OSError as e:
            self.problem(f"start history {self.path}: {why}; cannot set it aside: {e.strerror}")

    def save(self, history: tuple[PastStart, ...]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(self.path, to_json(history), 0o600)
        except OSError as e:
            self.problem(f"start history {self.path}: cannot write it: {e.strerror}")

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
