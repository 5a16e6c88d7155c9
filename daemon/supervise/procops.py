"""The OS calls the supervisor makes, behind one small object tests can replace.

Two Linux process settings keep vLLM's tree with its supervisor (prctl(2), through ctypes):
- vLLM gets PR_SET_PDEATHSIG = SIGTERM, set in the child between fork and exec: when the
  supervisor dies, even by SIGKILL, the kernel tells vLLM to shut down (SIGTERM, so it ends its
  own workers and frees the GPUs as on any stop). The signal follows the thread that forked, so
  `spawn` is called on the loop's thread, which lives as long as the supervisor;
- the supervisor is a child subreaper (PR_SET_CHILD_SUBREAPER): a process of vLLM's tree whose
  parent exits (a double fork, a worker that called setsid and outlived its parent) is re-parented
  to the supervisor instead of init, so it is found among the supervisor's own children (those
  carrying the run's environment marker) however fast its parent went, and reaped when it ends.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import signal
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

    def become_subreaper(self) -> bool:
        """Orphans of our descendants are re-parented to us; False where that cannot be."""
        ...

    def carries(self, pid: int, marker: str) -> bool:
        """`pid` was started with `marker` (NAME=VALUE) in its environment."""
        ...

    def reap(self, pid: int) -> None:
        """Collect the exit of `pid`, a child of ours nobody else waits for, if it has ended."""
        ...


PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _prctl(option: int, value: int) -> bool:
    return bool(_libc.prctl(option, value, 0, 0, 0) == 0)


def _die_with(parent: int) -> None:
    """In the child, before exec: SIGTERM when the supervisor goes (and at once if it already
    went between the fork and here)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


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
        parent = os.getpid()
        popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            start_new_session=True,
            close_fds=True,
            preexec_fn=lambda: _die_with(parent),  # no shell: a prctl(2) call, then exec
        )
        return _PopenChild(popen)

    def become_subreaper(self) -> bool:
        return _prctl(PR_SET_CHILD_SUBREAPER, 1)

    def carries(self, pid: int, marker: str) -> bool:
        try:
            with open(f"{self.proc_root}/{pid}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            return False
        return marker.encode() in environ.split(b"\0")

    def reap(self, pid: int) -> None:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass

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
