"""Shared pieces for the follower tests: a collector that checks every chunk, a writer process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.follower import LogFollower
from tests.follower.writer import line

WRITER = Path(__file__).with_name("writer.py")

__all__ = ["Collector", "WriterProcess", "expected", "line"]


def expected(tag: str, first: int, count: int) -> bytes:
    return b"".join(line(tag, i) for i in range(first, first + count))


class Collector:
    """Drives a follower (read, then wait) and checks the Chunk contract on everything it gets."""

    def __init__(self, follower: LogFollower, *, contiguous: bool = True) -> None:
        self.f = follower
        self.chunks: list[Chunk] = []
        self.data = bytearray()
        self.contiguous = contiguous
        self._next: dict[str, int] = {}

    def add(self, chunks: Iterable[Chunk]) -> None:
        for c in chunks:
            assert c.data.endswith((b"\n", b"\r")), c
            if c.cut:
                assert c.next_offset > c.offset
            else:
                assert c.offset + len(c.data) == c.next_offset, c
            if self.contiguous and c.file_id in self._next:
                assert c.offset == self._next[c.file_id], (c, self._next[c.file_id])
            self._next[c.file_id] = c.next_offset
            self.chunks.append(c)
            self.data += c.data

    def read(self) -> list[Chunk]:
        chunks = self.f.read()
        self.add(chunks)
        return chunks

    def pump(self, until: Callable[[], bool], timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.read()
            if until():
                return
            if time.monotonic() > deadline:
                tail = bytes(self.data[-200:])
                raise AssertionError(f"timed out with {len(self.data)} bytes, ending {tail!r}")
            if not self.f.backlog:
                self.f.wait(0.05)

    def pump_bytes(self, n: int, timeout_s: float = 15.0) -> None:
        self.pump(lambda: len(self.data) >= n, timeout_s)

    def settle(self, quiet_s: float = 0.3) -> None:
        """Read until nothing new came for `quiet_s` (to show nothing more is delivered)."""
        end = time.monotonic() + quiet_s
        while time.monotonic() < end:
            if self.read():
                end = time.monotonic() + quiet_s
            self.f.wait(0.05)


class WriterProcess:
    """writer.py in its own process; `go()` releases its next ``["wait"]`` step."""

    def __init__(self, path: Path, plan: list[list[object]]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WRITER), str(path), json.dumps(plan)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def ready(self) -> None:
        """Block until the writer waits at its next ``["wait"]`` step."""
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == b"waiting\n"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def finish(self, timeout_s: float = 20.0) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
            self.proc.stdin = None  # so communicate() only drains stdout and waits
        self.proc.communicate(timeout=timeout_s)
        assert self.proc.returncode == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
