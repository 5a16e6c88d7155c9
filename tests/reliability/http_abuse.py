"""Abuse for the HTTP test, from a process of its own (so it does not share the test's GIL).

    python -m tests.reliability.http_abuse HOST PORT SECONDS

For SECONDS: 200 scrapers each getting /metrics about once a second on new connections; 40
clients that send half a request and then one byte a second, never finishing; 40 that connect
and send nothing; a loop of oversized and malformed requests; a loop of unknown paths. Prints
one JSON object of counts, and for the slow clients how long the server kept them.
"""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from collections import Counter

HOST, PORT, SECONDS = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
END = time.monotonic() + SECONDS
counts: Counter[str] = Counter()
kept: dict[str, list[float]] = {"trickle": [], "silent": []}
lock = threading.Lock()


def note(key: str) -> None:
    with lock:
        counts[key] += 1


def request(raw: bytes, read: int = 200) -> bytes:
    with socket.create_connection((HOST, PORT), timeout=10) as s:
        try:
            s.sendall(raw)
        except OSError:
            return b"<reset while sending>"
        try:
            return s.recv(read)
        except OSError:
            return b"<reset>"


def status(reply: bytes) -> str:
    """The status code; `reset` or `closed` when the server dropped the connection instead;
    `bare` for an answer without a status line (HTTP/0.9 has none)."""
    if reply.startswith(b"<reset"):
        return "reset"
    if not reply:
        return "closed"
    parts = reply.split(b" ", 2)
    return parts[1].decode() if len(parts) > 1 and reply.startswith(b"HTTP/") else "bare"


def scraper(rng: random.Random) -> None:
    time.sleep(rng.uniform(0, 1))
    while time.monotonic() < END:
        try:
            reply = request(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 64)
            note(f"scrape {status(reply)}")
        except OSError as exc:
            note(f"scrape {type(exc).__name__}")
        time.sleep(rng.uniform(0.5, 1.5))


def slow(kind: str) -> None:
    t0 = time.monotonic()
    try:
        s = socket.create_connection((HOST, PORT), timeout=2)
    except OSError:
        note(f"{kind} refused")
        return
    try:
        if kind == "trickle":
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        while time.monotonic() < END:
            try:
                if kind == "trickle":
                    s.sendall(b"X")
                if s.recv(1, socket.MSG_PEEK) == b"":
                    break  # the server closed it
            except TimeoutError:
                continue
            except OSError:
                break
            time.sleep(1.0)
        with lock:
            kept[kind].append(time.monotonic() - t0)
    finally:
        s.close()


OVERSIZED = {
    "request line 1 MiB": b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n",
    "300 headers": b"GET /metrics HTTP/1.1\r\n"
    + b"".join(b"X-%d: y\r\n" % i for i in range(300))
    + b"\r\n",
    "header line 200 KiB": b"GET /metrics HTTP/1.1\r\nX: " + b"y" * (200 << 10) + b"\r\n\r\n",
    "body 8 MiB": b"POST /metrics HTTP/1.1\r\nContent-Length: 8388608\r\n\r\n" + b"z" * (8 << 20),
    "garbage": bytes(range(256)) * 64 + b"\r\n\r\n",
    "bad method": b"BREW /metrics HTTP/1.1\r\n\r\n",
    "http/0.9": b"GET /metrics\r\n",
    "huge version": b"GET /metrics HTTP/" + b"9" * 10000 + b"\r\n\r\n",
}


def oversized() -> None:
    while time.monotonic() < END:
        for name, raw in OVERSIZED.items():
            try:
                note(f"oversized {name}: {status(request(raw))}")
            except OSError as exc:
                note(f"oversized {name}: {type(exc).__name__}")
        time.sleep(0.05)


def unknown(rng: random.Random) -> None:
    while time.monotonic() < END:
        # Never "/" itself (with or without a query): that is the landing page, a known route.
        path = (
            "/"
            + rng.choice("abc%.")
            + "".join(rng.choice("abc/%.?&=") for _ in range(rng.randrange(0, 39)))
        )
        try:
            reply = request(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            note(f"unknown path {status(reply)}")
        except OSError as exc:
            note(f"unknown path {type(exc).__name__}")
        time.sleep(0.01)


def main() -> None:
    threads = [threading.Thread(target=scraper, args=(random.Random(i),)) for i in range(200)]
    threads += [threading.Thread(target=slow, args=("trickle",)) for _ in range(40)]
    threads += [threading.Thread(target=slow, args=("silent",)) for _ in range(40)]
    threads += [threading.Thread(target=oversized)]
    threads += [threading.Thread(target=unknown, args=(random.Random(-1),))]
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(SECONDS + 30)
    print(json.dumps({"counts": dict(counts), "kept_s": kept}))


if __name__ == "__main__":
    main()
