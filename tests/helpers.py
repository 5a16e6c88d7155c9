"""Helpers every test directory shares: appending to a log as vLLM does, waiting for a condition,
a virtual clock, what `loadwatch events` reads from a log, reading the event log's folded lines
by their records."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def append(path: Path | str, data: bytes | str | Iterable[str]) -> None:
    """Append to a file, as a writer that opens it for each write (vLLM's redirected stdout
    holds it open; to a reader that is the same)."""
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes):
        data = "".join(data).encode()
    with open(path, "ab") as f:
        f.write(data)


# What a check may raise while its condition does not hold yet (the daemon is not up yet, the
# document has no such key yet): it counts as not yet.
REPO = Path(__file__).resolve().parent.parent
# The modules setup.py has mypyc compile (pyproject.toml), as paths in the repository.
COMPILED: tuple[str, ...] = tuple(
    tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["loadwatch"]["compiled"]
)


def module_name(path: str) -> str:
    """`parsers/vllm/stream.py` -> `loadwatch.parsers.vllm.stream`."""
    return "loadwatch." + path.removesuffix(".py").replace("/", ".")


NOT_YET = (AssertionError, KeyError, TypeError, ValueError, OSError)


def wait_for(
    check: Callable[[], object], what: str, timeout_s: float = 20.0, every_s: float = 0.02
) -> None:
    """Wait until `check()` is true; an AssertionError naming `what` (and the last error the
    check raised, if any) when `timeout_s` passes first. A check that raises one of `NOT_YET`
    counts as not yet; anything else ends the wait at once. The one poll of the tests."""
    end = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            if check():
                return
        except NOT_YET as exc:
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


async def wait_for_async(
    check: Callable[[], object], what: str, timeout_s: float = 20.0, every_s: float = 0.01
) -> None:
    """`wait_for` inside a running event loop: the loop goes on between the checks."""
    end = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            if check():
                return
        except NOT_YET as exc:
            last = exc
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


class VirtualClock:
    """Time that moves only when slept: the `monotonic` (call it) and the async `sleep` of a
    component under test, so a wait of seconds takes none."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)  # (a sleep lets the loop's other work in; so does this one)


def offline_events(log: Path) -> list[tuple[str, int]]:
    """What `loadwatch events` reads from a log: each record's events, (`log.TYPE`, offset),
    in order; the live daemon writes the same once it has read the log to its end."""
    out = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "events", str(log)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [(f"log.{e['type']}", e["offset"]) for e in map(json.loads, out.splitlines())]


def records(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Event log lines, each folded `log.kv_scale_run` line as the records it lists (`offsets`,
    `record_ts`): one `log.kv_scale_warning` line each with its offset and time and the folded
    line's replay mark; every other line as it is. What a record's line is known by (its name,
    offset and time) is then one per line."""
    out: list[dict[str, Any]] = []
    for e in lines:
        if e.get("event") != "log.kv_scale_run":
            out.append(e)
            continue
        assert len(e["offsets"]) == len(e["record_ts"]) == e["count"], e
        mark = {"replay": True} if e.get("replay") else {}
        for o, ts in zip(e["offsets"], e["record_ts"], strict=True):
            ts_field = {"ts": ts} if ts is not None else {}
            out.append({"event": "log.kv_scale_warning", "offset": o, **ts_field, **mark})
    return out
