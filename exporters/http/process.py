"""The HTTP server in a process of its own, serving boards the daemon's loop sends it.

Why a process: in one interpreter the HTTP threads wait for the interpreter lock while the loop
parses a busy log, and a scrape's latency becomes the parser's. Here the loop renders a `Board`
(exporters/http/board.py, made by views.BoardMaker) after publishing and hands it over; a sender
thread writes it down a socket pair to the server process (`python -m
loadwatch.exporters.http.process`, which imports only exporters/http/board.py, the HTTP server and
prometheus_client), which only writes bytes. The loop never waits for the socket: a board not
yet sent is replaced by the next one. With nothing new the loop sends a heartbeat (an empty
frame) instead of rendering the same board again. The server answers /healthz 503 when neither
came for `ALIVE_S` (the loop sends one at least every idle tick), and ends when the socket closes, so it
never outlives the daemon, even one that was killed. A server process that died is started
again on the same address (at most every `RESTART_S`), and `on_problem` hears of it in one line.

Counters are rendered when read (daemon/publish.py): the loop tells the server that its board is
behind (`stale`, a frame of one byte) instead of rendering one; a scrape of /metrics or /status
that finds the board behind and older than `[http] publish_interval_s` asks the daemon for a new
one (a byte up the same socket: `on_want` hears it on a thread of its own) and waits for it at
most `WANT_WAIT_S`, else serves the board it has. /readyz, /livez and /healthz never ask: what
they answer is published at once.

    server = HttpProcess(config, on_problem=print, on_want=daemon.want)
    url = server.start()          # ServerError: one line (port in use, bad certificate, ...)
    server.send(board)            # after each publish
    server.stale()                # something changed, not rendered yet
    server.alive()                # the loop runs, nothing changed
    server.stop()
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from loadwatch.exporters.http.board import (
    EMPTY,
    PROBES,
    Board,
    board_routes,
    decode,
    encode,
    frame,
    read_frame,
)
from loadwatch.exporters.http.server import Handler, HttpServer, ServerError
from loadwatch.exporters.http.settings import HttpConfig

ALIVE_S = 20.0  # no board for this long: the loop is stuck
START_TIMEOUT_S = 30.0
RESTART_S = 5.0  # a server process that died is started again after this
SEND_TIMEOUT_S = 10.0  # a server that takes this long to read a board is stuck
END_WAIT_S = 5.0  # for a server process to end once its socket closed, before it is killed
WANT_WAIT_S = 2.0  # a scrape waits this long for the board it asked for, then serves the last
ALIVE = frame(b"")  # a heartbeat: no board; the last one still holds (or nothing newer)
STALE = frame(b"s")  # the board is behind the daemon's state (a board is never one byte)
WANT = b"w"  # (server to daemon) a scrape asks for the state now


class HttpProcess:
    def __init__(
        self,
        config: HttpConfig,
        on_problem: Callable[[str], None] | None = None,
        *,
        on_want: Callable[[], None] | None = None,
        send_timeout_s: float = SEND_TIMEOUT_S,
        end_wait_s: float = END_WAIT_S,
    ) -> None:
        self.config = config
        self._send_timeout_s = send_timeout_s
        self._end_wait_s = end_wait_s
        self.url = ""
        self.probe_url: str | None = None  # the probe listener's, when [http] probe_listen is set
        self.restarts = 0
        self._on_problem = on_problem or (lambda line: None)
        self._on_want = on_want or (lambda: None)
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._cond = threading.Condition()
        self._pending: Board | None = None
        self._beat = False  # a heartbeat is due (a pending board says as much)
        self._stale = False  # the board is behind; sent after a pending board
        self._behind = False  # the last thing said was `stale` (a restarted server hears it)
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        self._sock, self._proc, self.url, self.probe_url = _spawn(
            self.config, self._send_timeout_s, self._end_wait_s
        )
        # a restart binds the addresses this one got (port 0 picks one)
        port = int(self.url.rsplit(":", 1)[1])
        self.config = dataclasses.replace(self.config, port=port)
        if self.probe_url is not None:
            probe_port = int(self.probe_url.rsplit(":", 1)[1])
            self.config = dataclasses.replace(self.config, probe_port=probe_port)
        self._thread = threading.Thread(target=self._send_loop, name="loadwatch-http-send")
        self._thread.daemon = True
        self._thread.start()
        self._listen()
        return self.url

    def send(self, board: Board) -> None:
        """Hand over the newest board; never blocks on the server."""
        with self._cond:
            self._pending = board
            self._stale = self._behind = False  # (the board is newer than what was behind)
            self._cond.notify()

    def stale(self) -> None:
        """Tell the server its board is behind; never blocks on the server."""
        with self._cond:
            self._stale = self._behind = True
            self._cond.notify()

    def alive(self) -> None:
        """Tell the server the loop runs, without a new board; never blocks on the server."""
        with self._cond:
            self._beat = True
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self._close()

    @property
    def pid(self) -> int | None:
        """The server process's, while there is one."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def _send_loop(self) -> None:
        down_since: float | None = None  # the server process is gone: restart after RESTART_S
        last: Board | None = None  # sent last: what a restarted server starts with
        while True:
            with self._cond:
                while not self._stopping:
                    if down_since is not None:
                        left = down_since + RESTART_S - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    elif self._pending is not None or self._beat or self._stale:
                        break
                    else:
                        self._cond.wait()
                if self._stopping:
                    return
                board, self._pending = self._pending, None
                beat, self._beat = self._beat, False
                stale, self._stale = self._stale, False
            if down_since is not None:
                if not self._restart():
                    down_since = time.monotonic()
                    self._keep(board)
                    continue
                down_since = None
                board = board or last
            if board is None and not beat and not stale:
                continue
            try:
                assert self._sock is not None
                out = encode(board) if board is not None else ALIVE if beat else b""
                self._sock.sendall(out + STALE if stale else out)
                last = board or last
            except (OSError, AssertionError):
                code = self._proc.poll() if self._proc is not None else None
                self._on_problem(
                    f"the HTTP server process ended (exit {code}); starting it again"
                    if code is not None
                    else "the HTTP server process stopped reading; starting another"
                )
                self._close()
                self._keep(board)
                down_since = time.monotonic() - RESTART_S  # at once

    def _keep(self, board: Board | None) -> None:
        """Put back a board that was not sent, unless a newer one came meanwhile."""
        with self._cond:
            if self._pending is None:
                self._pending = board

    def _restart(self) -> bool:
        try:
            self._sock, self._proc, self.url, self.probe_url = _spawn(
                self.config, self._send_timeout_s, self._end_wait_s
            )
        except ServerError as exc:
            self._on_problem(f"the HTTP server cannot start again: {exc}")
            return False
        self.restarts += 1
        self._listen()
        with self._cond:
            self._stale = self._behind  # (after the last board, which it is sent first)
        return True

    def _listen(self) -> None:
        """A thread that hears the server's requests for a board, for the life of its socket."""
        sock = self._sock
        if sock is None:
            return

        def listen() -> None:
            while True:
                try:
                    got = sock.recv(64)
                except TimeoutError:
                    continue  # (the socket's timeout is the sender's)
                except OSError:
                    return
                if not got:
                    return
                self._on_want()

        threading.Thread(target=listen, name="loadwatch-http-wants", daemon=True).start()

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            # the server sees the socket close and stops (shut down first: a close alone waits
            # for the thread that listens on it to leave its recv)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        proc, self._proc = self._proc, None
        if proc is not None:
            _end(proc, self._end_wait_s)


