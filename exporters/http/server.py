"""The HTTP side: a small threaded server for /metrics, /status, /healthz, /readyz.

Handlers only read immutable snapshots, so they run on the server's own threads and never touch
the event loop. Defences, all configurable: loopback bind by default, a cap on concurrent
connections (past it, the connection that has waited longest for its request gives way, so no
number of slow clients keeps a scraper out; nor does a client that does not read its answers:
a connection gives way while its answer is written, too; with every slot computing an answer,
a new one is closed at once, never queued), a deadline for
each request to arrive whole (a client that never finishes its request is dropped, even one that
sends a byte now and then), GET/HEAD only, no request bodies, optional TLS and bearer/basic
authentication.
"""

from __future__ import annotations

import base64
import hmac
import io
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from loadwatch.exporters.http.settings import HttpConfig


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Mapping[str, str]], Response]  # query parameters -> response


ACCEPT_WAIT_S = 1.0  # at most, for a connection the selector saw that went before its accept
SEND_BUFFER_BYTES = (
    16 * 1024
)  # the kernel doubles it: a reader that takes its answer never waits long


class ServerError(Exception):
    """The server cannot start (port in use, bad certificate, unreadable secret): one line."""


@dataclass
class HttpStats:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    rejected_connections: int = 0
    evicted_connections: int = 0  # still waiting for their request when the cap was reached
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, path: str, status: int) -> None:
        with self.lock:
            key = (path, status)
            self.requests[key] = self.requests.get(key, 0) + 1


class _Slots:
    """The connection cap, where a connection still waiting for its request gives way.

    At the cap, a new connection takes the slot of the one that has waited longest for its
    request to arrive (a slow client, or an idle keep-alive): a scraper's request arrives at
    once, so slow clients, however many, cannot keep it out (on loopback they even come from its
    address). Only when every slot is busy answering is a new connection refused. The evicted
    connection is shut down and its thread ends by itself, freeing the slot it still counts.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._active = 0
        self._waiting: dict[socket.socket, float] = {}  # connection -> waiting since

    def admit(self) -> tuple[bool, bool]:
        """(admitted, by evicting a waiting connection)."""
        with self._lock:
            self._active += 1
            if self._active <= self.cap:
                return True, False
            if not self._waiting:
                self._active -= 1
                return False, False
            victim = min(self._waiting, key=self._waiting.__getitem__)
            del self._waiting[victim]
        try:
            # the plain socket's shutdown, also under TLS: the victim's own thread owns its
            # TLS state, and its read returns at once
            socket.socket.shutdown(victim, socket.SHUT_RDWR)
        except OSError:
            pass
        return True, True

    def release(self, conn: socket.socket | None) -> None:
        with self._lock:
            self._active -= 1
            if conn is not None:
                self._waiting.pop(conn, None)

    def waiting(self, conn: socket.socket, yes: bool) -> None:
        with self._lock:
            if yes:
                self._waiting[conn] = time.monotonic()
            else:
                self._waiting.pop(conn, None)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, owner: HttpServer, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        self.owner = owner
        self.slots = _Slots(owner.config.max_connections)
        self._wake, self._waker = socket.socketpair()  # (closed by a failed bind's server_close)
        super().__init__(address, _RequestHandler)
        self.timeout = ACCEPT_WAIT_S  # (`handle_request`'s: a connection gone before its accept)

    def serve_until_stopped(self) -> None:
        """Accept connections until `stop_serving`, asleep in between. (socketserver's
        `serve_forever` wakes every poll interval to look for its stop: for nothing, for the
        days the daemon runs.)"""
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake, selectors.EVENT_READ)
            while True:
                ready = selector.select()
                if any(key.fileobj is self._wake for key, _ in ready):
                    return
                self.handle_request()

    def stop_serving(self) -> None:
        self._waker.send(b"\0")

    def server_close(self) -> None:
        super().server_close()
        self._wake.close()
        self._waker.close()

    def process_request(self, request: Any, client_address: Any) -> None:
        # Past the connection cap a connection still waiting for its request gives way, or the
        # new one is closed straight away: slow clients never make well-behaved ones wait.
        admitted, evicted = self.slots.admit()
        if evicted:
            self.owner.stats.evicted_connections += 1
        if not admitted:
            self.owner.stats.rejected_connections += 1
            self.shutdown_request(request)
            return
        self.slots.waiting(request, True)
        try:
            # A small send buffer: a client that does not read its answers blocks the write
            # (and gives way, `_send`) after an answer or two, not after the kernel has taken
            # megabytes of them, each one computed for nobody.
            request.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            super().process_request(request, client_address)
        except Exception:
            self.slots.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that vanished mid-request is not worth a traceback on stderr.
        self.owner.stats.errors += 1


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each allowed only the time left until the request's deadline: a
    per-read timeout alone lets a client that sends a byte now and then hold a thread forever."""

    def __init__(self, sock: socket.socket, handler: _RequestHandler) -> None:
        self._sock = sock
        self._handler = handler

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive within the request timeout")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _RequestHandler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "loadwatch"
    sys_version = ""
    deadline = 0.0

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.owner.config.request_timeout_s)
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self))

    def handle_one_request(self) -> None:
        self.deadline = time.monotonic() + self.server.owner.config.request_timeout_s
        super().handle_one_request()
        self.server.slots.waiting(self.connection, True)  # kept alive: idle until the next

    def parse_request(self) -> bool:
        ok = super().parse_request()  # reads the headers
        # The request is in, line and headers: from now on this connection does not give way.
        self.server.slots.waiting(self.connection, False)
        return ok

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are counted, not logged line by line

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _refuse(self) -> None:
        self._send(
            "",
            Response(
                HTTPStatus.METHOD_NOT_ALLOWED,
                b"only GET and HEAD\n",
                headers=(("Allow", "GET, HEAD"),),
            ),
            head=False,
        )
        self.close_connection = True

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

    def _serve(self, head: bool) -> None:
        owner = self.server.owner
        path, _, query = self.path.partition("?")
        handler = owner.routes.get(path)
        label = path if handler is not None else "other"
        if self.headers.get("Content-Length", "0") not in ("", "0") or self.headers.get(
            "Transfer-Encoding"
        ):
            self.close_connection = True  # we never read a body; do not let one be pipelined
        if not owner.authorized(self.headers.get("Authorization")):
            challenge = owner.challenge()
            self._send(
                label,
                Response(
                    HTTPStatus.UNAUTHORIZED,
                    b"unauthorized\n",
                    headers=(("WWW-Authenticate", challenge),),
                ),
                head,
            )
            return
        if handler is None:
            self._send(label, Response(HTTPStatus.NOT_FOUND, b"not found\n"), head)
            return
        try:
            response = handler(_parse_query(query))
        except Exception as exc:  # a bug in a view must not take the server down
            owner.stats.errors += 1
            response = Response(HTTPStatus.INTERNAL_SERVER_ERROR, f"error: {exc}\n".encode())
        self._send(label, response, head)

    def _send(self, label: str, response: Response, head: bool) -> None:
        server = self.server
        server.owner.stats.count(label, response.status)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in response.headers:
            self.send_header(name, value)
        # While the answer is written the connection gives way, as one still waiting for its
        # request does: a reader that takes its answer is done in an instant, a client that
        # pipelines requests and never reads blocks here once the socket buffers are full, and
        # must not hold a slot a scraper needs. A write gets the request timeout, whole.
        self.connection.settimeout(server.owner.config.request_timeout_s)
        server.slots.waiting(self.connection, True)
        try:
            self.end_headers()
            if not head:
                self.wfile.write(response.body)
        finally:
            server.slots.waiting(self.connection, False)


