"""The HTTP routes: /metrics, /status, /healthz, /readyz, each a view of the published bundle."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from loadwatch.daemon.published import Published
from loadwatch.daemon.redact import Redactor
from loadwatch.exporters.http import Handler, HttpStats, Response
from loadwatch.exporters.prometheus import CONTENT_TYPE, LoadwatchCollector, registry_for, render

JSON = "application/json"
METRICS_REUSE_S = 0.1


@dataclass
class _Rendered:
    """The last exposition. A burst (or a flood) of scrapers renders once per published bundle
    and `METRICS_REUSE_S`, one at a time, instead of once each: rendering is most of a scrape's
    cost, and under load the scrapers then wait less for one another."""

    pub: Published | None = None
    at: float = float("-inf")
    body: bytes = b""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, pub: Published | None, render: Callable[[], bytes]) -> bytes:
        with self.lock:
            now = time.monotonic()
            if pub is not self.pub or now - self.at > METRICS_REUSE_S:
                self.pub, self.at, self.body = pub, now, render()
            return self.body


def routes(
    published: Callable[[], Published | None],
    alive: Callable[[], bool],
    clock: Callable[[], float],
    stats: HttpStats | None = None,
    redactor: Redactor | None = None,
) -> dict[str, Handler]:
    registry = registry_for(LoadwatchCollector(published, clock, stats))
    red = redactor or Redactor()
    cache = _Rendered()

    def metrics(q: Mapping[str, str]) -> Response:
        return Response(
            HTTPStatus.OK, cache.get(published(), lambda: render(registry)), CONTENT_TYPE
        )

    def status(q: Mapping[str, str]) -> Response:
        pub = published()
        if pub is None:
            return Response(HTTPStatus.SERVICE_UNAVAILABLE, b'{"error": "starting"}\n', JSON)
        doc = red.value(pub.snapshot(clock()).to_dict())
        body = json.dumps(doc, indent=1 if q.get("pretty") else None, sort_keys=False)
        return Response(HTTPStatus.OK, body.encode() + b"\n", JSON)

    def healthz(q: Mapping[str, str]) -> Response:
        if alive():
            return Response(HTTPStatus.OK, b"ok\n")
        return Response(HTTPStatus.SERVICE_UNAVAILABLE, b"the daemon loop is not ticking\n")

    def readyz(q: Mapping[str, str]) -> Response:
        pub = published()
        if pub is None:
            return Response(HTTPStatus.SERVICE_UNAVAILABLE, b"not ready: starting\n")
        snap = pub.snapshot(clock())
        if snap.ready:
            return Response(HTTPStatus.OK, b"ready\n")
        phase = snap.phase or "no vLLM session yet"
        return Response(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {phase}\n".encode())

    return {"/metrics": metrics, "/status": status, "/healthz": healthz, "/readyz": readyz}
