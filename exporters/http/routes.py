"""What /metrics, /status, /readyz and /livez answer, rendered from each published bundle.

A `Board` (exporters/http/board.py) is what the routes serve: the exposition and the /status JSON
rendered once per published bundle, and the ready flag. The daemon renders boards in its loop
and hands them to the HTTP server's own process (exporters/http/process.py), so a scrape never waits
for the parser.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from prometheus_client import ProcessCollector

from loadwatch.daemon.state.published import Published
from loadwatch.exporters.http.board import EMPTY, Board
from loadwatch.exporters.prometheus import LoadwatchCollector, registry_for, render
from loadwatch.parsers.vllm.argv_secrets import Redactor


class BoardMaker:
    """Renders boards from published bundles (the collector reads the bundle being rendered)."""

    def __init__(self, clock: Callable[[], float], redactor: Redactor | None = None) -> None:
        self._clock = clock
        self._red = redactor or Redactor()
        self._pub: Published | None = None
        self._registry = registry_for(LoadwatchCollector(lambda: self._pub, clock))
        ProcessCollector(registry=self._registry)  # the daemon's process_*: rendered in it
        self._lock = threading.Lock()

    def make(self, pub: Published | None) -> Board:
        if pub is None:
            return EMPTY
        with self._lock:
            self._pub = pub
            metrics = render(self._registry)
        snap = pub.snapshot(self._clock())
        status = json.dumps(self._red.value(snap.to_dict()), sort_keys=False).encode() + b"\n"
        not_ready = snap.not_ready or ""
        log = pub.log
        # The log source failing (not merely absent, as before vLLM starts) is the daemon's
        # own health: it runs, and sees nothing.
        down = log is not None and log.last_error is not None and not log.state_error
        sick = f"the log source is down: {log.last_error}" if down and log else ""
        return Board(metrics, status, snap.ready, not_ready, snap.live, snap.not_live or "", sick)
