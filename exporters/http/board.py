"""What the HTTP routes serve, and how it travels to the HTTP server's process.

A `Board` is the exposition, the /status JSON and the ready flag, rendered once per published
bundle (exporters/http/routes.py renders them). `board_routes` answers requests from the current
board and nothing else, so it needs no part of the daemon: the HTTP server's process
(exporters/http/process.py) imports this module, the HTTP server and prometheus_client, no more.

Boards travel over a stream socket as frames: a 4-byte big-endian length, then the body.
A board's body is a fixed header (flags, four lengths) and the four byte strings; no
pickle, so the server process never executes what it is sent.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from loadwatch.exporters.http.server import Handler, HttpStats, Response

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"
MAX_FRAME = 256 << 20  # a longer frame means the stream is corrupt


@dataclass(frozen=True)
class Board:
    """Everything the routes answer, rendered from one published bundle."""

    metrics: bytes
    status: bytes | None  # compact JSON; None before the first bundle
    ready: bool
    not_ready: str  # why /readyz says 503
    live: bool = True  # what /livez answers (the snapshot decides: Snapshot.live)
    not_live: str = ""  # why /livez says 503
    sick: str = ""  # why /healthz says 503 though the loop ticks (a source that cannot work)


EMPTY = Board(b"", None, False, "not ready: starting")

_HEAD = struct.Struct("!BIIIII")  # flags (1 ready, 2 has status, 4 live), five lengths
_LEN = struct.Struct("!I")


def frame(body: bytes) -> bytes:
    """`body` with its length in front."""
    return _LEN.pack(len(body)) + body


def encode(board: Board) -> bytes:
    status = board.status or b""
    reason = board.not_ready.encode()
    dead = board.not_live.encode()
    sick = board.sick.encode()
    flags = (
        (1 if board.ready else 0)
        | (2 if board.status is not None else 0)
        | (4 if board.live else 0)
    )
    body = b"".join(
        (
            _HEAD.pack(flags, len(board.metrics), len(status), len(reason), len(dead), len(sick)),
            board.metrics,
            status,
            reason,
            dead,
            sick,
        )
    )
    return frame(body)


def decode(body: bytes) -> Board:
    """The inverse of `encode` (without the frame length); ValueError when malformed."""
    if len(body) < _HEAD.size:
        raise ValueError("board frame too short")
    flags, n_metrics, n_status, n_reason, n_dead, n_sick = _HEAD.unpack_from(body)
    if _HEAD.size + n_metrics + n_status + n_reason + n_dead + n_sick != len(body):
        raise ValueError("board frame lengths do not add up")
    at = _HEAD.size
    metrics = body[at : at + n_metrics]
    at += n_metrics
    status = body[at : at + n_status] if flags & 2 else None
    at += n_status
    reason = body[at : at + n_reason].decode(errors="replace")
    at += n_reason
    dead = body[at : at + n_dead].decode(errors="replace")
    at += n_dead
    sick = body[at:].decode(errors="replace")
    return Board(metrics, status, bool(flags & 1), reason, bool(flags & 4), dead, sick)


def read_frame(sock: socket.socket) -> bytes | None:
    """The next frame's body; None when the peer closed the stream."""
    head = _read_exactly(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ValueError(f"board frame of {n} bytes")
    return _read_exactly(sock, n)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def board_routes(
    board: Callable[[], Board],
    alive: Callable[[], bool],
    http: HttpStats | None = None,
    fresh: Callable[[], Board] | None = None,
) -> dict[str, Handler]:
    """Handlers that only write what the current board holds. With `http`, /metrics also carries
    the server's own request counts (when it runs apart from the collector). With `fresh`,
    /metrics and /status serve what it gives (a board asked for anew when the one held is
    behind: exporters/http/process.py); the probes answer the board held."""
    read = fresh or board

    registry: CollectorRegistry | None = None
    if http is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Requests(http))
        # The serving process's own CPU, memory and descriptors, and the daemon's (its parent,
        # the plain process_*), read at scrape time: always fresh, and never rendered by the
        # daemon's loop, which publishes only what changed.
        ProcessCollector(namespace="loadwatch_http", registry=registry)
        ProcessCollector(pid=lambda: str(os.getppid()), registry=registry)

    def metrics(q: Mapping[str, str]) -> Response:
        body = read().metrics
        if registry is not None:
            body += generate_latest(registry)
        return Response(HTTPStatus.OK, body, CONTENT_TYPE)

    def status(q: Mapping[str, str]) -> Response:
        body = read().status
        if body is None:
            return Response(HTTPStatus.SERVICE_UNAVAILABLE, b'{"error": "starting"}\n', JSON)
        if q.get("pretty"):
            body = json.dumps(json.loads(body), indent=1).encode() + b"\n"
        return Response(HTTPStatus.OK, body, JSON)

    def healthz(q: Mapping[str, str]) -> Response:
        if not alive():
            return Response(HTTPStatus.SERVICE_UNAVAILABLE, b"the daemon loop is not ticking\n")
        sick = board().sick
        if sick:
            return Response(HTTPStatus.SERVICE_UNAVAILABLE, sick.encode() + b"\n")
        return Response(HTTPStatus.OK, b"ok\n")

    def readyz(q: Mapping[str, str]) -> Response:
        b = board()
        if b.ready:
            return Response(HTTPStatus.OK, b"ready\n")
        return Response(HTTPStatus.SERVICE_UNAVAILABLE, b.not_ready.encode() + b"\n")

    def livez(q: Mapping[str, str]) -> Response:
        # A daemon whose loop stopped ticking cannot say whether vLLM progresses: /livez then
        # stays 200 (killing vLLM for loadwatch's fault would cost the load); /healthz is 503.
        b = board()
        if b.live:
            return Response(HTTPStatus.OK, b"live\n")
        return Response(HTTPStatus.SERVICE_UNAVAILABLE, b"not live: " + b.not_live.encode() + b"\n")

    def landing(q: Mapping[str, str]) -> Response:
        return Response(HTTPStatus.OK, LANDING, "text/html; charset=utf-8")

    return {
        "/": landing,
        "/metrics": metrics,
        "/status": status,
        "/healthz": healthz,
        "/readyz": readyz,
        "/livez": livez,
    }


PROBES = ("/healthz", "/readyz", "/livez")  # what the probe listener serves, without credentials

# What an exporter answers at /: where everything is, as node_exporter's page does.
LANDING = b"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>loadwatch</title></head>
<body><h1>loadwatch</h1>
<p>Watches a large model load into vLLM.</p>
<ul>
<li><a href="metrics">/metrics</a>: Prometheus metrics</li>
<li><a href="status?pretty=1">/status</a>: the load state as JSON</li>
<li><a href="healthz">/healthz</a>: 200 while the daemon is alive and can read its log</li>
<li><a href="readyz">/readyz</a>: 200 while vLLM is ready</li>
<li><a href="livez">/livez</a>: 200 while the load progresses or vLLM is ready</li>
</ul></body></html>
"""


class _Requests(Collector):
    """The server's own request counts, as `loadwatch_http_requests_total`."""

    def __init__(self, http: HttpStats) -> None:
        self.http = http

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        c = CounterMetricFamily(
            "loadwatch_http_requests", "Requests served.", labels=["route", "code"]
        )
        with self.http.lock:
            items = sorted(self.http.requests.items())
        for (route, code), n in items:
            c.add_metric([route, str(code)], n)
        yield c
