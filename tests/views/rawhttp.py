"""A loopback HTTP server that answers with whatever bytes a test writes, as slowly as it likes:
for a status client facing a server that dribbles, floods, nests or lies. Each answer runs in
its own thread and ends by itself (a bounded time, or when the server stops)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Answer = Callable[[socket.socket, threading.Event], None]


class RawServer:
    """Accepts on 127.0.0.1, reads each request's head, hands the socket to `answer`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._one, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                self.requests += 1
                self.answer(conn, self.stop)
            except OSError:
                pass  # the client hung up: what these tests expect of it

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)


@contextmanager
def raw_server(answer: Answer) -> Iterator[RawServer]:
    srv = RawServer(answer)
    try:
        yield srv
    finally:
        srv.close()


def answer_bytes(data: bytes) -> Answer:
    """The whole answer at once, then the connection closed."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)

    return answer


def json_answer(body: bytes, status: str = "200 OK") -> Answer:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")
    return answer_bytes(head + body)


def dribble(head: bytes, byte: bytes = b" ", every_s: float = 0.05, for_s: float = 5.0) -> Answer:
    """`head` at once, then one byte every `every_s` for at most `for_s` seconds: never idle
    long enough for a per-read timeout, never done."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for _ in range(int(for_s / every_s)):
            if stop.wait(every_s):
                return
            conn.sendall(byte)

    return answer


def hold(head: bytes, for_s: float = 5.0) -> Answer:
    """`head`, then nothing: the connection stays open until the test ends or `for_s`."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        stop.wait(for_s)

    return answer
