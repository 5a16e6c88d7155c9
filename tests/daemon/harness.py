"""Run the real daemon on a thread of the test process, and talk to it over HTTP."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from loadwatch.daemon.app import run_daemon
from loadwatch.daemon.config import Config, EventsConfig
from loadwatch.daemon.loop import Daemon
from tests.client import DaemonClient
from tests.helpers import wait_for


class Running(DaemonClient):
    def __init__(self) -> None:
        self.daemon: Daemon | None = None
        self.url = ""
        self.code: int | None = None
        self.out = io.StringIO()
        self.started = threading.Event()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.out.getvalue().splitlines() if x.strip()]

    def wait(self, check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
        wait_for(check, what, timeout_s, every_s=0.05)

    def stop(self) -> None:
        d = self.daemon
        assert d is not None
        d.loop_call(d.stop_event.set)


@contextmanager
def running(cfg: Config, **kw: Any) -> Iterator[Running]:
    r = Running()

    def on_started(daemon: Daemon, server: Any) -> None:
        r.daemon = daemon
        r.url = server.url
        r.started.set()

    # The captured stdout is where these tests read the event log: ask for all of it there
    # (the daemon's default keeps parsed log events to the events file).
    if cfg.events == EventsConfig():
        cfg = dataclasses.replace(cfg, events=EventsConfig(stdout="all"))

    def target() -> None:
        r.code = run_daemon(cfg, on_started=on_started, stdout=r.out, **kw)
        r.started.set()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    assert r.started.wait(20), "daemon did not start"
    assert r.daemon is not None, f"daemon failed to start (exit {r.code})"
    try:
        # The HTTP side answers 503 "starting" until the loop's first bundle reached it: what
        # a test reads is the daemon's word, not that moment (under load it lasts a while).
        # (Over TLS the test brings its own client.)
        r.wait(
            lambda: r.code is not None or r.url.startswith("https:") or not _starting(r),
            "the first /status",
        )
        yield r
    finally:
        if r.code is None:
            r.stop()
        t.join(15)
        assert not t.is_alive(), "daemon did not stop"


def _starting(r: Running) -> bool:
    return r.get("/status")[1] == b'{"error": "starting"}\n'