def _spawn(
    config: HttpConfig, send_timeout_s: float, end_wait_s: float
) -> tuple[socket.socket, subprocess.Popen[bytes], str, str | None]:
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadwatch.exporters.http.process", str(theirs.fileno())],
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
        ours.sendall(_config_frame(config))
        reply = read_frame(ours)
    except (OSError, ValueError):
        reply = None
    kind, _, value = (reply or b"").decode(errors="replace").partition(" ")
    if kind != "ok":
        _end(proc, end_wait_s)
        ours.close()
        raise ServerError(value if kind == "error" else "the HTTP server process did not start")
    # A server that takes this long to read a board is stuck: it is killed and started again.
    ours.settimeout(send_timeout_s)
    url, _, probe_url = value.partition(" ")
    return ours, proc, url, probe_url or None


def _end(proc: subprocess.Popen[bytes], wait_s: float) -> None:
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _config_frame(config: HttpConfig) -> bytes:
    fields = {
        f.name: str(v) if isinstance(v, Path) else v
        for f in dataclasses.fields(config)
        for v in [getattr(config, f.name)]
    }
    return frame(json.dumps(fields).encode())


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
    boards = Boards(sock, config.publish_interval_s)
    server = HttpServer(config, {})
    server.routes.update(board_routes(boards.last, boards.alive, server.stats, boards.fresh))
    probes = _probe_server(config, server.routes)
    try:
        server.start()
        if probes is not None:
            probes.start()
    except ServerError as exc:
        server.stop()
        sock.sendall(frame(f"error {exc}".encode()))
        return
    urls = server.url if probes is None else f"{server.url} {probes.url}"
    try:
        sock.sendall(frame(f"ok {urls}".encode()))
        while (body := read_frame(sock)) is not None:
            boards.take(body)
    except (OSError, ValueError):
        pass  # a broken stream: the daemon is gone or confused; stop serving stale boards
    finally:
        server.stop()
        if probes is not None:
            probes.stop()


