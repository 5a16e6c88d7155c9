"""What /metrics, /status, /readyz and /livez answer, rendered from each published bundle.

A `Board` (exporters/http/board.py) is what the routes serve: the exposition and the /status JSON
rendered once per published bundle, and the ready flag. The daemon renders boards in its loop
and hands them to the HTTP server's own process (exporters/http/process.py), so a scrape never waits
for the parser.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any

from loadwatch.daemon.state.published import Published
from loadwatch.daemon.state.snapshot import Snapshot
from loadwatch.exporters.http.board import EMPTY, Board
from loadwatch.exporters.prometheus import LoadwatchCollector, Renderer, registry_for
from loadwatch.parsers.vllm.argv_secrets import Redactor


class BoardMaker:
    """Renders boards from published bundles (the collector reads the bundle being rendered)."""

    def __init__(self, clock: Callable[[], float], redactor: Redactor | None = None) -> None:
        self._clock = clock
        self._red = redactor or Redactor()
        self._pub: Published | None = None
        # (the daemon's process_* are the HTTP process's to read, at scrape time: board.py)
        self._registry = registry_for(LoadwatchCollector(lambda: self._pub, clock))
        self._render = Renderer(self._registry)
        self._lock = threading.Lock()

    def make(self, pub: Published | None) -> Board:
        if pub is None:
            return EMPTY
        with self._lock:
            self._pub = pub
            metrics = self._render()
        snap = pub.snapshot(self._clock())
        status = status_json(snap, self._red)
        not_ready = snap.not_ready or ""
        log = pub.log
        # The log source failing (not merely absent, as before vLLM starts) is the daemon's
        # own health: it runs, and sees nothing.
        down = log is not None and log.last_error is not None and not log.state_error
        sick = f"the log source is down: {log.last_error}" if down and log else ""
        return Board(metrics, status, snap.ready, not_ready, snap.live, snap.not_live or "", sick)


def status_json(snap: Snapshot, redactor: Redactor) -> bytes:
    """The /status body: `Snapshot.to_dict()` as JSON, redacted.

    Rendered with every published change, so it is encoded straight from the snapshot's
    dataclasses when the redactor has nothing to mask (it then returns what it is given): the
    C encoder asks `_fields` for each dataclass's fields in order, which is what `to_dict`
    makes of them, in a third of the time. A non-finite float (`to_dict` makes it null) or a
    redactor that knows secrets take the dict route."""
    probe: dict[str, Any] = {}
    if redactor.value(probe) is probe:
        try:
            return _ENCODER.encode(snap).encode() + b"\n"
        except ValueError:
            pass
    return json.dumps(redactor.value(snap.to_dict()), sort_keys=False).encode() + b"\n"


_NAMES: dict[type, tuple[str, ...]] = {}


def _fields(value: Any) -> Any:
    names = _NAMES.get(type(value))
    if names is None:
        if isinstance(value, set | frozenset):
            return list(value)
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            raise TypeError(f"{type(value).__name__} is not JSON serializable")
        names = _NAMES[type(value)] = tuple(f.name for f in dataclasses.fields(value))
    return {name: getattr(value, name) for name in names}


_ENCODER = json.JSONEncoder(default=_fields, allow_nan=False)
