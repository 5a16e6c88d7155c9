"""Prometheus still gets its scrapes with 500 slow connections open (twice `max_connections`).

The real daemon on loopback, `[http] max_connections` at its default (256). This test opens 500
connections that each send half a request and then nothing (slowloris; on loopback they come
from the scraper's own address, so no per-address rule can tell them apart), then scrapes
/metrics 20 times on fresh connections, as Prometheus does, each with a 2 s timeout. Measured
side by side: the share of scrapes answered 200 before the slow connections and while they are
open. Before, the slots went to the slow connections and 88% of scrapes were refused; now a
connection still waiting for its request is the one that gives way.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.reliability.scrapes import answered, idle_daemon

SLOW = 500


def test_scrapes_get_through_500_slow_connections(tmp_path: Path) -> None:
    d, host, port = idle_daemon(tmp_path)
    slow: list[socket.socket] = []
    try:
        quiet = answered(host, port)
        t0 = time.monotonic()
        for _ in range(SLOW):
            s = socket.create_connection((host, port), timeout=2)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            slow.append(s)
        # (each is connected: the server takes them in, in order, before any scrape after them)
        attacked = answered(host, port)
        took = time.monotonic() - t0
        print(f"\nscrapes answered: quiet {quiet:.0%}, with {SLOW} slow connections {attacked:.0%}")
        assert quiet == 1.0
        assert attacked >= 0.95
        assert took < 20
        assert d.proc.poll() is None
    finally:
        for s in slow:
            s.close()
        assert d.stop() == 0
    assert "Traceback" not in d.stderr()
