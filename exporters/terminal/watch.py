"""`loadwatch status`: a running daemon's `/status`, drawn in the terminal.

`status_command` fetches `<url>/status` and draws it once, or keeps redrawing with `--watch`
until `q` or Ctrl-C (on a pipe: one plain frame per interval). The drawing is
`render_status(doc)` (screen.py, re-exported here), a pure function of the document that
`loadwatch demo` uses for its live screen too.

The daemon may ask for credentials: a `user:password@` in the URL is sent as basic auth, and
`LOADWATCH_TOKEN_FILE` names a file holding a bearer token. Proxies are never used.

Exit codes: 0 shown, 64 bad arguments, 65 the answer is not loadwatch's status JSON, 69 the
daemon cannot be reached (refused, timed out, starting), 77 the daemon refused the credentials.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from loadwatch.exporters.terminal.fmt import duration, make_console, pipe_width, show, size
from loadwatch.exporters.terminal.screen import render_status, status_text

EX_USAGE = 64
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_NOPERM = 77
TIMEOUT_S = 3.0
MAX_BODY_BYTES = 16 * 1024 * 1024


class StatusError(Exception):
    """The status could not be had: one line for the user and its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# -- fetching -----------------------------------------------------------------------------------


def with_scheme(url: str) -> str:
    """`HOST:PORT` alone means http, as curl reads it."""
    url = url.strip()
    return url if "://" in url else f"http://{url}"


def _target(url: str) -> tuple[str, dict[str, str]]:
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
    path = parts.path.rstrip("/") + "/status"
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, "", "")), headers


def _why(reason: object) -> str:
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return " ".join(str(reason).split())[:200] or type(reason).__name__


def fetch_status(url: str, timeout_s: float = TIMEOUT_S) -> tuple[dict[str, Any], bytes]:
    """GET <url>/status: the document and the body as received, or a StatusError."""
    target, headers = _target(url)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(target, headers=headers)
    try:
        with opener.open(request, timeout=timeout_s) as resp:
            body: bytes = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise _http_error(target, exc) from None
    except urllib.error.URLError as exc:
        raise StatusError(f"cannot reach {target}: {_why(exc.reason)}", EX_UNAVAILABLE) from None
    except http.client.RemoteDisconnected:
        raise StatusError(
            f"{target}: the connection closed without an answer", EX_UNAVAILABLE
        ) from None
    except http.client.HTTPException as exc:
        raise StatusError(
            f"{target}: not an HTTP answer ({type(exc).__name__})", EX_DATAERR
        ) from None
    except OSError as exc:
        raise StatusError(f"cannot reach {target}: {_why(exc)}", EX_UNAVAILABLE) from None
    if len(body) > MAX_BODY_BYTES:
        raise StatusError(f"{target}: answer larger than {size(MAX_BODY_BYTES)}", EX_DATAERR)
    return parse_status(body, target), body


def _http_error(target: str, exc: urllib.error.HTTPError) -> StatusError:
    try:
        text = exc.read(4096).decode("utf-8", "replace")
    except OSError:
        text = ""
    finally:
        exc.close()
    if exc.code in (401, 403):
        return StatusError(
            f"{target}: HTTP {exc.code}: the daemon wants credentials "
            "(user:password@ in --url, or LOADWATCH_TOKEN_FILE)",
            EX_NOPERM,
        )
    if exc.code == 503 and "starting" in text:
        return StatusError(f"{target}: the daemon is starting, no status yet", EX_UNAVAILABLE)
    if exc.code >= 500:
        return StatusError(f"{target}: HTTP {exc.code} {exc.reason}", EX_UNAVAILABLE)
    return StatusError(
        f"{target}: HTTP {exc.code} {exc.reason}: not a loadwatch daemon?", EX_DATAERR
    )


def parse_status(body: bytes, where: str = "the answer") -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise StatusError(f"{where}: the answer is not JSON", EX_DATAERR) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("schema"), int) or "phase" not in doc:
        raise StatusError(f"{where}: not a loadwatch status document", EX_DATAERR)
    return doc


def _error_screen(message: str, interval_s: float) -> RenderableType:
    return Group(
        Text("loadwatch status", "bold"),
        Text(message, "red"),
        Text(f"retrying every {duration(interval_s)}; q or Ctrl-C to quit", "dim"),
    )


# -- the command --------------------------------------------------------------------------------


