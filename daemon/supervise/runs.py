"""What the supervisor reports of each start of vLLM, and of a stop."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

State = Literal["idle", "starting", "running", "backoff", "stopping", "exited", "fatal"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One start of vLLM, as it ended."""

    pid: int
    argv: tuple[str, ...]
    started_at: float
    ended_at: float
    exit_code: int | None
    signal: int | None
    reason: str
    failed: bool
    tree_pids: tuple[int, ...]
    remaining_pids: tuple[int, ...]  # tree members still alive after SIGKILL (should be empty)


@dataclass(frozen=True, slots=True)
class StopResult:
    state: State
    tree_pids: tuple[int, ...] = ()
    remaining_pids: tuple[int, ...] = ()
    exit_code: int | None = None
    signal: int | None = None


def describe_exit(code: int | None, sig: int | None) -> str:
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    if code is None:
        return "exit status unknown"
    return f"exit code {code}"
