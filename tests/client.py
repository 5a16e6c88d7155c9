"""Talking to a running daemon's HTTP endpoints, for the tests that start one."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def parse_metrics(body: bytes) -> dict[str, float]:
    """`name{labels}` -> value, from a text exposition."""
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


class DaemonClient:
    """GET /status, /metrics and the rest from `self.url` (set once the daemon listens)."""

    url: str

    def get(
        self,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        context: Any = None,
        timeout_s: float = 5.0,
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=context) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        doc: dict[str, Any] = json.loads(body)
        return doc

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value, from a real scrape."""
        code, body = self.get("/metrics")
        assert code == 200, body
        return parse_metrics(body)
