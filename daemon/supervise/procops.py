"""The OS calls the supervisor makes, behind one small object tests can replace."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from loadwatch.daemon.sources.proc.tree import ProcInfo, read_process_table


class ChildProcess(Protocol):
    @property
    def pid(self) -> int: ...

    def wait(self) -> int:
        """Block until the process exits; its return code (negative: killed by that signal)."""
        ...


class ProcessOps(Protocol):
    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, output_fd: int
    ) -> ChildProcess: ...

    def signal(self, pid: int, sig: int) -> None: ...

    def signal_group(self, pgid: int, sig: int) -> None: ...

    def process_table(self) -> dict[int, ProcInfo]: ...

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class _PopenChild:
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    def wait(self) -> int:
        # Popen.wait, not os.waitpid: Popen's own bookkeeping may reap the pid otherwise.
        return self._popen.wait()


class PosixOps:
    """The real thing: subprocess, kill(2), /proc, the system clocks, asyncio.sleep."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, output_fd: int
    ) -> ChildProcess:
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            start_new_session=True,
            close_fds=True,
        )
        return _PopenChild(popen)

    def signal(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def signal_group(self, pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def process_table(self) -> dict[int, ProcInfo]:
        return read_process_table(self.proc_root)

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
