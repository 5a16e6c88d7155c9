"""The HTTP server with real clients: urllib, raw sockets, TLS."""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from loadwatch.daemon.config import HttpConfig
from loadwatch.exporters.http.server import Handler, HttpServer, Response, ServerError
from tests.helpers import wait_for


def routes() -> dict[str, Handler]:
    def metrics(q: Mapping[str, str]) -> Response:
        return Response(200, b"loadwatch_up 1\n", "text/plain; version=0.0.4")

    def boom(q: Mapping[str, str]) -> Response:
        raise RuntimeError("view failed")

    def echo(q: Mapping[str, str]) -> Response:
        return Response(200, repr(sorted(q.items())).encode())

    return {"/metrics": metrics, "/boom": boom, "/echo": echo}


@pytest.fixture
def server() -> Iterator[HttpServer]:
    srv = HttpServer(HttpConfig(port=0, request_timeout_s=0.5, max_connections=8), routes())
    srv.start()
    yield srv
    srv.stop()


def get(
    url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_routes_and_errors(server: HttpServer) -> None:
    assert server.address[0] == "127.0.0.1"
    assert get(server.url + "/metrics") == (200, b"loadwatch_up 1\n")
    assert get(server.url + "/nope")[0] == 404
    code, body = get(server.url + "/boom")
    assert code == 500 and b"view failed" in body
    assert get(server.url + "/echo?a=1&b=x")[1] == b"[('a', '1'), ('b', 'x')]"
    conn = http.client.HTTPConnection(*server.address, timeout=5)
    conn.request("POST", "/metrics", body=b"x" * 100)
    assert conn.getresponse().status == 405
    assert server.stats.requests[("/metrics", 200)] == 1
    assert server.stats.requests[("other", 404)] == 1


def test_slow_clients_are_dropped_and_do_not_block_scrapes(server: HttpServer) -> None:
    slow = []
    for _ in range(5):
        s = socket.create_connection(server.address, timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes the request
        slow.append(s)
    start = time.monotonic()
    assert get(server.url + "/metrics")[0] == 200
    assert time.monotonic() - start < 0.5
    # after the request timeout the server closes the half-sent requests
    for s in slow:
        s.settimeout(3)
        assert s.recv(100) == b""
        s.close()


def test_connection_cap_closes_excess_connections(server: HttpServer) -> None:
    held = [socket.create_connection(server.address, timeout=5) for _ in range(12)]
    # Past the cap the connections that waited longest for their request give way.
    stats = server.stats
    wait_for(lambda: stats.rejected_connections + stats.evicted_connections >= 4, "4 given way", 5)
    for s in held[:4]:
        s.settimeout(2)
        assert s.recv(1) == b""  # closed by the server
    for s in held:
        s.close()
    # served again within the request timeout (0.5 s), when a held slot frees at the latest
    wait_for(lambda: get(server.url + "/metrics")[0] == 200, "served again", 1.0)


def test_oversized_request_line_is_refused(server: HttpServer) -> None:
    s = socket.create_connection(server.address, timeout=5)
    s.sendall(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n")
    assert b" 414 " in s.recv(200)
    s.close()


def test_port_in_use_is_one_line(server: HttpServer) -> None:
    other = HttpServer(HttpConfig(port=server.address[1]), routes())
    with pytest.raises(ServerError, match=r"cannot listen on 127\.0\.0\.1:\d+"):
        other.start()


def test_bearer_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    srv = HttpServer(HttpConfig(port=0, bearer_token_file=token), routes())
    srv.start()
    try:
        assert get(srv.url + "/metrics")[0] == 401
        assert get(srv.url + "/metrics", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(srv.url + "/metrics", {"Authorization": "Bearer s3cret"})[0] == 200
    finally:
        srv.stop()


def test_basic_auth(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("hunter2")
    srv = HttpServer(
        HttpConfig(port=0, basic_auth_user="prom", basic_auth_password_file=pw), routes()
    )
    srv.start()
    try:
        good = base64.b64encode(b"prom:hunter2").decode()
        bad = base64.b64encode(b"prom:nope").decode()
        assert get(srv.url + "/metrics", {"Authorization": f"Basic {bad}"})[0] == 401
        assert get(srv.url + "/metrics", {"Authorization": f"Basic {good}"})[0] == 200
    finally:
        srv.stop()


def test_missing_secret_is_one_line(tmp_path: Path) -> None:
    srv = HttpServer(HttpConfig(port=0, bearer_token_file=tmp_path / "none"), routes())
    with pytest.raises(ServerError, match="cannot read the bearer token"):
        srv.start()


def make_cert(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_with_a_real_client(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    srv = HttpServer(
        HttpConfig(port=0, tls_cert=cert, tls_key=key, request_timeout_s=0.5), routes()
    )
    srv.start()
    try:
        assert srv.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(cert))
        assert get(srv.url + "/metrics", context=ctx) == (200, b"loadwatch_up 1\n")
        # a client that connects and never starts the handshake does not block others
        idle = socket.create_connection(srv.address, timeout=5)
        assert get(srv.url + "/metrics", context=ctx)[0] == 200
        idle.close()
        # plain HTTP to a TLS port fails cleanly and the server keeps serving
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(srv.url.replace("https", "http") + "/metrics", timeout=3)
        assert get(srv.url + "/metrics", context=ctx)[0] == 200
    finally:
        srv.stop()


def test_bad_certificate_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a cert")
    srv = HttpServer(HttpConfig(port=0, tls_cert=junk, tls_key=junk), routes())
    with pytest.raises(ServerError, match="cannot load TLS certificate"):
        srv.start()


def _runs(thread_id: int) -> int:
    """How many times the kernel has run the thread (/proc's schedstat: its third field)."""
    return int(Path(f"/proc/self/task/{thread_id}/schedstat").read_text().split()[2])


def test_the_server_sleeps_between_connections_and_stops_at_once(server: HttpServer) -> None:
    """Between scrapes the accepting thread is not woken (socketserver's `serve_forever` looks
    for a stop every poll interval: for nothing, for the days a daemon runs); a stop still
    ends it at once."""
    assert get(server.url + "/metrics")[0] == 200
    thread = server._thread
    assert thread is not None and thread.native_id is not None
    before = _runs(thread.native_id)
    time.sleep(1.2)  # (real time: a poll every 0.5 s would have woken it twice)
    assert _runs(thread.native_id) == before
    assert get(server.url + "/metrics")[0] == 200  # asleep, not gone
    began = time.monotonic()
    server.stop()
    assert time.monotonic() - began < 0.5 and not thread.is_alive()
