"""Run vLLM, capture its output, restart it by policy, and stop it with nothing left behind.

How the daemon drives it (one asyncio loop, everything called from that loop's thread)::

    sup = Supervisor(config, on_event=state_queue.put_nowait)
    task = asyncio.create_task(sup.run())      # starts vLLM, supervises until stopped/fatal
    ...
    sup.note_ready()                 # /health answered 200: the start succeeded
    sup.note_fatal_failure("engine_init_failed")  # the log shows a fatal Failure this session
    sup.note_stall(stalled_for_s, phase)  # loading made no progress for that long
    result = await sup.stop()        # SIGTERM the tree, grace, SIGKILL; pids for the GPU check
    await task

Every transition is reported as a ``ProcessEvent`` through ``on_event`` (a plain callback, called
on the loop; it must not block). States::

    idle -> starting -> running -> (exit) -> backoff -> starting ...
                         |  \\-> stopping (stop, stall restart, leftovers after an exit)
                         \\-> exited (stopped, or policy says no restart) | fatal (crash loop, ...)

Decisions: a run failed when it exited non-zero, was killed by a signal, was ended by a stall
restart, or exited 0 after ``note_fatal_failure`` (after a clean exit the supervisor waits up to
``exit_verdict_wait_s`` for that verdict, as the log follower may lag). ``on-failure`` restarts
failed runs, ``always`` every run, ``never`` none. The backoff doubles per consecutive failure
up to its cap and resets after ``note_ready`` or a long run; after ``crash_loop_starts`` starts
within ``crash_loop_window_s`` the state is fatal. The ``preflight`` hook runs before each start;
its veto backs off and retries (so a patched model directory starts by itself, and the planner
may remedy what it predicts), or is fatal under ``never``. A ``planner`` (ladder.py's ``Ladder``), when given, decides each start's
command and hears of each failed start before the backoff (the first failure of a crash loop is
kept and a remedy announced there) and of readiness.

This module is the policy. The mechanism of one run is ``RunDriver`` (run_driver.py): vLLM in
its own session (so its own process group), stdout and stderr on one pipe pumped to the rotating
log, the exit watched from a thread, the tree re-scanned from /proc so that workers that called
``setsid`` or outlived their parent are still found and killed at the end (``TreeControl``,
tree_run.py). It hands back a ``RunOutcome`` that ``_finish`` judges.

OS calls go through ``ProcessOps`` (procops.py); ``PosixOps`` is the real one. Settings live in
config.py and are re-exported here, as are the records (runs.py).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import ProcessEvent
from loadwatch.daemon.supervise import leftovers
from loadwatch.daemon.supervise.config import (
    RestartPolicy,
    StallPolicy,
    SupervisorConfig,
    SupervisorConfigError,
    supervisor_config,
)
from loadwatch.daemon.supervise.leftovers import PidFile
from loadwatch.daemon.supervise.logsink import RotatingLog
from loadwatch.daemon.supervise.procops import ChildProcess, PosixOps, ProcessOps
from loadwatch.daemon.supervise.run_driver import Requests, RunDriver, RunOutcome, StartRefused
from loadwatch.daemon.supervise.runs import (
    PlannerCalls,
    Reporter,
    RunRecord,
    StartPlanner,
    State,
    StopResult,
    describe_exit,
)
from loadwatch.daemon.supervise.tree_run import Run, TreeControl
from loadwatch.parsers.events import FAILURE_RANK

__all__ = [
    "ChildProcess",
    "PosixOps",
    "ProcessOps",
    "RestartPolicy",
    "RunRecord",
    "StallPolicy",
    "State",
    "StopResult",
    "Supervisor",
    "SupervisorConfig",
    "SupervisorConfigError",
    "describe_exit",
    "supervisor_config",
]


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        on_event: Callable[[ProcessEvent], None] | None = None,
        ops: ProcessOps | None = None,
        on_note: Callable[[str, dict[str, Any]], None] | None = None,
        planner: StartPlanner | None = None,
    ) -> None:
        self.config = config
        self.argv = config.argv  # the current (or last) start's command
        self._pids = PidFile(config.pid_file) if config.pid_file is not None else None
        self._ops: ProcessOps = ops if ops is not None else PosixOps()
        # on_note: lines of its own for the event log (a leftover tree stopped)
        self._report = Reporter(config.argv, self._ops.time, on_event, on_note)
        # The first failure of a crash loop and the remedies for it (ladder.py); None: the
        # configured command, always.
        self._plan = PlannerCalls(planner, self._report, config.argv)
        self._state: State = "idle"
        self._done: asyncio.Event | None = None
        self._active = False
        self._requests = Requests()
        self._run: Run | None = None
        self._serving = False
        self._starts: list[float] = []  # monotonic times of recent starts
        self._consecutive_failures = 0
        self.runs: list[RunRecord] = []
        self.last_reason: str | None = None
        # In every run's environment: a worker that escaped the tree still shows it in /proc.
        self.run_marker = secrets.token_hex(8)
        tree = TreeControl(self._ops, config, self._pids, self.run_marker)
        self._driver = RunDriver(self._ops, config, tree, self._requests, self._stopping_run)

    # -- what the daemon reads ------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def pid(self) -> int | None:
        return self._run.child.pid if self._run is not None else None

    @property
    def tree_pids(self) -> tuple[int, ...]:
        """Pids of the current run's tree, else of the last run's."""
        if self._run is not None:
            return self._run.tree.pids
        return self.runs[-1].tree_pids if self.runs else ()

    @property
    def log(self) -> RotatingLog | None:
        return self._driver.log

    @property
    def callback_errors_total(self) -> int:
        return self._report.errors_total

    # -- what the daemon tells it ---------------------------------------------------------------

    def note_ready(self) -> None:
        """vLLM answered /health with 200: this start worked; reset the backoff."""
        if self._run is not None:
            if not self._serving:
                self._plan.ready()
            self._serving = True
            self._consecutive_failures = 0

    def note_fatal_failure(self, kind: str) -> bool:
        """The log of the current run shows a fatal failure: its exit counts as failed even with
        code 0 (vLLM exits 0 after its engine died). False when there is no current run.

        The exit's reason names the most telling kind noted: vLLM logs `EngineCore failed to
        start.` before the traceback that says why (the KV cache is too small, say)."""
        if self._run is None:
            return False
        noted = self._run.fatal_kind
        if noted is None or _rank(kind) < _rank(noted):
            self._run.fatal_kind = kind
        self._requests.poke()
        return True

    def note_stall(self, stalled_for_s: float, phase: str | None = None) -> bool:
        """No progress for ``stalled_for_s`` (in start-up ``phase``): in ``stall_end_phases`` end
        the start as failed (a remedy waits), else by stall policy; True if decided."""
        if self._state != "running" or self._serving or (run := self._run) is None:
            return False  # (once serving, stalls are not about loading)
        if phase in (cfg := self.config).stall_end_phases and cfg.restart != "never":
            run.stalled_in = phase  # (the run is ended: its failure is this stall)
            return self.request_restart(f"stalled for {stalled_for_s:.0f} s in {phase}")
        too_long = cfg.stall_policy == "restart" and stalled_for_s >= cfg.stall_restart_after_s
        return too_long and self.request_restart(f"stalled for {stalled_for_s:.0f} s while loading")

    def request_restart(self, reason: str) -> bool:
        """End the current run and start again (as after a failure, with backoff)."""
        if self._run is None or self._state != "running" or self._requests.stop is not None:
            return False
        if self._requests.restart is None:
            self._requests.restart = reason
        self._requests.poke()
        return True

    async def stop(self, reason: str = "stop requested") -> StopResult:
        """End vLLM and its whole tree and stay stopped. Safe to call in any state."""
        if self._requests.stop is None:
            self._requests.stop = reason
        self._requests.poke()
        if self._active and self._done is not None:
            await self._done.wait()
        if self._state == "idle":
            self._set_state("exited")
        last = self.runs[-1] if self.runs else None
        if last is None:
            return StopResult(self._state)
        return StopResult(
            self._state, last.tree_pids, last.remaining_pids, last.exit_code, last.signal
        )

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> State:
        """Start vLLM and supervise it until stopped, exited by policy, or fatal."""
        if self._active:
            raise RuntimeError("Supervisor.run() is already running")
        self._active = True
        self._requests.wake = asyncio.Event()
        self._done = asyncio.Event()
        self._ops.become_subreaper()
        try:
            if self._pids is not None:
                await leftovers.stop(self._pids, self._ops, self.config, self._report.note)
            await self._loop()
        finally:
            if self._run is not None:  # cancelled mid-run: leave nothing behind
                await self._end_run_after_cancel()
            self._driver.close()
            self._active = False
            self._done.set()
        return self._state

    async def _loop(self) -> None:
        cfg = self.config
        while True:
            if self._stopping():
                self._set_state("exited")
                return
            crash_loop = self._crash_loop()
            if crash_loop is not None:
                self._fatal(crash_loop)
                return
            self._set_state("starting")
            veto = await self._run_preflight()
            if self._stopping():
                continue
            if veto is not None:
                if cfg.restart == "never":
                    self._fatal(veto)
                    return
                self._plan.refused(veto)  # (a remedy may make the next start pass)
                await self._backoff(veto)
                continue
            outcome = await self._start_and_supervise()
            if outcome == "fatal":
                return
            if outcome == "retry":
                await self._backoff(self.last_reason or "start failed")
                continue
            last = self.runs[-1]
            if self._stopping():
                self._set_state("exited")
                return
            if cfg.restart == "never" or (cfg.restart == "on-failure" and not last.failed):
                self._plan.failed(last, False)
                self._set_state("exited")
                return
            crash_loop = self._crash_loop()
            self._plan.failed(last, crash_loop is None)  # (announces a remedy before backoff)
            if crash_loop is not None:
                self._fatal(crash_loop)
                return
            await self._backoff(last.reason)

    def _crash_loop(self) -> str | None:
        """A reason to give up when the starts in the window reached the burst limit."""
        cfg = self.config
        now = self._ops.monotonic()
        self._starts = [t for t in self._starts if now - t < cfg.crash_loop_window_s]
        if len(self._starts) < cfg.crash_loop_starts:
            return None
        last = f"; last: {self.runs[-1].reason}" if self.runs else ""
        return (
            f"crash loop: {len(self._starts)} starts within "
            f"{cfg.crash_loop_window_s:g} s, not starting again{last}"
        )

    async def _run_preflight(self) -> str | None:
        hook = self.config.preflight
        if hook is None:
            return None
        try:
            reason = await asyncio.to_thread(hook)
        except Exception as exc:  # a broken check must not keep vLLM down
            self.last_reason = f"preflight check failed to run: {type(exc).__name__}: {exc}"
            return None
        return " ".join(reason.split()) if reason else None

    async def _backoff(self, reason: str) -> None:
        cfg = self.config
        self._consecutive_failures += 1
        delay = min(
            cfg.backoff_max_s,
            cfg.backoff_initial_s * cfg.backoff_factor ** (self._consecutive_failures - 1),
        )
        self._set_state("backoff")
        self.last_reason = reason
        self._report.event("backoff", reason=reason, backoff_s=delay)
        await self._requests.sleep_or_wake(self._ops, delay)

    async def _start_and_supervise(self) -> Literal["ran", "retry", "fatal"]:
        self.argv = self._report.argv = self._plan.argv()
        started = self._driver.start(self.argv)
        if isinstance(started, StartRefused):
            if started.permanent:
                self._fatal(started.reason)
                return "fatal"
            self.last_reason = started.reason
            return "retry"
        self._starts.append(started.started_mono)
        self._serving = False
        self._requests.restart = None
        self._run = started
        self._set_state("running")
        self._report.event("started", pid=started.child.pid)
        self._finish(await self._driver.supervise(started))
        self._run = None  # not in a finally: a cancelled run is cleaned up by run()
        return "ran"

    def _finish(self, outcome: RunOutcome) -> None:
        """Judge how a run ended (failed or not, and why), record it and report it."""
        cfg = self.config
        run, remaining = outcome.run, outcome.remaining
        code, sig, fatal = outcome.exit_code, outcome.signal, outcome.fatal_kind
        ended_mono = self._ops.monotonic()
        if outcome.stop_reason is not None and outcome.stop_reason == self._requests.stop:
            failed = False
            reason = f"stopped: {outcome.stop_reason}"
        elif outcome.stop_reason is not None:
            failed = True
            reason = f"restarting: {outcome.stop_reason}"
        elif fatal is not None:
            failed = True
            reason = f"{describe_exit(code, sig)} after a fatal error in the log ({fatal})"
        else:
            failed = not (code == 0 and sig is None)
            reason = describe_exit(code, sig)
        if remaining:
            reason += f"; {len(remaining)} process(es) survived SIGKILL: {list(remaining)}"
        if ended_mono - run.started_mono >= cfg.backoff_reset_after_s:
            self._consecutive_failures = 0
        record = outcome.record(self.argv, self._ops.time(), reason, failed)
        self.runs.append(record)
        del self.runs[:-100]
        self.last_reason = reason
        self._report.event(
            "exited",
            pid=run.child.pid,
            exit_code=code,
            signal=sig,
            reason=reason,
            tree_pids=record.tree_pids,
            failed=failed,
        )

    async def _end_run_after_cancel(self) -> None:
        run = self._run
        if run is None:
            return
        self._requests.stop = self._requests.stop or "supervisor cancelled"
        self._finish(await self._driver.end_after_cancel(run, self._requests.stop))
        self._run = None
        self._set_state("exited")

    # -- plumbing ---------------------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self._requests.stop is not None

    def _stopping_run(self, pid: int, reason: str | None, requested: bool) -> None:
        """The run's tree is being ended: asked for (a stop, a restart), or what was left of it
        after vLLM's main process exited by itself (`requested` False)."""
        self._set_state("stopping")
        self._report.event("stopping" if requested else "ending_leftovers", pid=pid, reason=reason)

    def _set_state(self, state: State) -> None:
        self._state = state

    def _fatal(self, reason: str) -> None:
        self._set_state("fatal")
        self.last_reason = reason
        self._report.event("fatal", reason=reason)


def _rank(kind: str) -> int:
    return FAILURE_RANK.get(kind, len(FAILURE_RANK))
