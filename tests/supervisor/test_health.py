from __future__ import annotations

import asyncio
import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from loadwatch.daemon.sources.health import (
    HealthProber,
    health_url,
    health_url_from_argv,
    probe_health,
)


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    delay_s = 0.0

    def do_GET(self) -> None:
        time.sleep(self.delay_s)
        code = self.status if self.path == "/health" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    _Handler.status = 200
    _Handler.delay_s = 0.0


def _url(srv: http.server.ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/health"


def test_200_is_ready(server: http.server.ThreadingHTTPServer) -> None:
    r = probe_health(_url(server), clock=lambda: 123.0)
    assert r.ok and r.status == 200 and r.error is None and r.checked_at == 123.0


def test_503_is_not_ready(server: http.server.ThreadingHTTPServer) -> None:
    _Handler.status = 503
    r = probe_health(_url(server))
    assert not r.ok and r.status == 503 and r.error == "HTTP 503"


def test_refused_while_loading() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = probe_health(f"http://127.0.0.1:{port}/health", timeout_s=1.0)
    assert not r.ok and r.status is None and r.error is not None and "refused" in r.error.lower()


def test_slow_answer_times_out(server: http.server.ThreadingHTTPServer) -> None:
    _Handler.delay_s = 1.0
    r = probe_health(_url(server), timeout_s=0.2)
    assert not r.ok and r.error == "timed out"
    assert r.elapsed_s is not None and r.elapsed_s < 0.9


def test_prober_runs_off_the_loop(server: http.server.ThreadingHTTPServer) -> None:
    _Handler.delay_s = 0.3
    prober = HealthProber(_url(server), timeout_s=2.0)

    async def scenario() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        result = await prober.probe()
        t.cancel()
        assert result.ok
        return ticks

    assert asyncio.run(scenario()) >= 10  # the loop kept running during the 0.3 s probe
    assert prober.ready and prober.probes_total == 1 and prober.failures_total == 0


def test_urls() -> None:
    assert health_url("http://0.0.0.0:8000") == "http://127.0.0.1:8000/health"
    assert health_url("http://[::]:9000/") == "http://[::1]:9000/health"
    assert health_url("https://host.example:443") == "https://host.example:443/health"
    assert (
        health_url_from_argv(["vllm", "serve", "m", "--port", "8123"])
        == "http://127.0.0.1:8123/health"
    )
    assert (
        health_url_from_argv(["vllm", "serve", "m", "--host=::", "--port=1"])
        == "http://[::1]:1/health"
    )