def _parse_query(query: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in query.split("&")[:32]:
        if part:
            key, _, value = part.partition("=")
            out[key[:64]] = value[:256]
    return out


class HttpServer:
    """Serve `routes` on the configured address until `stop()`."""

    def __init__(self, config: HttpConfig, routes: Mapping[str, Handler]) -> None:
        self.config = config
        self.routes = dict(routes)
        self.stats = HttpStats()
        self._token: bytes | None = None
        self._basic: bytes | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "https" if self.config.tls_cert else "http"
        shown = f"[{host}]" if ":" in host else host
        return f"{scheme}://{shown}:{port}"

    def start(self) -> None:
        cfg = self.config
        self._load_secrets()
        family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        try:
            server = _Server(self, (cfg.host, cfg.port), family)
        except OSError as exc:
            raise ServerError(
                f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}"
            ) from None
        if cfg.tls_cert is not None and cfg.tls_key is not None:
            try:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
            except (OSError, ssl.SSLError) as exc:
                server.server_close()
                raise ServerError(f"cannot load TLS certificate {cfg.tls_cert}: {exc}") from None
            # The handshake happens on the connection's own thread, never in the accept loop.
            server.socket = context.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_until_stopped, name="loadwatch-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.stop_serving()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._server.server_close()
        self._server = None

    # -- authentication ---------------------------------------------------------------------

    def _load_secrets(self) -> None:
        cfg = self.config
        if cfg.bearer_token_file is not None:
            self._token = _read_secret(cfg.bearer_token_file, "bearer token")
        if cfg.basic_auth_user is not None and cfg.basic_auth_password_file is not None:
            password = _read_secret(cfg.basic_auth_password_file, "basic auth password")
            self._basic = base64.b64encode(cfg.basic_auth_user.encode() + b":" + password)

    def authorized(self, header: str | None) -> bool:
        if self._token is None and self._basic is None:
            return True
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        given = value.strip().encode()
        if self._token is not None and scheme.lower() == "bearer":
            return hmac.compare_digest(given, self._token)
        if self._basic is not None and scheme.lower() == "basic":
            return hmac.compare_digest(given, self._basic)
        return False

    def challenge(self) -> str:
        return 'Bearer realm="loadwatch"' if self._token is not None else 'Basic realm="loadwatch"'


def _read_secret(path: Path, what: str) -> bytes:
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ServerError(f"cannot read the {what} from {path}: {exc.strerror or exc}") from None
    if not secret:
        raise ServerError(f"the {what} file {path} is empty")
    return secret
