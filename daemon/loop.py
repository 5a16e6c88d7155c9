"""The daemon: one asyncio loop owns the load state; sources feed it, exporters read snapshots.

Tasks on the loop (tasks.py):
- the log: the log source (sources/log/source.py) hands runs of events tagged live or replay
  and what the event log still needs of them; `take_log` applies them to `LoadState` and writes
  their effects through the event feed (eventfeed.py), the event log's one feeder;
- the GPUs: a guarded poll every `[gpu] poll_interval_s`;
- a 1 s tick: stall checks, sd_notify STATUS=, publishing;
- in supervise mode: the supervisor, the `/health` prober and the /proc I/O sampler.
The functions after `Daemon` wire each task to the parts of the daemon it uses (its state as it
is now, `apply`, the event feed, the publisher, the clock): no task holds the daemon. After each
batch the loop publishes an immutable `Published` bundle (publish.py); HTTP threads read only
that.

Restart: the log source alone decides what is a replay (its checkpoint, its emit mark); the
loop applies what it is handed. Time: a live input happens at the daemon's clock; a replayed
log event at its own stamp moved onto that clock by the run's `stamp_offset_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any

from loadwatch.daemon import tasks
from loadwatch.daemon.aftercare import ModelDirs, OrphanChecks
from loadwatch.daemon.build import compiled_modules
from loadwatch.daemon.config import Config
from loadwatch.daemon.eventfeed import EventFeed, RunEffects
from loadwatch.daemon.history import StartHistory
from loadwatch.daemon.judgements import Judgements
from loadwatch.daemon.parts import open_log_source, state_config
from loadwatch.daemon.publish import VERSION, Publisher, bundle, status_line, supervisor_stats
from loadwatch.daemon.sdnotify import SdNotifier
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource, NullGpuSource
from loadwatch.daemon.sources.inputs import IoReader, ProcessEvent
from loadwatch.daemon.sources.log.inputs import LogInput
from loadwatch.daemon.sources.log.source import LogSource, Notice, Run
from loadwatch.daemon.state.failures import session_kind
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import Published
from loadwatch.daemon.state.runfold import bulk_parts
from loadwatch.daemon.state.snapshot import Snapshot, Transition
from loadwatch.daemon.tasks import Pace
from loadwatch.daemon.vllm_watch import VllmWatch
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import Event
from loadwatch.parsers.scan import NATIVE
from loadwatch.parsers.vllm.argv_secrets import Redactor

__all__ = ["VERSION", "Daemon", "status_line"]


class Daemon:
    def __init__(
        self,
        cfg: Config,
        *,
        eventlog: EventLog,
        gpu: GuardedGpuSource | NullGpuSource,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        notifier: SdNotifier | None = None,
        redactor: Redactor | None = None,
        supervisor_factory: Callable[[Daemon], Any] | None = None,
        io_reader: IoReader | None = None,
        log_input: LogInput | None = None,
    ) -> None:
        self.cfg = cfg
        self._log_input = log_input  # opened (app.py); None: the config's, opened by open_log
        self.io_reader = io_reader
        self.clock = clock
        self._sleep_fn = sleep
        self.eventlog = eventlog  # (SIGHUP reopens it; vLLM's lines pass; events go by `feed`)
        self.feed = EventFeed(eventlog, redactor)
        self.gpu = gpu
        self.notifier = notifier or SdNotifier({})
        self.redactor = self.feed.redactor
        self.started_at = clock()
        self.starts = StartHistory(cfg.state_dir, self.feed.problem)  # what earlier starts took
        self.state = LoadState(config=replace(state_config(cfg), history=self.starts.load()))
        self.publisher = Publisher(self.bundle, self.feed.problem)
        self.on_publish = self.publisher.hooks
        self.stop_event = asyncio.Event()
        self.pace = Pace(lambda: self.busy, sleep, self.stop_event.is_set)
        self.supervisor: Any = None
        self._supervisor_factory = supervisor_factory
        self.log: LogSource | None = None
        self.judgements = Judgements()  # live ones in force, kept across a restart
        self.models = ModelDirs(cfg, self.feed, self.apply)
        self.orphans = OrphanChecks(
            gpu.poll_async, feed=self.feed, apply=self.apply, publish=self.publish, clock=clock
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._log_behind = False  # a read stopped at its byte cap: the log holds more

    @property
    def published(self) -> Published | None:
        return self.publisher.published

    def publish(self) -> None:
        self.publisher.now()

    def bundle(self) -> Published:
        """What the exporters read: the state now, with the sources' health."""
        now, sup = self.clock(), self.supervisor
        stats = None if sup is None else supervisor_stats(str(sup.state), sup.pid, self.state, now)
        return bundle(
            self.state,
            now,
            started_at=self.started_at,
            log=self.log,
            gpu=self.gpu.health() if isinstance(self.gpu, GuardedGpuSource) else None,
            supervisor=stats,
            load_budget_s=self.cfg.forecast.load_budget_s,
        )

    async def sleep(self, seconds: float) -> None:
        """Sleep, or less when asked to stop; the injected sleep when one was given."""
        if self._sleep_fn is not None:
            await self._sleep_fn(seconds)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)

    # -- applying inputs --------------------------------------------------------------------

    def apply(self, item: Any) -> None:
        """A live input other than the log's (GPU readings, ticks, probes, process events)."""
        before = self.state
        self.state = before.apply(item, self.clock())
        if self.state.transitions:
            self.publisher.urgent()
            self.pace.check()
        made_before = self.judgements.again(self.state.transitions)
        for t in self.state.transitions:
            if made_before:  # (a daemon before this one wrote it: judgements.py)
                t = replace(t, replay=True)
            self.feed.transition(t)
            tell_supervisor(self.supervisor, t)
            self.state = self.starts.learn(self.state, t)
        self._keep_judgements()
        tell_failing(self.supervisor, before, self.state)

    def take_log(self, items: Sequence[Run | Notice]) -> None:
        """Apply what the log source handed over, in order; write its effects once; publish
        (a transition, a change of the source's health or the end of a backlog at once, or
        within `BACKLOG_PUBLISH_S` while more of a backlog waits; counters within the publishing
        interval)."""
        source = self.log
        assert source is not None
        # The last read of a backlog (a restart's catch-up, a burst): the board, behind the log
        # while it was read, is the log's state now, which a reader wants at once.
        caught_up = self._log_behind and not source.backlog
        self._log_behind = source.backlog
        if caught_up:
            self.publisher.urgent()
        for item in items:
            if isinstance(item, Notice):
                self.feed.notice(item)
                self.publisher.urgent()  # (what reading says of itself: its health, at once)
            else:
                self._apply_run(source, item)
        settled = source.settle()
        for notice in settled:
            self.feed.notice(notice)
            self.publisher.urgent()
        if items or settled or caught_up:
            self.publisher.changed(backlog=source.backlog)

    def _apply_run(self, source: LogSource, run: Run) -> None:
        if not run.events:
            return  # (most reads of a serving log: nothing to fold, nothing to write)
        if not run.replay:
            self.judgements.logged()
        source.begin(run, self.feed.position())
        with self.feed.effects(run) as out:
            for part in bulk_parts(run.events):
                self._fold_part(source, run, out, part)
        source.end(run, self.feed.position())

    def _fold_part(self, source: LogSource, run: Run, out: RunEffects, part: list[Event]) -> None:
        """Fold a part of a run in one `apply_run` and write its effects in record order: the
        transitions a record caused before that record's event, as one event at a time would."""
        before = self.state
        after = before.apply_run(
            part, self.clock(), replay=run.replay, stamp_offset_s=run.stamp_offset_s
        )
        self.state = after
        if run.emit == "new":
            tell_failing(self.supervisor, before, after)
        transitions = after.transitions
        out.part(part, transitions, lambda t, at: self._effect(source, out, run, t, at))
        begun = any(t.kind == "session_started" for t in transitions)
        self.models.after_fold(self.state, self.clock(), live=not run.replay, begun=begun)

    def _effect(self, source: LogSource, out: RunEffects, run: Run, t: Transition, at: int) -> None:
        if t.kind == "session_started":
            source.session_began(run, at)  # (the record that opened it: a restart starts there)
        self.publisher.urgent()
        self.pace.check()
        self.judgements.note((t,), replay=run.replay)
        self._keep_judgements()
        out.transition(t, at)
        if run.emit == "new":
            tell_supervisor(self.supervisor, t)
        if not run.replay:
            self.state = self.starts.learn(self.state, t)

    def on_process_event(self, ev: ProcessEvent) -> None:
        """The supervisor's callback (on the loop's thread)."""
        if ev.kind == "exited" and self.log is not None:
            self.take_log(self.log.writer_exited())  # the crash's last lines before its exit
        self.apply(ev)
        self.feed.line(
            f"vllm.{ev.kind}",
            pid=ev.pid,
            exit_code=ev.exit_code,
            signal=ev.signal,
            reason=ev.reason,
            backoff_s=ev.backoff_s,
            argv=self.redactor.argv(ev.argv) if ev.argv else None,
            # Every pid of the run's tree, so anyone can check from the log that none is left.
            tree_pids=list(ev.tree_pids) if ev.tree_pids else None,
        )
        if ev.kind == "started":
            self.models.load(ev.argv)
        elif ev.kind == "exited" and ev.tree_pids:
            self.orphans.start(ev.tree_pids, run_marker(self.supervisor))
        self.publish()

    # -- the log ----------------------------------------------------------------------------

    def _keep_judgements(self) -> None:
        if self.log is not None:
            self.log.keep("judged", self.judgements.keys())

    def open_log(self) -> LogSource | None:
        self.log = open_log_source(self.cfg, self.clock, self._log_input)
        if self.log is not None:
            self.judgements = Judgements(self.log.kept("judged"))
        return self.log

    # -- state views ------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A load is in progress, or a failure held for its echoes: ticks (which decide it) and
        GPU polls run at full pace."""
        s = self.state.session
        phases = ("starting", "loading_weights", "post_load", "stalled")
        return s is not None and (s.phase in phases or s.failing is not None)

    def snapshot(self) -> Snapshot:
        """The state now: the published bundle's when nothing changed since, else made anew."""
        pub = self.published
        if pub is None or self.publisher.behind:
            return self.state.snapshot(self.clock())
        return pub.snapshot(self.clock())

    # -- lifecycle --------------------------------------------------------------------------

    def loop_call(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the daemon's loop, from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn)

    async def run(self) -> int:
        """Run until `stop_event` is set; returns the process exit code."""
        self._loop = asyncio.get_running_loop()
        self.models.load()
        source = self.open_log()
        self.publish()
        made = [
            asyncio.create_task(tick(self), name="tick"),
            asyncio.create_task(poll_gpus(self), name="gpu"),
        ]
        if source is not None:
            follow = tasks.follow_log(source, self.take_log, self.stop_event)
            made.append(asyncio.create_task(follow, name="follow"))
        sup_task: asyncio.Task[Any] | None = None
        if self._supervisor_factory is not None:
            # Know the GPUs before vLLM starts: the preflight needs their compute capability.
            await first_gpu_poll(self)
            self.supervisor = self._supervisor_factory(self)
            sup_task = asyncio.create_task(self.supervisor.run(), name="supervisor")
            made.append(asyncio.create_task(sample_io(self, self._supervised_pids), name="io"))
        elif source is not None:
            io = sample_io(self, lambda: logged_pids(self))
            made.append(asyncio.create_task(io, name="io"))
        made.append(asyncio.create_task(vllm_watch(self).run(), name="health"))
        if self.notifier.watchdog_interval_s:
            made.append(asyncio.create_task(self.notifier.run_watchdog(), name="watchdog"))
        self.notifier.ready(status_line(self.snapshot()))
        self.feed.line(
            "daemon.started",
            version=VERSION,
            pid=os.getpid(),
            log=str(self.cfg.log.path or self.log.path) if self.log is not None else None,
            supervise=self.cfg.supervise,
            scanner="c" if NATIVE else "python",  # the log's candidate search (parsers/_scan.c)
            compiled=len(compiled_modules()),  # modules of the record path built by mypyc
        )
        stopper = asyncio.create_task(self.stop_event.wait(), name="stop")
        pending = {*made, stopper}
        if sup_task is not None:
            pending.add(sup_task)
        # Run until asked to stop; a source task that dies is reported and the rest go on.
        while not self.stop_event.is_set():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is stopper or task.cancelled():
                    continue
                exc = task.exception()
                if exc is not None:
                    self.feed.problem(f"{task.get_name()} stopped: {exc!r}")
                elif task is sup_task:
                    self.feed.line("vllm.supervisor_done", state=str(self.supervisor.state))
        self.notifier.stopping("stopping")
        return await self._shutdown(pending)

    def _supervised_pids(self) -> tuple[int, ...]:
        pid = self.supervisor.pid if self.supervisor is not None else None
        return (pid,) if pid is not None else ()

    async def _shutdown(self, pending: set[asyncio.Task[Any]]) -> int:
        if self.supervisor is not None:
            result = await self.supervisor.stop("loadwatch is stopping")
            if result.tree_pids:
                self.orphans.start(result.tree_pids, run_marker(self.supervisor))
            await self.orphans.finish()
            self.feed.line(
                "vllm.stopped",
                remaining=list(result.remaining_pids),
                tree_pids=list(result.tree_pids),
            )
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.log is not None:
            self.log.close()
        self.publish()
        self.feed.line("daemon.stopped")
        return 0


# -- the tasks wired to the daemon: each is handed the few parts it uses, never the daemon ----


def tick(d: Daemon) -> Coroutine[Any, Any, None]:
    def on_stall(stalled_s: float) -> None:
        """While the load is stalled, the supervisor hears how long for (its policy decides)."""
        if d.supervisor is not None:
            s = d.state.session
            steps = s.timeline.steps if s is not None else ()
            d.supervisor.note_stall(stalled_s, steps[-1].phase if steps else None)

    return tasks.tick(
        apply=d.apply,
        state=lambda: d.state,
        snapshot=d.snapshot,
        feed=d.feed,
        publisher=d.publisher,
        notifier=d.notifier,
        on_stall=on_stall,
        clock=d.clock,
        pace=d.pace,
    )


def poll_gpus(d: Daemon) -> Coroutine[Any, Any, None]:
    return tasks.poll_gpus(
        d.gpu,
        d.cfg.gpu.poll_interval_s,
        apply=d.apply,
        feed=d.feed,
        publisher=d.publisher,
        pace=d.pace,
    )


def sample_io(d: Daemon, pids_of: Callable[[], Sequence[int]]) -> Coroutine[Any, Any, None]:
    from loadwatch.daemon.sources.proc.io_counters import ProcIoReader

    reader = d.io_reader or ProcIoReader(clock=d.clock)
    return tasks.sample_io(
        reader, pids_of, state=lambda: d.state, apply=d.apply, pace=d.pace, sleep=d.sleep
    )


def vllm_watch(d: Daemon, proc_root: str = "/proc", kind: type[VllmWatch] = VllmWatch) -> VllmWatch:
    """The /health prober and process watch (`kind`: the class, or a subclass of it)."""
    return kind(
        d.cfg,
        state=lambda: d.state,
        apply=d.apply,
        feed=d.feed,
        publisher=d.publisher,
        clock=d.clock,
        sleep=d.sleep,
        stop_event=d.stop_event,
        proc_root=proc_root,
    )


def run_marker(supervisor: Any) -> str | None:
    """The supervisor's mark in its runs' environment (supervise/orphans.py); None without."""
    marker = getattr(supervisor, "run_marker", None)
    return marker if isinstance(marker, str) else None


def logged_pids(d: Daemon) -> tuple[int, ...]:
    """Watch mode: the pids of the log's prefixes that are vLLM processes here (a handed
    reader, a simulated one, takes them all)."""
    if d.io_reader is not None:
        return d.state.node_pids
    from loadwatch.daemon.sources.proc.io_counters import vllm_processes
    from loadwatch.daemon.sources.proc.logged_process import expected_user

    vllm = d.cfg.vllm
    user = expected_user(vllm.user if vllm is not None else None, d.cfg.log.path)
    return vllm_processes(d.state.node_pids, user)


def tell_supervisor(supervisor: Any, t: Transition) -> None:
    """What the supervisor hears of a transition: a fatal failure (not one decided on records
    read back: its current run did not log them), readiness."""
    if supervisor is None or t.replay:
        return
    if t.kind == "failure" and t.fatal:
        supervisor.note_fatal_failure(t.failure_kind or "other")
    elif t.kind == "phase" and t.phase_to == "ready":
        supervisor.note_ready()


def tell_failing(supervisor: Any, before: LoadState, after: LoadState) -> None:
    """A fatal failure held for its echoes (the state's `failing`): the supervisor hears of it
    at once, and again when a more telling root cause is read; its verdict on an exit with
    code 0 does not wait for the hold."""
    s = after.session
    if supervisor is None or s is None or s.failing is None or s.failing.replayed:
        return
    kind = session_kind(s.failures)
    old = before.session
    if kind is None:
        return
    if old is None or old.id != s.id or old.failing is None or session_kind(old.failures) != kind:
        supervisor.note_fatal_failure(kind)


async def first_gpu_poll(d: Daemon, timeout_s: float = 5.0) -> None:
    """Until the first GPU reading is folded (or `timeout_s`, or a stop)."""
    end = d.clock() + timeout_s
    while d.state.gpu_source_up is None and d.clock() < end and not d.stop_event.is_set():
        await asyncio.sleep(0.02)