class Boards:
    """The server process's board: the last the daemon sent, and a fresh one when asked for."""

    def __init__(self, sock: socket.socket, fresh_s: float) -> None:
        self._sock = sock
        self._fresh_s = fresh_s
        self._cond = threading.Condition()
        self._board = EMPTY
        self._at = time.monotonic()  # of the last frame: the loop runs
        self._board_at = float("-inf")  # of the last board
        self._stale = True  # the daemon's state moved on since the board
        self._frames = 0  # frames read: a waiting scrape sees one come
        self._asked = False  # a request is out, not answered yet

    def take(self, body: bytes) -> None:
        """A frame's body from the daemon: a board, a heartbeat (empty) or `stale`."""
        with self._cond:
            now = time.monotonic()
            if body == STALE[4:]:
                self._stale = True
            elif body:
                self._board, self._board_at, self._stale = decode(body), now, False
            self._at = now
            self._frames += 1
            self._asked = False
            self._cond.notify_all()

    def last(self) -> Board:
        return self._board

    def alive(self) -> bool:
        return time.monotonic() - self._at < ALIVE_S

    def fresh(self) -> Board:
        """The board, asked for anew when the state moved on and it is older than `fresh_s`."""
        with self._cond:
            if not self._stale or time.monotonic() - self._board_at < self._fresh_s:
                return self._board
            frames = self._frames
            if not self._asked:
                self._asked = True
                try:
                    self._sock.sendall(WANT)
                except OSError:
                    return self._board
            self._cond.wait_for(lambda: self._frames != frames, WANT_WAIT_S)
            return self._board


def _probe_server(config: HttpConfig, routes: Mapping[str, Handler]) -> HttpServer | None:
    """The probe listener: the probe routes only, plain HTTP, no credentials (a kubelet's
    httpGet carries none). What they tell (ready, live, why not) is no secret."""
    if config.probe_host is None:
        return None
    plain = HttpConfig(
        host=config.probe_host,
        port=config.probe_port or 0,
        max_connections=config.max_connections,
        request_timeout_s=config.request_timeout_s,
    )
    return HttpServer(plain, {path: routes[path] for path in PROBES})


if __name__ == "__main__":
    fd = int(sys.argv[1])
    try:
        serve(socket.socket(fileno=fd))
    except OSError:
        pass  # the daemon went away during the start (killed): there is nobody left to tell
    os._exit(0)
