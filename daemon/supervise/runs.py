"""What the supervisor reports of each start of vLLM and of a stop, and the ``Reporter`` that
hands its events and notes to the daemon."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

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
    stalled_in: str | None = None  # ended for a stall in this start-up phase (`note_stall`)


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


class StartPlanner(Protocol):
    """What decides each start's command beyond the configured one (ladder.py's `Ladder`): the
    supervisor asks it before each start and tells it of failed starts and readiness."""

    def argv(self) -> tuple[str, ...]: ...

    def failed(self, restarting: bool, stalled_in: str | None = None) -> None: ...

    def refused(self, reason: str) -> None: ...

    def ready(self) -> None: ...


class PlannerCalls:
    """The supervisor's calls of its `StartPlanner`, if any: one that raises is counted in the
    reporter's `errors_total`, never propagated (its bug must not orphan vLLM nor stop the
    restarts), and the configured command is used."""

    def __init__(self, planner: StartPlanner | None, report: Reporter, argv: tuple[str, ...]):
        self.planner = planner
        self._report = report
        self._argv = argv

    def argv(self) -> tuple[str, ...]:
        if self.planner is not None:
            try:
                return self.planner.argv()
            except Exception:
                self._report.errors_total += 1
        return self._argv

    def failed(self, run: RunRecord, restarting: bool) -> None:
        """After a run: a failed one is the planner's to keep, and to remedy when `restarting`."""
        if run.failed and self.planner is not None:
            try:
                if run.stalled_in is not None:
                    self.planner.failed(restarting, run.stalled_in)
                else:
                    self.planner.failed(restarting)
            except Exception:
                self._report.errors_total += 1

    def refused(self, reason: str) -> None:
        """The preflight refused a start (a restart follows, after the backoff)."""
        if self.planner is not None:
            try:
                self.planner.refused(reason)
            except Exception:
                self._report.errors_total += 1

    def ready(self) -> None:
        if self.planner is not None:
            try:
                self.planner.ready()
            except Exception:
                self._report.errors_total += 1


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
        self.argv = argv  # (the current start's: a remedy may change it)
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
            argv=self.argv,
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
