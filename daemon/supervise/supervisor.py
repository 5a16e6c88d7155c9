"""Run vLLM, capture its output, restart it by policy, and stop it with nothing left behind.

How the daemon drives it (one asyncio loop, everything called from that loop's thread)::

    sup = Supervisor(config, on_event=state_queue.put_nowait)
    task = asyncio.create_task(sup.run())      # starts vLLM, supervises until stopped/fatal
    ...
    sup.note_ready()                 # /health answered 200: the start succeeded
    sup.note_fatal_failure("engine_init_failed")  # the log shows a fatal Failure this session
    sup.note_stall(stalled_for_s)    # loading made no progress for that long
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
its veto backs off and retries (so a patched model directory starts by itself), or is fatal
under ``never``.

vLLM runs in its own session (so its own process group); its stdout and stderr share one pipe,
which keeps their interleaving, and a pump thread copies it to the rotating log file. A second
thread waits for the exit. The process tree is re-scanned from /proc while it runs, so workers
that called ``setsid`` or outlived their parent are still found and killed at the end.

OS calls go through ``ProcessOps`` (procops.py); ``PosixOps`` is the real one. Settings live in
supervisor_config.py and are re-exported here.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
from collections.abc import Callable
from typing import Any, Literal

from loadwatch.daemon.sdnotify import child_environment
from loadwatch.daemon.sources.inputs import ProcessEvent, ProcessEventKind
from loadwatch.daemon.sources.proc.tree import ProcessTree
from loadwatch.daemon.supervise import leftovers
from loadwatch.daemon.supervise.config import (
    RestartPolicy,
    StallPolicy,
    SupervisorConfig,
    SupervisorConfigError,
    supervisor_config,
)
from loadwatch.daemon.supervise.leftovers import PidFile
from loadwatch.daemon.supervise.logsink import OutputPump, RotatingLog
from loadwatch.daemon.supervise.orphans import RUN_MARKER_ENV
from loadwatch.daemon.supervise.procops import ChildProcess, PosixOps, ProcessOps
from loadwatch.daemon.supervise.runs import RunRecord, State, StopResult, describe_exit
from loadwatch.daemon.supervise.tree_run import Run, TreeControl, split_returncode, watch_exit
from loadwatch.parsers.vllm.catalog import KIND_RANK

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


# A start that fails with these can never succeed by retrying.
_PERMANENT_SPAWN_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ENOEXEC})


# -- records --------------------------------------------------------------------------------------


class Supervisor:
    def __init__(
        self,
        config: SupervisorConfig,
        on_event: Callable[[ProcessEvent], None] | None = None,
        ops: ProcessOps | None = None,
        on_note: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.config = config
        self._on_event = on_event
        self._on_note = on_note  # lines of its own for the event log (a leftover tree stopped)
        self._pids = PidFile(config.pid_file) if config.pid_file is not None else None
        self._ops: ProcessOps = ops if ops is not None else PosixOps()
        self._state: State = "idle"
        self._wake: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        self._active = False
        self._stop_reason: str | None = None
        self._restart_reason: str | None = None
        self._run: Run | None = None
        self._serving = False
        self._starts: list[float] = []  # monotonic times of recent starts
        self._consecutive_failures = 0
        self._log: RotatingLog | None = None
        self.runs: list[RunRecord] = []
        self.last_reason: str | None = None
        self.callback_errors_total = 0
        # In every run's environment: a worker that escaped the tree still shows it in /proc.
        self.run_marker = secrets.token_hex(8)
        self._tree = TreeControl(self._ops, config, self._pids, self.run_marker)

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
        return self._log

    # -- what the daemon tells it ---------------------------------------------------------------

    def note_ready(self) -> None:
        """vLLM answered /health with 200: this start worked; reset the backoff."""
        if self._run is not None:
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
        self._poke()
        return True

    def note_stall(self, stalled_for_s: float) -> bool:
        """Loading has made no progress for ``stalled_for_s``. With stall policy ``restart`` and
        past the threshold, restart vLLM; True if that was decided. Ignored once serving."""
        cfg = self.config
        if cfg.stall_policy != "restart" or self._state != "running" or self._serving:
            return False
        if stalled_for_s < cfg.stall_restart_after_s:
            return False
        return self.request_restart(f"stalled for {stalled_for_s:.0f} s while loading")

    def request_restart(self, reason: str) -> bool:
        """End the current run and start again (as after a failure, with backoff)."""
        if self._run is None or self._state != "running" or self._stop_reason is not None:
            return False
        if self._restart_reason is None:
            self._restart_reason = reason
        self._poke()
        return True

    async def stop(self, reason: str = "stop requested") -> StopResult:
        """End vLLM and its whole tree and stay stopped. Safe to call in any state."""
        if self._stop_reason is None:
            self._stop_reason = reason
        self._poke()
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
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._ops.become_subreaper()
        try:
            if self._pids is not None:
                await leftovers.stop(self._pids, self._ops, self.config, self._note)
            await self._loop()
        finally:
            if self._run is not None:  # cancelled mid-run: leave nothing behind
                await self._end_run_after_cancel()
            if self._log is not None:
                self._log.close()
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
                self._set_state("exited")
                return
            crash_loop = self._crash_loop()
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
        self._emit("backoff", reason=reason, backoff_s=delay)
        await self._sleep_or_wake(delay)

    async def _sleep_or_wake(self, seconds: float) -> None:
        assert self._wake is not None
        if self._stop_reason is not None:
            return
        self._wake.clear()
        sleeper = asyncio.ensure_future(self._ops.sleep(seconds))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, waker):
                t.cancel()

    async def _start_and_supervise(self) -> Literal["ran", "retry", "fatal"]:
        cfg = self.config
        if self._log is None:
            try:
                self._log = RotatingLog(cfg.log_path, cfg.log_max_bytes, cfg.log_keep)
            except OSError as exc:
                self._fatal(f"cannot open log {cfg.log_path}: {exc.strerror or exc}")
                return "fatal"
        env = child_environment(os.environ if cfg.env is None else cfg.env)
        env[RUN_MARKER_ENV] = self.run_marker
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            self.last_reason = f"cannot start {cfg.argv[0]}: no pipe for its output: {exc.strerror}"
            return "retry"
        try:
            child = self._ops.spawn(cfg.argv, env, cfg.cwd, write_fd)
        except OSError as exc:
            os.close(read_fd)
            where = f" ({exc.filename})" if exc.filename and exc.filename != cfg.argv[0] else ""
            reason = f"cannot start {cfg.argv[0]}: {exc.strerror or exc}{where}"
            if exc.errno in _PERMANENT_SPAWN_ERRNOS:
                self._fatal(reason)
                return "fatal"
            self.last_reason = reason
            return "retry"
        finally:
            os.close(write_fd)
        self._starts.append(self._ops.monotonic())
        self._serving = False
        self._restart_reason = None
        loop = asyncio.get_running_loop()
        pump = OutputPump(read_fd, self._log.write, name=f"loadwatch-pump-{child.pid}")
        pump.start()
        run = Run(
            child=child,
            tree=ProcessTree(child.pid),
            exited=loop.create_future(),
            pump=pump,
            started_at=self._ops.time(),
            started_mono=self._ops.monotonic(),
        )
        self._run = run
        watch_exit(child, run.exited, loop, self._poke)
        self._set_state("running")
        self._emit("started", pid=child.pid)
        await self._supervise(run)
        self._run = None  # not in a finally: a cancelled run is cleaned up by run()
        return "ran"

    async def _supervise(self, run: Run) -> None:
        cfg = self.config
        assert self._wake is not None
        await self._tree.scan(run)
        remaining: list[int] = []
        ended_by_us = False
        while not run.exited.done():
            if self._stop_reason is not None or self._restart_reason is not None:
                run.stop_reason = self._stop_reason or self._restart_reason
                self._set_state("stopping")
                self._emit("stopping", pid=run.child.pid, reason=run.stop_reason)
                remaining = await self._tree.terminate(run)
                ended_by_us = True
                break
            self._wake.clear()
            waker = asyncio.ensure_future(self._wake.wait())
            ticker = asyncio.ensure_future(self._ops.sleep(cfg.tree_scan_interval_s))
            try:
                await asyncio.wait({waker, ticker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()
                ticker.cancel()
            await self._tree.scan(run)
        if not ended_by_us:
            # Workers can outlive the main process and keep GPU memory: end them too.
            leftovers = run.tree.alive(await self._tree.scan(run))
            if leftovers:
                self._set_state("stopping")
                self._emit(
                    "stopping",
                    pid=run.child.pid,
                    reason=f"vLLM exited; ending {len(leftovers)} leftover process(es)",
                )
                remaining = await self._tree.terminate(run)
        code, sig = split_returncode(run.exited.result() if run.exited.done() else None)
        if code == 0 and run.fatal_kind is None and run.stop_reason is None:
            await self._await_verdict(run)
        run.pump.stop()
        await asyncio.to_thread(run.pump.join, 2.0)
        self._finish(run, code, sig, tuple(remaining))

    async def _await_verdict(self, run: Run) -> None:
        """After a clean exit, give the log follower a moment to report a fatal failure."""
        cfg = self.config
        deadline = self._ops.monotonic() + cfg.exit_verdict_wait_s
        assert self._wake is not None
        while run.fatal_kind is None and self._stop_reason is None:
            left = deadline - self._ops.monotonic()
            if left <= 0:
                return
            await self._sleep_or_wake(left)

    def _note(self, name: str, **fields: Any) -> None:
        if self._on_note is not None:
            try:
                self._on_note(name, fields)
            except Exception:  # the consumer's bug must not orphan vLLM
                self.callback_errors_total += 1

    def _finish(
        self, run: Run, code: int | None, sig: int | None, remaining: tuple[int, ...]
    ) -> None:
        cfg = self.config
        ended_mono = self._ops.monotonic()
        if run.stop_reason is not None and run.stop_reason == self._stop_reason:
            failed = False
            reason = f"stopped: {run.stop_reason}"
        elif run.stop_reason is not None:
            failed = True
            reason = f"restarting: {run.stop_reason}"
        elif run.fatal_kind is not None:
            failed = True
            reason = f"{describe_exit(code, sig)} after a fatal error in the log ({run.fatal_kind})"
        else:
            failed = not (code == 0 and sig is None)
            reason = describe_exit(code, sig)
        if remaining:
            reason += f"; {len(remaining)} process(es) survived SIGKILL: {list(remaining)}"
        if ended_mono - run.started_mono >= cfg.backoff_reset_after_s:
            self._consecutive_failures = 0
        record = RunRecord(
            pid=run.child.pid,
            argv=cfg.argv,
            started_at=run.started_at,
            ended_at=self._ops.time(),
            exit_code=code,
            signal=sig,
            reason=reason,
            failed=failed,
            tree_pids=run.tree.pids,
            remaining_pids=remaining,
        )
        self.runs.append(record)
        del self.runs[:-100]
        if self._pids is not None:
            if remaining:  # a later supervisor tries again
                members = run.tree.members
                self._pids.save(run.child.pid, {p: members[p] for p in remaining}, self.run_marker)
            else:
                self._pids.clear()
        self.last_reason = reason
        self._emit(
            "exited",
            pid=run.child.pid,
            exit_code=code,
            signal=sig,
            reason=reason,
            tree_pids=record.tree_pids,
        )

    async def _end_run_after_cancel(self) -> None:
        run = self._run
        if run is None:
            return
        self._stop_reason = self._stop_reason or "supervisor cancelled"
        run.stop_reason = self._stop_reason
        try:
            remaining = await asyncio.shield(self._tree.terminate(run))
        except asyncio.CancelledError:
            remaining = run.tree.alive(self._ops.process_table())
        run.pump.stop()
        code, sig = split_returncode(run.exited.result() if run.exited.done() else None)
        self._finish(run, code, sig, tuple(remaining))
        self._run = None
        self._set_state("exited")

    # -- plumbing ---------------------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self._stop_reason is not None

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _set_state(self, state: State) -> None:
        self._state = state

    def _fatal(self, reason: str) -> None:
        self._set_state("fatal")
        self.last_reason = reason
        self._emit("fatal", reason=reason)

    def _emit(
        self,
        kind: ProcessEventKind,
        *,
        pid: int | None = None,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str | None = None,
        backoff_s: float | None = None,
        tree_pids: tuple[int, ...] = (),
    ) -> None:
        if self._on_event is None:
            return
        event = ProcessEvent(
            kind=kind,
            ts=self._ops.time(),
            pid=pid,
            argv=self.config.argv,
            exit_code=exit_code,
            signal=signal,
            reason=reason,
            backoff_s=backoff_s,
            tree_pids=tree_pids,
        )
        try:
            self._on_event(event)
        except Exception:  # the consumer's bug must not orphan vLLM
            self.callback_errors_total += 1


def _rank(kind: str) -> int:
    return KIND_RANK.get(kind, len(KIND_RANK))
