"""What the supervisor reports of each start of vLLM and of a stop, and the ``Reporter`` that
hands its events and notes to the daemon."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import ProcessEvent, ProcessEventKind

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


class Reporter:
    """Calls the daemon's callbacks with the supervisor's events (``ProcessEvent``) and notes (lines
    of its own for the event log). A callback that raises is counted in ``errors_total``, never
    propagated: the consumer's bug must not orphan vLLM."""

    def __init__(
        self,
        argv: tuple[str, ...],
        clock: Callable[[], float],
        on_event: Callable[[ProcessEvent], None] | None,
        on_note: Callable[[str, dict[str, Any]], None] | None,
    ) -> None:
        self._argv = argv
        self._clock = clock
        self._on_event = on_event
        self._on_note = on_note
        self.errors_total = 0

    def event(
        self,
        kind: ProcessEventKind,
        *,
        pid: int | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str | None = None,
        backoff_s: float | None = None,
        tree_pids: tuple[int, ...] = (),
        failed: bool = False,
    ) -> None:
        if self._on_event is None:
            return
        event = ProcessEvent(
            kind=kind,
            ts=self._clock(),
            pid=pid,
            argv=self._argv,
            exit_code=exit_code,
            signal=signal,
            reason=reason,
            backoff_s=backoff_s,
            tree_pids=tree_pids,
            failed=failed,
        )
        try:
            self._on_event(event)
        except Exception:  # the consumer's bug must not orphan vLLM
            self.errors_total += 1

    def note(self, name: str, **fields: Any) -> None:
        if self._on_note is not None:
            try:
                self._on_note(name, fields)
            except Exception:  # the consumer's bug must not orphan vLLM
                self.errors_total += 1
