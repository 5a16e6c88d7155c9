"""The mechanism of one start of vLLM, for the supervisor's policy to drive.

``RunDriver.start`` spawns vLLM in its own session with stdout and stderr on one pipe (which keeps
their interleaving), a pump thread copying that pipe to the rotating log (and, with ``[vllm]
output = "file+stdout"``, its whole lines to loadwatch's stdout), and a thread waiting for the
exit. ``RunDriver.supervise`` then waits for the exit, a stop or a restart request (``Requests``),
re-scanning the tree from /proc meanwhile so that workers that called ``setsid`` or outlived their
parent are still found; it ends the tree when asked or when members outlive the main process, and
after a clean exit waits up to ``exit_verdict_wait_s`` for a fatal failure in the log (the log
follower may lag). ``RunDriver.end_after_cancel`` ends the tree of a run whose supervisor was
cancelled. Each hands back a ``RunOutcome``; what it means (failed or not, restart or not) is the
policy's decision, in supervisor.py.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from loadwatch.daemon.sdnotify import child_environment
from loadwatch.daemon.sources.proc.tree import ProcessTree
from loadwatch.daemon.supervise.config import SupervisorConfig
from loadwatch.daemon.supervise.logsink import LineCopy, OutputPump, RotatingLog
from loadwatch.daemon.supervise.orphans import RUN_MARKER_ENV
from loadwatch.daemon.supervise.procops import ChildProcess, ProcessOps
from loadwatch.daemon.supervise.runs import RunRecord
from loadwatch.daemon.supervise.tree_run import Run, TreeControl, split_returncode, watch_exit

# A start that fails with these can never succeed by retrying.
_PERMANENT_SPAWN_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOTDIR, errno.ENOEXEC})


@dataclass
class Requests:
    """What the daemon asked of the supervisor, read by the run it drives: ``stop`` (end it and
    stay stopped) or ``restart`` (end this run, start again). ``wake`` cuts any wait short; it
    exists while the supervisor runs."""

    stop: str | None = None
    restart: str | None = None
    wake: asyncio.Event | None = None

    def poke(self) -> None:
        if self.wake is not None:
            self.wake.set()

    async def sleep_or_wake(self, ops: ProcessOps, seconds: float) -> None:
        """Sleep ``seconds`` unless poked first; not at all once a stop was asked."""
        assert self.wake is not None
        if self.stop is not None:
            return
        self.wake.clear()
        sleeper = asyncio.ensure_future(ops.sleep(seconds))
        waker = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (sleeper, waker):
                t.cancel()


@dataclass(frozen=True, slots=True)
class StartRefused:
    """vLLM could not be started; ``permanent`` when retrying cannot help."""

    reason: str
    permanent: bool


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How one run ended, for the policy to judge."""

    run: Run
    exit_code: int | None
    signal: int | None
    remaining: tuple[int, ...]  # tree members still alive after SIGKILL
    stop_reason: str | None  # why it was ended (stop, restart); None if it exited by itself
    fatal_kind: str | None  # the fatal failure the log showed, if any

    def record(
        self, argv: tuple[str, ...], ended_at: float, reason: str, failed: bool
    ) -> RunRecord:
        run = self.run
        return RunRecord(
            pid=run.child.pid,
            argv=argv,
            started_at=run.started_at,
            ended_at=ended_at,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=reason,
            failed=failed,
            tree_pids=run.tree.pids,
            remaining_pids=self.remaining,
            stalled_in=run.stalled_in,
        )


