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
PRIME_WHILE_SCRAPED_S = 60.0  # render ahead only while scrapes keep coming


@dataclass
class _Rendered:
    """The exposition of the last published bundle. The loop renders it right after publishing
    while someone scrapes (so a scrape only writes bytes and never waits on the parser for the
    interpreter lock); otherwise the first scrape renders it, once per bundle for all scrapers."""

    pub: Published | None = None
    body: bytes = b""
    scraped_at: float = float("-inf")
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, pub: Published | None, render: Callable[[], bytes]) -> bytes:
        with self.lock:
            self.scraped_at = time.monotonic()
            if pub is not self.pub or not self.body:
                self.pub, self.body = pub, render()
            return self.body

    def prime(self, pub: Published, render: Callable[[], bytes]) -> None:
        if time.monotonic() - self.scraped_at > PRIME_WHILE_SCRAPED_S:
            return  # nobody is scraping: do not spend the render
        body = render()
        with self.lock:
            self.pub, self.body = pub, body


def routes(
    published: Callable[[], Published | None],
    alive: Callable[[], bool],
    clock: Callable[[], float],
    stats: HttpStats | None = None,
    redactor: Redactor | None = None,
    primers: list[Callable[[Published], None]] | None = None,
) -> dict[str, Handler]:
    """The handlers. `primers` gets a function for the publisher to call with each new bundle."""
    registry = registry_for(LoadwatchCollector(published, clock, stats))
    red = redactor or Redactor()
    cache = _Rendered()

    if primers is not None:
        primers.append(lambda pub: cache.prime(pub, lambda: render(registry)))

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
