from __future__ import annotations

import asyncio
import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from loadwatch.daemon.sources.health import (
    Endpoint,
    HealthProber,
    UrlRefused,
    endpoint_from_argv,
    endpoint_from_config,
    endpoint_from_log,
    probe_health,
)


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    answer: threading.Event | None = None  # set: answer now (None: at once)
    location = ""

    def do_GET(self) -> None:
        if self.answer is not None:
            self.answer.wait(10)
        code = self.status if self.path == "/health" else 404
        self.send_response(code)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.ThreadingHTTPServer]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)  # (a quick shutdown)
    t.start()
    yield srv
    if _Handler.answer is not None:
        _Handler.answer.set()  # (a handler still waiting ends)
    srv.shutdown()
    srv.server_close()
    _Handler.status = 200
    _Handler.answer = None
    _Handler.location = ""


def _url(srv: http.server.ThreadingHTTPServer) -> Endpoint:
    return Endpoint("http", "127.0.0.1", srv.server_address[1])


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
    r = probe_health(Endpoint("http", "127.0.0.1", port), timeout_s=1.0)
    assert not r.ok and r.status is None and r.error is not None and "refused" in r.error.lower()


def test_slow_answer_times_out(server: http.server.ThreadingHTTPServer) -> None:
    _Handler.answer = threading.Event()  # not before the probe gave up
    r = probe_health(_url(server), timeout_s=0.2)
    assert not r.ok and r.error == "timed out"
    assert r.elapsed_s is not None and r.elapsed_s < 0.9


def test_prober_runs_off_the_loop(server: http.server.ThreadingHTTPServer) -> None:
    """The server answers only once the loop has run a callback while the probe waits: a probe
    that held the loop would time out."""
    answer = _Handler.answer = threading.Event()
    prober = HealthProber(_url(server), timeout_s=2.0)

    async def scenario() -> None:
        asyncio.get_running_loop().call_later(0.05, answer.set)
        result = await prober.probe()
        assert result.ok, result.error

    asyncio.run(scenario())
    assert prober.ready and prober.probes_total == 1 and prober.failures_total == 0


def test_endpoints_from_the_operator() -> None:
    assert endpoint_from_argv(["vllm", "serve", "m", "--port", "8123"]).health_url == (
        "http://127.0.0.1:8123/health"
    )
    assert endpoint_from_argv(["vllm", "serve", "m", "--host=::", "--port=1"]).health_url == (
        "http://[::1]:1/health"
    )
    gateway = endpoint_from_config("https://gw.example/vllm/health")
    assert (gateway.scheme, gateway.host, gateway.port) == ("https", "gw.example", 443)
    assert gateway.api_prefix == "/vllm"
    for bad in ("ftp://127.0.0.1:21/health", "file:///etc/passwd", "http://h:99999/health"):
        with pytest.raises(UrlRefused):
            endpoint_from_config(bad)


@pytest.mark.parametrize(
    ("logged", "expected"),
    [
        ("http://0.0.0.0:8000", "http://127.0.0.1:8000/health"),  # a wildcard bind: loopback
        ("http://[::]:9000/", "http://[::1]:9000/health"),
        ("http://127.0.0.1:8321", "http://127.0.0.1:8321/health"),
        ("http://127.3.4.5:8321/any/path?x=1", "http://127.3.4.5:8321/health"),
        ("http://localhost:8000", "http://localhost:8000/health"),
        ("http://[::1]:8000", "http://[::1]:8000/health"),
        ("http://127.0.0.1", "http://127.0.0.1:8000/health"),  # (vLLM's port when none)
    ],
)
def test_a_logged_loopback_url_is_probed(logged: str, expected: str) -> None:
    assert endpoint_from_log(logged).health_url == expected


@pytest.mark.parametrize(
    ("logged", "why"),
    [
        ("http://127.0.0.1:18999-0-90eced95.", "valid port"),
        ("http://127.0.0.1:70000", "valid port"),
        ("http://[::1:8000", "valid port"),
        ("ftp://127.0.0.1:21", "only an http URL"),
        ("https://127.0.0.1:8000", "only an http URL"),
        ("file:///etc/passwd", "names no host"),
        ("gopher://127.0.0.1:70", "only an http URL"),
        ("http://10.1.2.3:8000", "not loopback"),
        ("http://vllm.example:8000", "not loopback"),
        ("http://2130706433:8000", "not loopback"),  # 127.0.0.1 as a number: a name here
        ("http://user:pw@127.0.0.1:8000", "credentials"),
        ("http://127.0.0.1:0", "port 0"),
    ],
)
def test_a_logged_url_off_bounds_is_refused(logged: str, why: str) -> None:
    with pytest.raises(UrlRefused) as info:
        endpoint_from_log(logged)
    assert why in str(info.value) and "\n" not in str(info.value)


def test_allowed_hosts_widen_the_logged_url() -> None:
    assert endpoint_from_log("http://10.1.2.3:8000", ["10.1.2.3"]).host == "10.1.2.3"
    assert endpoint_from_log("http://VLLM.example:1", ["vllm.example"]).port == 1
    assert endpoint_from_log("http://[fd00::2]:1", ["fd00:0::2"]).host == "fd00::2"
    with pytest.raises(UrlRefused):
        endpoint_from_log("ftp://10.1.2.3:8000", ["10.1.2.3"])  # (http still)
    with pytest.raises(UrlRefused):
        endpoint_from_log("http://10.1.2.4:8000", ["10.1.2.3"])


def test_a_long_refused_url_is_shown_cut() -> None:
    with pytest.raises(UrlRefused) as info:
        endpoint_from_log("http://evil.example/" + "x" * 5000)
    assert len(str(info.value)) < 300


def test_a_redirect_is_not_followed(server: http.server.ThreadingHTTPServer) -> None:
    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=target.serve_forever, args=(0.02,), daemon=True).start()
    asked: list[object] = []
    target.process_request = lambda req, addr: asked.append(addr)  # type: ignore[method-assign]
    _Handler.status = 302
    _Handler.location = f"http://127.0.0.1:{target.server_address[1]}/health"
    try:
        r = probe_health(_url(server))
    finally:
        target.shutdown()
        target.server_close()
    assert not r.ok and r.status == 302 and r.error == "HTTP 302: a redirect, not followed"
    assert asked == []


def test_proxies_from_the_environment_never_apply(
    server: http.server.ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Already so before the probes' bounds; kept.)"""
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        proxy.setblocking(False)
        for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.getsockname()[1]}")
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        assert probe_health(_url(server)).ok
        with pytest.raises(BlockingIOError):
            proxy.accept()
