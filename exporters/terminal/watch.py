"""`loadwatch status`: a running daemon's `/status`, drawn in the terminal.

`status_command` fetches `<url>/status` (fetch.py: one deadline, a size cap, bounded JSON) and
draws it once, or keeps redrawing with `--watch` until `q` or Ctrl-C (on a pipe: one plain frame
per interval). The drawing is `render_status(doc)` (screen.py, re-exported here), a pure
function of the document that `loadwatch demo` uses for its live screen too. What is written
goes through the clean console (clean.py): nothing the server sent reaches the terminal as a
control sequence; `--json` writes the document re-encoded, every control escaped.

Exit codes: 0 shown, 64 bad arguments, 65 the answer is not loadwatch's status JSON (or too
large, or too deeply nested), 69 the daemon cannot be reached (refused, timed out, starting),
77 the daemon refused the credentials.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from loadwatch.exporters.terminal.clean import print_error
from loadwatch.exporters.terminal.console import make_console, show
from loadwatch.exporters.terminal.fetch import (
    EX_DATAERR,
    EX_NOPERM,
    EX_UNAVAILABLE,
    EX_USAGE,
    TIMEOUT_S,
    StatusError,
    fetch_status,
    parse_status,
    status_target,
)
from loadwatch.exporters.terminal.fmt import duration, pipe_width
from loadwatch.exporters.terminal.screen import render_status, status_text


def _error_screen(message: str, interval_s: float) -> RenderableType:
    return Group(
        Text("loadwatch status", "bold"),
        Text(message, "red"),
        Text(f"retrying every {duration(interval_s)}; q or Ctrl-C to quit", "dim"),
    )


# -- the command --------------------------------------------------------------------------------


def _fail(message: str, code: int) -> int:
    print_error(message)
    return code


def json_line(doc: Any) -> str:
    """The document as one line of JSON, every non-ASCII character and control escaped (the
    server's own bytes may hold raw C1 controls inside strings, which JSON allows)."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True) + "\n"


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
        status_target(url)
    except StatusError as exc:
        return _fail(str(exc), exc.code)
    try:
        if not watch:
            try:
                doc, _ = fetch_status(url, timeout_s)
            except StatusError as exc:
                return _fail(str(exc), exc.code)
            if as_json:
                sys.stdout.write(json_line(doc))
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
    return _watch_lines(url, interval_s, sleep, timeout_s, json_line)


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
            print_error(str(exc))
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
    "EX_DATAERR",
    "EX_NOPERM",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "TIMEOUT_S",
    "StatusError",
    "fetch_status",
    "json_line",
    "parse_status",
    "render_status",
    "status_command",
    "status_text",
]
