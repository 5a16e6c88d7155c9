"""The HTTP server in a process of its own, serving boards the daemon's loop sends it.

Why a process: in one interpreter the HTTP threads wait for the interpreter lock while the loop
parses a busy log, and a scrape's latency becomes the parser's. Here the loop renders a `Board`
(exporters/views.py) after publishing and sends it down a socket pair; the server process
(`python -m loadwatch.exporters.httpd`, which imports only exporters/board.py, the HTTP server
and prometheus_client) only writes bytes. It answers /healthz 503 when no board came for
`ALIVE_S` (the loop sends one at least every idle tick), and ends when the socket closes, so it
never outlives the daemon, even one that was killed.

    server = HttpProcess(config)
    url = server.start()          # ServerError: one line (port in use, bad certificate, ...)
    server.send(board)            # after each publish
    server.stop()
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import HttpConfig
from loadwatch.exporters.board import EMPTY, Board, board_routes, decode, encode, read_frame
from loadwatch.exporters.http import HttpServer, ServerError

ALIVE_S = 20.0  # no board for this long: the loop is stuck
START_TIMEOUT_S = 30.0


class HttpProcess:
    def __init__(self, config: HttpConfig) -> None:
        self.config = config
        self.url = ""
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> str:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "loadwatch.exporters.httpd", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                # its own process group: a Ctrl-C at a terminal is the daemon's to handle
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise ServerError(f"cannot start the HTTP server process: {exc}") from None
        finally:
            theirs.close()
        ours.settimeout(START_TIMEOUT_S)
        try:
            ours.sendall(_config_frame(self.config))
            reply = read_frame(ours)
        except (OSError, ValueError):
            reply = None
        if reply is None:
            _end(proc)
            ours.close()
            raise ServerError("the HTTP server process did not start")
        kind, _, value = reply.decode().partition(" ")
        if kind != "ok":
            _end(proc)
            ours.close()
            raise ServerError(value)
        ours.settimeout(None)
        self._sock, self._proc, self.url = ours, proc, value
        return self.url

    def send(self, board: Board) -> None:
        frame = encode(board)
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(frame)
            except OSError:
                self._sock.close()
                self._sock = None  # the server is gone; the daemon goes on without it

    def stop(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()  # the server sees the socket close and stops
        if self._proc is not None:
            _end(self._proc)
            self._proc = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None


def _end(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _config_frame(config: HttpConfig) -> bytes:
    fields = {
        f.name: str(v) if isinstance(v, Path) else v
        for f in dataclasses.fields(config)
        for v in [getattr(config, f.name)]
    }
    body = json.dumps(fields).encode()
    return len(body).to_bytes(4, "big") + body


def _config_from(body: bytes) -> HttpConfig:
    raw: dict[str, Any] = json.loads(body)
    paths = {"tls_cert", "tls_key", "bearer_token_file", "basic_auth_password_file"}
    values: dict[str, Any] = {
        k: Path(v) if k in paths and v is not None else v for k, v in raw.items()
    }
    return HttpConfig(**values)


def serve(sock: socket.socket) -> None:
    """The server process: serve the latest board until the socket closes."""
    # SIGTERM/SIGINT are for the daemon, which then closes the socket: stopping here first
    # would refuse the last scrapes of a shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    first = read_frame(sock)
    if first is None:
        return
    config = _config_from(first)
    state: dict[str, Any] = {"board": EMPTY, "at": time.monotonic()}
    server = HttpServer(config, {})
    server.routes.update(
        board_routes(
            lambda: state["board"],
            lambda: time.monotonic() - state["at"] < ALIVE_S,
            server.stats,
        )
    )
    try:
        server.start()
    except ServerError as exc:
        sock.sendall(_frame(f"error {exc}"))
        return
    sock.sendall(_frame(f"ok {server.url}"))
    try:
        while (body := read_frame(sock)) is not None:
            state["board"], state["at"] = decode(body), time.monotonic()
    except (OSError, ValueError):
        pass  # a broken stream: the daemon is gone or confused; stop serving stale boards
    finally:
        server.stop()


def _frame(text: str) -> bytes:
    body = text.encode()
    return len(body).to_bytes(4, "big") + body


if __name__ == "__main__":
    fd = int(sys.argv[1])
    serve(socket.socket(fileno=fd))
    os._exit(0)
