"""Prometheus still gets its scrapes while 600 connections pipeline requests and never read.

The real daemon on loopback, `[http] max_connections` at its default (256). Each slow reader
opens a connection with a small receive buffer, sends 100 pipelined `GET /metrics` at once and
never reads a byte: the server's answers fill both socket buffers and its writes block. Then
/metrics is scraped 20 times on fresh connections, as Prometheus does, each with a 2 s timeout.
Measured side by side: the share of scrapes answered before the slow readers and while they
hold their connections. Before, every slot was held by a write that could not finish and most
scrapes were refused; now a connection whose client does not take its answer gives way, as one
whose request has not arrived does (test_slowloris.py).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.reliability.scrapes import answered, idle_daemon

READERS = 600
PIPELINED = 100


def _slow_reader(host: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    s.settimeout(2)
    s.connect((host, port))
    s.setblocking(False)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        s.send(request * PIPELINED)  # as much as the server takes; never read the answers
    except BlockingIOError:
        pass
    return s


def test_scrapes_get_through_600_connections_that_never_read(tmp_path: Path) -> None:
    d, host, port = idle_daemon(tmp_path)
    readers: list[socket.socket] = []
    try:
        quiet = answered(host, port)
        t0 = time.monotonic()
        for _ in range(READERS):
            try:
                readers.append(_slow_reader(host, port))
            except OSError:
                pass  # refused or reset: the server's choice, not the test's concern
        attacked = answered(host, port)
        took = time.monotonic() - t0
        print(
            f"\nscrapes answered: quiet {quiet:.0%}, with {len(readers)} connections that never"
            f" read {attacked:.0%}"
        )
        assert quiet == 1.0
        assert attacked >= 0.95
        assert took < 30
        assert d.proc.poll() is None
    finally:
        for s in readers:
            s.close()
        assert d.stop() == 0
    assert "Traceback" not in d.stderr()
