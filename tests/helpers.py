"""Helpers every test directory shares: appending to a log as vLLM does, waiting for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path


def append(path: Path | str, data: bytes | str | Iterable[str]) -> None:
    """Append to a file, as a writer that opens it for each write (vLLM's redirected stdout
    holds it open; to a reader that is the same)."""
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes):
        data = "".join(data).encode()
    with open(path, "ab") as f:
        f.write(data)


def wait_for(
    check: Callable[[], object], what: str, timeout_s: float = 20.0, every_s: float = 0.02
) -> None:
    """Wait until `check()` is true; an AssertionError naming `what` (and the last error the
    check raised, if any) when `timeout_s` passes first. A check that raises (the daemon is not
    up yet, the document has no such key yet) counts as not yet."""
    end = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            if check():
                return
        except (AssertionError, KeyError, TypeError, ValueError, OSError) as exc:
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")