class RunDriver:
    """Spawns, watches and ends one run at a time with the supervisor's OS calls and settings;
    ``on_stopping(pid, reason)`` is told when it starts ending a tree."""

    def __init__(
        self,
        ops: ProcessOps,
        config: SupervisorConfig,
        tree: TreeControl,
        requests: Requests,
        on_stopping: Callable[[int, str | None, bool], None],
    ) -> None:
        self._ops = ops
        self.config = config
        self._tree = tree
        self._requests = requests
        self._on_stopping = on_stopping
        self.log: RotatingLog | None = None

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def start(self, argv: tuple[str, ...]) -> Run | StartRefused:
        """Spawn vLLM (`argv`) with its output piped to the log and its exit watched."""
        cfg = self.config
        if self.log is None:
            try:
                self.log = RotatingLog(cfg.log_path, cfg.log_max_bytes, cfg.log_keep)
            except OSError as exc:
                return StartRefused(f"cannot open log {cfg.log_path}: {exc.strerror or exc}", True)
        spawned = self._spawn(argv)
        if isinstance(spawned, StartRefused):
            return spawned
        child, read_fd = spawned
        loop = asyncio.get_running_loop()
        copy = LineCopy(cfg.output_copy) if cfg.output_copy is not None else None
        pump = OutputPump(read_fd, self.log.write, name=f"loadwatch-pump-{child.pid}", copy=copy)
        pump.start()
        run = Run(
            child=child,
            tree=ProcessTree(child.pid),
            exited=loop.create_future(),
            pump=pump,
            started_at=self._ops.time(),
            started_mono=self._ops.monotonic(),
        )
        watch_exit(child, run.exited, loop, self._requests.poke)
        return run

    def _spawn(self, argv: tuple[str, ...]) -> tuple[ChildProcess, int] | StartRefused:
        cfg = self.config
        env = child_environment(os.environ if cfg.env is None else cfg.env)
        env[RUN_MARKER_ENV] = self._tree.run_marker
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:
            reason = f"cannot start {argv[0]}: no pipe for its output: {exc.strerror}"
            return StartRefused(reason, False)
        try:
            child = self._ops.spawn(argv, env, cfg.cwd, write_fd)
        except OSError as exc:
            os.close(read_fd)
            where = f" ({exc.filename})" if exc.filename and exc.filename != argv[0] else ""
            reason = f"cannot start {argv[0]}: {exc.strerror or exc}{where}"
            return StartRefused(reason, exc.errno in _PERMANENT_SPAWN_ERRNOS)
        finally:
            os.close(write_fd)
        return child, read_fd

    async def supervise(self, run: Run) -> RunOutcome:
        """Until the run ends: by itself, or by a stop or restart request."""
        cfg = self.config
        requests = self._requests
        assert requests.wake is not None
        await self._tree.scan(run)
        remaining: list[int] = []
        ended_by_us = False
        while not run.exited.done():
            if requests.stop is not None or requests.restart is not None:
                run.stop_reason = requests.stop or requests.restart
                self._on_stopping(run.child.pid, run.stop_reason, True)
                remaining = await self._tree.terminate(run)
                ended_by_us = True
                break
            requests.wake.clear()
            waker = asyncio.ensure_future(requests.wake.wait())
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
                self._on_stopping(
                    run.child.pid,
                    f"vLLM exited; ending {len(leftovers)} leftover process(es)",
                    False,  # not asked for: the exit decides how the session ended
                )
                remaining = await self._tree.terminate(run)
        code, sig = split_returncode(run.exited.result() if run.exited.done() else None)
        if code == 0 and run.fatal_kind is None and run.stop_reason is None:
            await self._await_verdict(run)
        run.pump.stop()
        await asyncio.to_thread(run.pump.join, 2.0)
        return self._outcome(run, code, sig, remaining)

    async def _await_verdict(self, run: Run) -> None:
        """After a clean exit, give the log follower a moment to report a fatal failure."""
        deadline = self._ops.monotonic() + self.config.exit_verdict_wait_s
        while run.fatal_kind is None and self._requests.stop is None:
            left = deadline - self._ops.monotonic()
            if left <= 0:
                return
            await self._requests.sleep_or_wake(self._ops, left)

    async def end_after_cancel(self, run: Run, reason: str) -> RunOutcome:
        """The supervisor was cancelled mid-run: end the tree all the same."""
        run.stop_reason = reason
        try:
            remaining = await asyncio.shield(self._tree.terminate(run))
        except asyncio.CancelledError:
            remaining = run.tree.alive(self._ops.process_table())
        run.pump.stop()
        code, sig = split_returncode(run.exited.result() if run.exited.done() else None)
        return self._outcome(run, code, sig, remaining)

    def _outcome(self, run: Run, code: int | None, sig: int | None, left: list[int]) -> RunOutcome:
        self._tree.settle(run, left)
        return RunOutcome(run, code, sig, tuple(left), run.stop_reason, run.fatal_kind)