def _fail(message: str, code: int) -> int:
    print(f"loadwatch: {message}", file=sys.stderr)
    return code


def status_command(
    url: str,
    *,
    watch: bool,
    as_json: bool,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
    timeout_s: float = TIMEOUT_S,
) -> int:
    if not math.isfinite(interval_s) or interval_s < 0.1:
        return _fail("--interval must be at least 0.1 seconds", EX_USAGE)
    try:
        _target(url)
    except StatusError as exc:
        return _fail(str(exc), exc.code)
    try:
        if not watch:
            try:
                doc, body = fetch_status(url, timeout_s)
            except StatusError as exc:
                return _fail(str(exc), exc.code)
            if as_json:
                sys.stdout.write(body.decode("utf-8", "replace").rstrip("\n") + "\n")
                sys.stdout.flush()
            else:
                show(render_status(doc, width=make_console(sys.stdout).width), sys.stdout)
            return 0
        if as_json:
            return _watch_json(url, interval_s, sleep, timeout_s)
        return _watch_screen(url, interval_s, sleep, timeout_s)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


def _fatal(exc: StatusError) -> bool:
    """Errors that retrying does not mend: a wrong URL, the wrong service, no credentials."""
    return exc.code in (EX_USAGE, EX_DATAERR, EX_NOPERM)


def _watch_json(
    url: str, interval_s: float, sleep: Callable[[float], None], timeout_s: float
) -> int:
    def line(doc: dict[str, Any]) -> str:
        return json.dumps(doc, separators=(",", ":")) + "\n"

    return _watch_lines(url, interval_s, sleep, timeout_s, line)


def _watch_lines(
    url: str,
    interval_s: float,
    sleep: Callable[[float], None],
    timeout_s: float,
    render: Callable[[dict[str, Any]], str],
) -> int:
    """Write `render(doc)` each interval; say a passing fault on stderr, stop on a lasting one."""
    while True:
        try:
            doc, _ = fetch_status(url, timeout_s)
        except StatusError as exc:
            if _fatal(exc):
                return _fail(str(exc), exc.code)
            print(f"loadwatch: {exc}", file=sys.stderr)
        else:
            sys.stdout.write(render(doc))
            sys.stdout.flush()
        sleep(interval_s)


def _watch_screen(
    url: str, interval_s: float, sleep: Callable[[float], None], timeout_s: float
) -> int:
    if not sys.stdout.isatty():
        return _watch_plain(url, interval_s, sleep, timeout_s)
    console = make_console(sys.stdout)
    with _Keys() as keys, Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            try:
                doc, _ = fetch_status(url, timeout_s)
            except StatusError as exc:
                if _fatal(exc):
                    live.stop()
                    return _fail(str(exc), exc.code)
                live.update(_error_screen(str(exc), interval_s), refresh=True)
            else:
                live.update(render_status(doc, width=console.width), refresh=True)
            if keys.quit_within(interval_s, sleep):
                return 0


def _watch_plain(
    url: str, interval_s: float, sleep: Callable[[float], None], timeout_s: float
) -> int:
    """Not a terminal (a pipe, `tee`, a file): one plain frame per interval, each headed by a
    rule, so `loadwatch status --watch | tee status.log` records the load as it goes."""
    width = pipe_width()

    def frame(doc: dict[str, Any]) -> str:
        return "-" * min(width, 100) + "\n" + status_text(doc, width)

    return _watch_lines(url, interval_s, sleep, timeout_s, frame)


class _Keys:
    """`q` quits the watch: stdin in cbreak mode while the screen runs (when it is a terminal),
    read between frames. Restores the terminal on exit, whatever ends the watch."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._saved: list[Any] | None = None

    def __enter__(self) -> _Keys:
        try:
            fd = sys.stdin.fileno()
            if os.isatty(fd):
                import termios
                import tty

                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self._fd = fd
        except (OSError, ValueError, AttributeError):
            self._fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)

    def quit_within(self, interval_s: float, sleep: Callable[[float], None]) -> bool:
        """Wait out the interval; True as soon as `q` (or `Q`) is typed."""
        if self._fd is None:
            sleep(interval_s)
            return False
        import select

        deadline = time.monotonic() + interval_s
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                break
            data = os.read(self._fd, 64)
            if not data or b"q" in data.lower():
                return True
        return False


__all__ = [
    "StatusError",
    "fetch_status",
    "parse_status",
    "render_status",
    "status_command",
    "status_text",
]
