"""The status client's read: `GET <url>/status`, with nothing in the answer trusted.

Whatever listens at the URL answers, so the read is bounded every way a server could stretch it:
- one deadline for the whole exchange (connect, head and body): when it passes, the socket is
  shut down under whatever read is waiting. A per-read timeout alone would let a server that
  sends a byte every second keep the client for ever;
- a size cap, checked on the declared length before reading and on the bytes as they come;
- JSON nested at most MAX_DEPTH deep (a deeper document is refused, whether or not Python's
  parser could recurse that far), with NaN and the infinities read as null.
The values' types are checked where they are read (docread.py): a wrong one shows as unknown.

The daemon may ask for credentials: a `user:password@` in the URL is sent as basic auth, and
`LOADWATCH_TOKEN_FILE` names a file holding a bearer token. Proxies are never used.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import socket
import ssl
import threading
import urllib.parse
from typing import Any

from loadwatch.exporters.terminal.fmt import size

EX_USAGE = 64
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_NOPERM = 77
TIMEOUT_S = 3.0
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 4096
MAX_DEPTH = 32  # a status document nests about 5 deep
READ_BYTES = 65536


class StatusError(Exception):
    """The status could not be had: one line for the user and its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def with_scheme(url: str) -> str:
    """`HOST:PORT` alone means http, as curl reads it."""
    url = url.strip()
    return url if "://" in url else f"http://{url}"


def status_target(url: str) -> tuple[str, dict[str, str]]:
    """The /status URL without credentials, and the headers that carry them."""
    parts = urllib.parse.urlsplit(with_scheme(url))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StatusError(f"--url {url!r}: expected http://HOST:PORT", EX_USAGE)
    try:
        port = parts.port
    except ValueError:
        raise StatusError(f"--url {url!r}: bad port", EX_USAGE) from None
    headers = {"Accept": "application/json", "User-Agent": "loadwatch-status"}
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    token_file = os.environ.get("LOADWATCH_TOKEN_FILE")
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as fh:
                bearer = fh.read().strip()
        except OSError as exc:
            raise StatusError(
                f"LOADWATCH_TOKEN_FILE {token_file}: {exc.strerror or exc}", EX_USAGE
            ) from None
        headers["Authorization"] = f"Bearer {bearer}"
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    # a path is sent as ASCII: what the user typed unencoded (a space, an accent) is encoded
    path = urllib.parse.quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=~") + "/status"
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, "", "")), headers


def _why(reason: object) -> str:
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return " ".join(str(reason).split())[:200] or type(reason).__name__


class _Deadline:
    """Shuts the connection's socket down when the time is up, whatever read waits on it.

    The shutdown goes to the socket itself (for TLS too: the record layer then reads end of
    file), never after the connection is closed: `__exit__` takes the lock first, so a
    descriptor number reused by another thread is never touched."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._done = False
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            sock = self._conn.sock
            if sock is not None:
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass  # not connected yet, or already gone: the check after connect sees it


def fetch_status(
    url: str, timeout_s: float = TIMEOUT_S, max_bytes: int = MAX_BODY_BYTES
) -> tuple[dict[str, Any], bytes]:
    """GET <url>/status: the document and the body as received, or a StatusError."""
    target, headers = status_target(url)
    status, reason, body = _get(target, headers, timeout_s, max_bytes)
    if status != 200:
        raise _http_error(target, status, reason, body)
    return parse_status(body, target), body


def _get(
    target: str, headers: dict[str, str], timeout_s: float, max_bytes: int
) -> tuple[int, str, bytes]:
    parts = urllib.parse.urlsplit(target)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        context = ssl.create_default_context()
        conn = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout_s, context=context
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
    timed_out = StatusError(
        f"{target}: timed out (no whole answer in {timeout_s:g}s)", EX_UNAVAILABLE
    )
    try:
        with _Deadline(conn, timeout_s) as deadline:
            try:
                conn.connect()
                if deadline.expired:
                    raise timed_out
                conn.request("GET", parts.path, headers=headers)
                resp = conn.getresponse()
                limit = max_bytes if resp.status == 200 else MAX_ERROR_BODY_BYTES
                if resp.status == 200 and resp.length is not None and resp.length > max_bytes:
                    raise _too_large(target, max_bytes)
                body = _read_upto(resp, limit)
            except (OSError, http.client.HTTPException) as exc:
                if deadline.expired:
                    raise timed_out from None
                raise _transport_error(target, exc) from None
            if deadline.expired:  # the body may look whole: the shutdown read as its end
                raise timed_out
    finally:
        conn.close()
    if resp.status == 200 and len(body) > max_bytes:
        raise _too_large(target, max_bytes)
    return resp.status, resp.reason, body


def _read_upto(resp: http.client.HTTPResponse, limit: int) -> bytes:
    """At most `limit` + 1 bytes of the body: one more than allowed says it is too large."""
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = resp.read(min(READ_BYTES, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _too_large(target: str, max_bytes: int) -> StatusError:
    return StatusError(f"{target}: answer larger than {size(max_bytes)}", EX_DATAERR)


def _transport_error(target: str, exc: Exception) -> StatusError:
    if isinstance(exc, http.client.RemoteDisconnected):
        return StatusError(f"{target}: the connection closed without an answer", EX_UNAVAILABLE)
    if isinstance(exc, http.client.HTTPException):
        return StatusError(f"{target}: not an HTTP answer ({type(exc).__name__})", EX_DATAERR)
    return StatusError(f"cannot reach {target}: {_why(exc)}", EX_UNAVAILABLE)


def _http_error(target: str, status: int, reason: str, body: bytes) -> StatusError:
    text = body.decode("utf-8", "replace")
    if status in (401, 403):
        return StatusError(
            f"{target}: HTTP {status}: the daemon wants credentials "
            "(user:password@ in --url, or LOADWATCH_TOKEN_FILE)",
            EX_NOPERM,
        )
    if status == 503 and "starting" in text:
        return StatusError(f"{target}: the daemon is starting, no status yet", EX_UNAVAILABLE)
    if status >= 500:
        return StatusError(f"{target}: HTTP {status} {reason}", EX_UNAVAILABLE)
    return StatusError(f"{target}: HTTP {status} {reason}: not a loadwatch daemon?", EX_DATAERR)


# -- the document -------------------------------------------------------------------------------


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # 1e999 is not a figure


def _no_constant(name: str) -> None:
    return None  # NaN, Infinity, -Infinity: not JSON, read as null


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether `value` nests lists or objects more than `limit` deep (without recursion)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def parse_status(body: bytes, where: str = "the answer") -> dict[str, Any]:
    too_deep = StatusError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels", EX_DATAERR)
    try:
        doc = json.loads(body, parse_float=_finite, parse_constant=_no_constant)
    except RecursionError:
        raise too_deep from None
    except ValueError:  # UnicodeDecodeError too
        raise StatusError(f"{where}: the answer is not JSON", EX_DATAERR) from None
    if nested_deeper(doc, MAX_DEPTH):
        raise too_deep
    if not isinstance(doc, dict) or type(doc.get("schema")) is not int or "phase" not in doc:
        raise StatusError(f"{where}: not a loadwatch status document", EX_DATAERR)
    return doc


__all__ = [
    "EX_DATAERR",
    "EX_NOPERM",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "MAX_BODY_BYTES",
    "MAX_DEPTH",
    "TIMEOUT_S",
    "StatusError",
    "fetch_status",
    "nested_deeper",
    "parse_status",
    "status_target",
    "with_scheme",
]
