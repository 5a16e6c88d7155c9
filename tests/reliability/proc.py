"""The real daemon as a subprocess (`python -m loadwatch.daemon.cli run ...`) for the fault tests.

Its stdout (the event log, one JSON object per line) is a pipe, drained into a file by a thread
of the test: a daemon that is never read never blocks on a full pipe, and a file-size limit put
on the daemon does not apply to its console. `prewarm=True` starts the interpreter and imports loadwatch
first, then waits for `go()` before running the command line: a restart then costs the daemon's
own start, not the import, and the kill tests can afford fifty of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.client import DaemonClient
from tests.helpers import wait_for  # noqa: F401  (the one wait for every test)

REPO = Path(__file__).resolve().parents[2]

_LAUNCHER = (
    "import sys\n"
    "from loadwatch.daemon import app, cli, loop\n"  # the import, paid before the go line
    "sys.stdin.readline()\n"
    "sys.exit(cli.main(sys.argv[1:]))\n"
)


class DaemonProc(DaemonClient):
    def __init__(
        self,
        args: Sequence[str],
        out: Path,
        *,
        prewarm: bool = False,
        env: dict[str, str] | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        self.out = out
        self.url = ""
        cmd = [sys.executable, "-c", _LAUNCHER, "run", *args]
        if not prewarm:
            cmd = [sys.executable, "-m", "loadwatch.daemon.cli", "run", *args]
        self._stdout = out.open("wb")
        self._stderr = out.with_suffix(".stderr").open("wb")
        self.proc = subprocess.Popen(
            [*wrapper, *cmd],
            cwd=REPO,
            stdin=subprocess.PIPE if prewarm else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **(env or {})},
        )
        self._drain = threading.Thread(target=self._copy, daemon=True)
        self._drain.start()
        self.prewarm = prewarm
        self.go_at: float | None = None if prewarm else time.monotonic()

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._stdout.write(line)
            self._stdout.flush()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.go_at = time.monotonic()
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.out.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line cut by a kill
        return out

    def stderr(self) -> str:
        return self.out.with_suffix(".stderr").read_text(errors="replace")

    def wait_listening(self, timeout_s: float = 30.0) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for e in self.events():
                if e.get("event") == "daemon.listening":
                    self.url = str(e["url"])
                    return self.url
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        raise AssertionError(f"daemon did not listen (exit {self.proc.poll()}): {self.stderr()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self._close()
        return code

    def _close(self) -> None:
        self._drain.join(5)
        for f in (self._stdout, self._stderr, self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                f.close()
