"""The daemon: one asyncio loop owns the load state; sources feed it, exporters read snapshots.

Tasks on the loop:
- the log: follower -> chunk scanner -> events -> `LoadState.apply`, with checkpoints;
- the GPUs: a guarded poll every `[gpu] poll_interval_s`;
- a 1 s tick: stall checks, sd_notify STATUS=, publishing;
- in supervise mode: the supervisor, the `/health` prober and the /proc I/O sampler.
After each batch the loop publishes an immutable `Published` bundle; HTTP threads read only that.

Restart: the follower resumes from its checkpoint, whose `extra` carries where the current vLLM
session began. The loop seeks there and re-reads up to the checkpoint to rebuild the session's
state (those events are not written to the event log again; transitions are marked `replay`),
then goes on live. Records read after the checkpoint by a daemon that was then killed had their
events written already: the emit mark (emitmark.py) says up to where, and those are re-read as a
replay too. Of a run of records the kill cut short, the events the event log file lacks are
written as usual and the others not again (with no file to read back, all are written again,
marked `replay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import Config
from loadwatch.daemon.sdnotify import SdNotifier
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource, NullGpuSource
from loadwatch.daemon.sources.inputs import (
    GpuReading,
    IoReader,
    IoSample,
    ModelInfo,
    ProcessEvent,
    Tick,
)
from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.daemon.sources.log.container import ContainerLogDecoder, resolve_format
from loadwatch.daemon.sources.log.emitmark import EmitMark, Identity, Mark, identity
from loadwatch.daemon.sources.log.emitmark import written as written_events
from loadwatch.daemon.sources.log.follower import FollowerError, LogFollower, Position
from loadwatch.daemon.sources.model.model_info import model_named_in_log, read_model_dir
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import LogHealth, Published, SupervisorStats, Totals
from loadwatch.daemon.state.session import StateConfig
from loadwatch.daemon.state.snapshot import Snapshot, Transition
from loadwatch.daemon.supervise.orphans import ORPHAN_GRACE_S, settle_orphans
from loadwatch.daemon.vllm_watch import VllmWatch
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import ChunkScanner, Event
from loadwatch.parsers.grammar import load as load_grammar
from loadwatch.parsers.scan import NATIVE
from loadwatch.parsers.vllm.argv_secrets import Redactor

log = logging.getLogger("loadwatch")

VERSION = "0.1.0"
TICK_S = 1.0  # while a load is in flight: stall checks, STATUS=, publishing
IDLE_TICK_S = 5.0  # tick and GPU poll with nothing loading (no session, ready, failed, stopped)
IO_SAMPLE_S = 1.0
QUIET_CLOSE_S = 2.0  # a traceback open this long with nothing more logged is complete
PUBLISH_MIN_S = 0.1  # at most this often while the log streams in


@dataclass
class _Retired:
    """Counts of sessions the state no longer details, so lifetime totals stay monotonic."""

    warnings: Counter[str]
    failures: Counter[str]
    stalls: int = 0


class Daemon:
    def __init__(
        self,
        cfg: Config,
        *,
        eventlog: EventLog,
        gpu: GuardedGpuSource | NullGpuSource,
        clock: Callable[[], float] = time.time,
        notifier: SdNotifier | None = None,
        redactor: Redactor | None = None,
        supervisor_factory: Callable[[Daemon], Any] | None = None,
        io_reader: IoReader | None = None,
    ) -> None:
        self.cfg = cfg
        self._io_reader = io_reader
        self.clock = clock
        self.eventlog = eventlog
        self.gpu = gpu
        self.notifier = notifier or SdNotifier({})
        self.redactor = redactor or Redactor()
        self.started_at = clock()
        self.state = LoadState(config=self._state_config())
        self.published: Published | None = None
        self.stop_event = asyncio.Event()
        self.supervisor: Any = None
        self._supervisor_factory = supervisor_factory
        self._follower: LogFollower | None = None
        self._decoder: ContainerLogDecoder | None = None
        grammar = load_grammar()  # the log grammar (parsers/grammar.py): vLLM's
        self._scanner = ChunkScanner(grammar.new_stream(clock()), grammar=grammar)
        self._events: Counter[str] = Counter()
        self._xids: Counter[tuple[int, str | None, int]] = Counter()
        self._retired = _Retired(Counter(), Counter())
        self._session_start: dict[str, Any] | None = None
        self._replay_until: Position | None = None
        self._marks: EmitMark | None = None
        self._mark: Mark | None = None  # the last run's emit mark, until reading passes it
        self._written: set[Identity] | None = None  # what the event log has of the mark's run
        self._mark_ahead = False  # the mark's file comes after the one reading resumes in
        self._until_seen = False  # a record of the checkpoint's file was read in the replay
        self._start_told = False  # a restart that could not resume where it stopped was reported
        # Until the log is read up to its end once, records are a backlog: not read as they
        # were written, so placed at their own stamps (the state's replay timing).
        self._caught_up = False
        self._gpu_ccs: dict[int, tuple[int, int]] = {}
        self._last_reading: GpuReading | None = None
        self._last_status = ""
        self._orphans: int | None = None
        self.orphan_grace_s = ORPHAN_GRACE_S
        self._orphan_checks: dict[tuple[int, ...], asyncio.Task[None]] = {}  # by tree, in flight
        self._last_chunk: tuple[float, str | None] = (0.0, None)  # (monotonic, file) last read
        self._model_tried: str | None = None  # the model path of the log last looked for here
        self._health_up: bool | None = None
        self._model_dir_said: str | None = None  # the configured model dir's problem, said once
        self._log_error_logged: str | None = None
        self._eventlog_error: str | None = None
        self._vllm_exits: Counter[str] = Counter()  # vLLM runs ended, by outcome
        self._vllm_last_ok: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._published_mono = float("-inf")
        self.on_publish: list[Callable[[Published], None]] = []  # e.g. render /metrics ahead
        self._hook_error: str | None = None  # the last failure of an on_publish hook, said once
        self._publish_pending = False

    # -- configuration ----------------------------------------------------------------------

    def _state_config(self) -> StateConfig:
        f = self.cfg.forecast
        return StateConfig(
            max_sessions=self.cfg.sessions_kept,
            stall_k=f.stall_factor,
            stall_floor_s=f.stall_floor_s,
            require_completion=self.cfg.vllm is not None and self.cfg.vllm.servable,
        )

    # -- applying inputs --------------------------------------------------------------------

    def apply(
        self, item: Any, *, replay: bool = False, again: bool = False, backlog: bool = False
    ) -> None:
        before = self.state
        self.state = before.apply(item, self.clock(), replay=replay or backlog)
        transitions = self.state.transitions
        if not transitions:
            return
        for t in transitions:
            if t.kind == "session_started":
                self._retire(before)
            self._transition(t, replay, again)

    def _retire(self, before: LoadState) -> None:
        snap = before.snapshot(self.clock())
        s = snap.session
        if s is None:
            return
        for w in s.warnings:
            self._retired.warnings[w.code] += w.count
        if s.failure_kind is not None:
            self._retired.failures[s.failure_kind] += 1
        self._retired.stalls += s.stall.stalls_total

    def _transition(self, t: Transition, replay: bool, again: bool = False) -> None:
        fields = t.to_dict()
        kind = fields.pop("transition")
        if again:
            self._emit_again(f"transition.{kind}", fields)
        else:
            if replay:
                fields["replay"] = True
            self.eventlog.emit(f"transition.{kind}", **fields)
        if replay or self.supervisor is None:
            return
        if kind == "failure" and t.fatal:
            self.supervisor.note_fatal_failure(t.failure_kind or "other")
        elif kind == "phase" and t.phase_to == "ready":
            self.supervisor.note_ready()

    def on_process_event(self, ev: ProcessEvent) -> None:
        """The supervisor's callback (on the loop's thread)."""
        runs = self.supervisor.runs if self.supervisor is not None else None
        if ev.kind == "exited" and runs:
            # Tallied here: the supervisor keeps only its last runs, and counters never go back.
            run = runs[-1]
            outcome = "signal" if run.signal is not None else ("failed" if run.failed else "clean")
            self._vllm_exits[outcome] += 1
            self._vllm_last_ok = run.started_at
        self.apply(ev)
        self.eventlog.emit(
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
            self._load_model(ev.argv)
        elif ev.kind == "exited" and ev.tree_pids:
            self._start_orphan_check(ev.tree_pids)
        self.publish()

    def _load_model(self, argv: Iterable[str] = ()) -> None:
        from loadwatch.parsers.vllm import argv as vllm_argv

        model_dir = self.cfg.model.dir
        if model_dir is None and argv:
            found = vllm_argv.model_path(list(argv))
            model_dir = Path(found) if found else None
        if model_dir is None:
            return
        try:
            is_dir = stat.S_ISDIR(os.stat(model_dir).st_mode)
            why = "is not a directory"
        except OSError as exc:
            is_dir, why = False, f"cannot be read: {exc.strerror or exc}"
        if not is_dir:
            if self.cfg.model.dir is not None and why != self._model_dir_said:
                # configured, so meant: say what is off without it (a path from argv may be a
                # Hugging Face model id, no directory at all)
                self._model_dir_said = why
                self._log_problem(
                    f"[model] dir {model_dir} {why}: no byte progress and no memory forecast "
                    "from the checkpoint's size"
                )
            return
        info: ModelInfo = read_model_dir(model_dir)
        for err in info.errors:
            self.eventlog.emit("model.error", path=str(model_dir), error=err)
        self.apply(info)

    def _read_logged_model(self) -> None:
        """Without a model directory configured, the one the engine config names, when it is
        here (analyze reads it the same way: the same verdicts)."""
        s = self.state.session
        path = s.kv.model_path if s is not None else None
        if path is None or path == self._model_tried or self.cfg.model.dir is not None:
            return
        self._model_tried = path
        info = model_named_in_log(path)
        if info is not None:
            self.apply(info)

    def _start_orphan_check(self, tree_pids: tuple[int, ...]) -> asyncio.Task[None]:
        """The check waits out the moment in which the driver still lists the exited tree."""
        task = self._orphan_checks.get(tree_pids)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._check_orphans(tree_pids), name="orphans"
            )
            self._orphan_checks[tree_pids] = task
            task.add_done_callback(lambda _: self._orphan_checks.pop(tree_pids, None))
        return task

    async def _check_orphans(self, tree_pids: tuple[int, ...]) -> None:
        marker = getattr(self.supervisor, "run_marker", None)
        report = await settle_orphans(
            self.gpu.poll_async, tree_pids, grace_s=self.orphan_grace_s, run_marker=marker
        )
        if report is None:
            return
        self._orphans = len(report.leaked)
        # Also when clean: how long the exited tree took to give its memory back is worth a line.
        self.eventlog.emit(
            "gpu.orphans",
            summary=report.summary(),
            leaked=len(report.leaked),
            unknown=len(report.unknown),
            exiting=len(report.exiting),
            leaked_bytes=report.leaked_bytes,
            gpus=sorted({h.gpu_index for h in report.leaked}),
            pids=sorted({h.pid for h in report.leaked}),
            waited_s=round(report.waited_s, 2),
        )
        self.publish()

    # -- the log ----------------------------------------------------------------------------

    def open_follower(self) -> LogFollower | None:
        path = self.cfg.log.path
        if path is None:
            return None
        state_dir = self.cfg.state_dir / "follower"
        fmt = "plain" if self.cfg.supervise else resolve_format(self.cfg.log.format, path)
        self._decoder = ContainerLogDecoder(fmt) if fmt != "plain" else None
        follower = LogFollower(
            path,
            state_dir=state_dir,
            cap_bytes=self.cfg.log.max_record_bytes,
            poll_interval_s=self.cfg.log.poll_interval_s,
            mode=self.cfg.log.mode,
            split_cr=self._decoder is None,
        )
        cp = follower.loaded_checkpoint
        error = follower.health().last_error
        if cp is None and error is not None:  # said now: the first checkpoint saved clears it
            self._log_problem(f"log {path}: {error}: no position to resume from")
            self._log_error_logged = error
        if cp is not None:
            start = cp.extra.get("session_start") if isinstance(cp.extra, dict) else None
            resume = follower.position()
            if isinstance(start, dict) and resume is not None:
                try:
                    at = Position.from_dict(start)
                except ValueError:
                    at = None
                if at is not None:
                    follower.know(at.file_id)
                # With the checkpoint's file gone or cut back there is no end to replay to:
                # what is there is read from its start, as new (`_tell_start` says so).
                if at is not None and at != resume and follower.where(resume) is not None:
                    if follower.seek(at):
                        self._replay_until = resume
                        self._session_start = start
                        self.eventlog.emit("daemon.replay", since=start, until=resume.to_dict())
                    elif follower.health().last_error is None:  # (an error is told as one)
                        self._log_problem(
                            f"log {path}: the file the current vLLM session began in (at byte "
                            f"{at.offset}) is gone: the session's state is rebuilt without "
                            "what was logged before the checkpoint"
                        )
        name = checkpoint_name(path).replace("follower-", "events-", 1)
        self._marks = EmitMark(state_dir / name)
        self._mark = self._place_mark(self._marks.load(), follower)
        if self._mark is not None and self._mark.pending > self._mark.done:
            m = self._mark
            if self.cfg.events_file is not None:
                self._written = written_events(self.cfg.events_file, m)
            found = None if self._written is None else len(self._written)
            # the last daemon was killed while writing the events of [done, pending)
            self.eventlog.emit("daemon.cut_run", done=m.done, pending=m.pending, found=found)
        self._follower = follower
        return follower

    def _place_mark(self, mark: Mark | None, follower: LogFollower) -> Mark | None:
        """The emit mark, if it names a file reading will reach (see emitmark.py); when it names
        a newer file than the checkpoint's, everything before that file is a replay."""
        if mark is None:
            return None
        at = follower.where(Position(mark.file_id, mark.done))
        if at is None:
            return None  # its file is gone, or cut back below what it says was written
        cp = follower.loaded_checkpoint
        if cp is not None and mark.file_id == cp.file_id:
            return mark  # the checkpoint's file, wherever the follower finds it (even a copy)
        follower.know(mark.file_id)  # its file's records come with exactly this identity
        if cp is None:  # killed before its first checkpoint: it read the mark's file from 0
            if at > 0 and not follower.seek(Position(mark.file_id, 0)):
                return None
            return mark
        base = follower.where(Position(cp.file_id, 0))
        if base is not None and at > base:
            return None  # in a file older than the checkpoint's: all of it is behind
        self._mark_ahead = base is not None and at < base
        return mark

    def feed_chunks(self, chunks: Iterable[Any]) -> None:
        for chunk in chunks:
            for data, start, end in self._split(chunk):
                mode = self._replaying(chunk.file_id, start, end)
                events = self._scanner.feed(data, start, chunk.file_id)
                marks = self._marks if events and mode != "replay" else None
                if marks is not None:
                    marks.begin(chunk.file_id, start, end, self._events_at(mode))
                for ev in events:
                    self._event(ev, chunk.file_id, mode)
                if marks is not None:
                    marks.end(chunk.file_id, end, self.eventlog.position())
        if self._follower is not None:
            self._follower.maybe_checkpoint(self._checkpoint_extra())

    def _events_at(self, mode: str) -> tuple[str, int] | None:
        """Where a run's events begin in the event log file. Going on with the run a kill cut
        short: where the killed daemon began writing it, so a kill now still finds its lines."""
        mark = self._mark
        if mode == "again" and mark is not None:
            if mark.events_file is None or mark.events_at is None:
                return None
            return mark.events_file, mark.events_at
        return self.eventlog.position()

    def _split(self, chunk: Any) -> list[tuple[bytes, int, int]]:
        """The chunk as runs of records, cut where replaying ends: a run is all replay or none."""
        cuts: set[int] = set()
        until, mark = self._replay_until, self._mark
        if until is not None and until.file_id == chunk.file_id:
            cuts.add(until.offset)
        if mark is not None and mark.file_id == chunk.file_id:
            cuts.update((mark.done, mark.pending))
        start, end = chunk.offset, chunk.next_offset
        inner = sorted(c for c in cuts if start < c < end)
        if chunk.cut or not inner:  # a cut record is one record: nothing to split
            return [(chunk.data, start, end)]
        bounds = [start, *inner, end]
        return [(chunk.data[a - start : b - start], a, b) for a, b in itertools.pairwise(bounds)]

    def _replaying(self, file_id: str, start: int, end: int) -> str:
        """'replay': re-read to rebuild the state, events already written; 'again': a run whose
        events a killed daemon may have written in part, so written marked as replays; 'live'."""
        until = self._replay_until
        if until is not None:
            if file_id == until.file_id:
                self._until_seen = True
                if start < until.offset:
                    return "replay"
            elif not self._until_seen:
                return "replay"  # a file before the checkpoint's
            # at the checkpoint, or in a file after it (that one ended there, rotated since)
            self._end_replay()
        mark = self._mark
        if mark is not None and mark.file_id == file_id:
            self._mark_ahead = False
            if end <= mark.done:
                return "replay"
            if end <= mark.pending:
                return "again"
            self._mark = self._written = None
        elif mark is not None and self._mark_ahead:
            return "replay"  # a file before the mark's: its events were written
        return "live"

    def _end_replay(self) -> None:
        self._replay_until = None
        self.eventlog.emit("daemon.replay_done")

    def _session_id(self) -> int | None:
        s = self.state.session
        return s.id if s is not None else None

    def _event(self, ev: Event, file_id: str, mode: str) -> None:
        self._events[ev.type] += 1
        before = self._session_id()
        self.apply(ev, replay=mode != "live", again=mode == "again", backlog=not self._caught_up)
        self._read_logged_model()
        if self._session_id() != before:
            self._session_start = {"file_id": file_id, "offset": ev.offset}
        if mode != "replay":
            fields = {k: v for k, v in ev.to_dict().items() if v is not None and k != "type"}
            if mode == "again":
                self._emit_again(f"log.{ev.type}", fields)
            else:
                self.eventlog.emit(f"log.{ev.type}", **fields)

    def _emit_again(self, name: str, fields: dict[str, Any]) -> None:
        """An event of the run a kill cut short: written unless the event log has it already;
        marked as a replay when the event log could not be read back."""
        if self._written is None:
            fields["replay"] = True
        elif identity(name, self.eventlog.redactor.value(fields)) in self._written:
            return  # (compared as written: secrets in a reason are redacted there)
        self.eventlog.emit(name, **fields)

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {"session_start": self._session_start} if self._session_start else {}

    async def follow(self) -> None:
        follower = self._follower
        if follower is None:
            return
        while not self.stop_event.is_set():
            try:
                chunks = follower.read()
                if self._decoder is not None:  # a container runtime's lines: their content
                    chunks = self._decoder.decode(chunks)
            except FollowerError as exc:
                self._log_problem(f"log {follower.path}: {exc}")
                chunks = []
            if not self._start_told and follower.start != "pending":
                self._start_told = True  # (before the events the line explains)
                self._tell_start(follower)
            if chunks:
                self.feed_chunks(chunks)
                self.publish_soon()
            h = follower.health()
            if h.last_error and h.last_error != self._log_error_logged:
                where = "" if h.last_error.startswith(str(follower.path)) else f"{follower.path}: "
                self._log_problem(f"log {where}{h.last_error}")
            elif h.last_error is None and self._log_error_logged is not None:
                self.eventlog.emit("daemon.recovered", source="log")
            self._log_error_logged = h.last_error
            if follower.backlog:
                await asyncio.sleep(0)
                continue
            if not chunks:
                self._caught_up = True  # (a log not there yet has no backlog either)
            if chunks:
                self._last_chunk = (time.monotonic(), chunks[-1].file_id)
            if not chunks and h.file_exists:
                # caught up: whatever the mark names is not coming, nor a record after the
                # checkpoint in its file
                self._mark = self._written = None
                if self._replay_until is not None:
                    self._end_replay()
                self._close_quiet_traceback(follower)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wait_log(follower), timeout=1.0)

    def _close_quiet_traceback(self, follower: LogFollower) -> None:
        """A traceback still open once the log has been quiet for QUIET_CLOSE_S is the log's
        last word (a vLLM that died printing it): closed as analyze closes it at the end of the
        file, so the failure is not held back for ever. One the last daemon read before its
        checkpoint was its to write: state only."""
        at, file_id = self._last_chunk
        stream = self._scanner.stream
        if not stream.in_traceback or time.monotonic() - at < QUIET_CLOSE_S:
            return
        cp = follower.loaded_checkpoint
        for ev in stream.flush():
            old = cp is not None and file_id == cp.file_id and ev.offset < cp.offset
            self._event(ev, file_id or "", "replay" if old else "live")
        self.publish_soon()

    def _tell_start(self, follower: LogFollower) -> None:
        """One line when a restart could not resume where the last daemon stopped reading."""
        cp, start = follower.loaded_checkpoint, follower.start
        if cp is None or start not in ("gone", "changed"):
            return
        path, keep = follower.path, follower.rotated_keep
        if start == "gone":
            names = (
                f"{path}"
                if keep == 0
                else f"{path} nor at {path}.1 ... {path}.{keep} nor at a dated {path}-<date>"
            )
            why = f"is no longer at {names} (deleted, rotated further, or unreadable)"
        else:
            why = "was cut back below that byte while the daemon was down"
        if follower.recovered:  # rotated away after the checkpoint: newer than its file
            files = ", ".join((*follower.recovered, str(path)))
            reading = f"{files} from their start (rotated files written after the checkpoint)"
        else:
            reading = f"{path} from its start"
        self._log_problem(
            f"log {path}: the file the checkpoint names (at byte {cp.offset}) {why}: reading "
            f"{reading}; what that file held after byte {cp.offset}, if anything, is not read"
        )

    async def _wait_log(self, follower: LogFollower) -> None:
        stop = asyncio.ensure_future(self.stop_event.wait())
        wait = asyncio.ensure_future(follower.wait_async(1.0))
        try:
            await asyncio.wait({stop, wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (stop, wait):
                if not fut.done():
                    fut.cancel()

    def _check_eventlog(self) -> None:
        """The event log's file failing (a full disk) is said on the console, which still works."""
        error = self.eventlog.last_error
        if error != self._eventlog_error:
            if error is not None:
                self._log_problem(error)
            else:
                self.eventlog.emit("daemon.recovered", source="eventlog")
            self._eventlog_error = error

    def _log_problem(self, line: str) -> None:
        self.eventlog.emit("daemon.problem", error=self.redactor.text(line))

    # -- GPUs, ticks, health, I/O -----------------------------------------------------------

    async def poll_gpus(self) -> None:
        interval = self.cfg.gpu.poll_interval_s
        last_error: str | None = None
        last_health: tuple[bool, str | None] | None = None
        while not self.stop_event.is_set():
            reading = await self.gpu.poll_async()
            self._last_reading = reading
            for x in reading.xids:
                uuid = next((s.uuid for s in reading.samples if s.index == x.gpu_index), x.uuid)
                self._xids[(x.gpu_index, uuid, x.xid)] += 1
                self.eventlog.emit("gpu.xid", gpu=x.gpu_index, uuid=uuid, xid=x.xid)
            for s in reading.samples:
                if s.compute_capability is not None:
                    self._gpu_ccs[s.index] = s.compute_capability
            if reading.error != last_error and reading.error:
                self._log_problem(f"GPU source: {reading.error}")
            last_error = reading.error
            self.apply(reading)
            health = (reading.source_up, reading.error)
            if health != last_health:  # a change of health goes out with the state it fed
                last_health = health
                self.publish()
            elif self.busy:  # while loading, memory and its projection are news
                self.publish_soon()
            # While nothing loads, a poll every IDLE_TICK_S; a load that starts meanwhile is
            # seen within one interval.
            waited = 0.0
            while not self.stop_event.is_set():
                await self._sleep(interval)
                waited += interval
                if self.busy or waited >= IDLE_TICK_S:
                    break

    async def tick(self) -> None:
        while not self.stop_event.is_set():
            self._scanner.stream.set_reference(self.clock())
            self._check_eventlog()
            self.apply(Tick())
            self.publish()
            self._notify_status()
            self._report_stall()
            await self._sleep(TICK_S if self.busy else IDLE_TICK_S)

    @property
    def busy(self) -> bool:
        """A load is in progress: ticks and GPU polls run at full pace."""
        s = self.state.session
        return s is not None and s.phase in ("starting", "loading_weights", "post_load", "stalled")

    def _report_stall(self) -> None:
        """While the load is stalled, tell the supervisor how long for (its policy decides)."""
        s = self.state.session
        if self.supervisor is None or s is None or s.stall is None:
            return
        self.supervisor.note_stall(self.clock() - s.stall.since)

    async def sample_io(self, pids_of: Callable[[], Sequence[int]]) -> None:
        """Bytes read by the vLLM processes: the supervised one's tree, or in watch mode the
        trees of the pids the log's prefixes name (those that run on this host)."""
        from loadwatch.daemon.sources.proc.io_counters import ProcIoReader

        reader = self._io_reader or ProcIoReader(clock=self.clock)
        while not self.stop_event.is_set():
            pids = pids_of()
            phase = self.state.session.phase if self.state.session is not None else None
            if pids and phase in ("starting", "loading_weights", "stalled"):
                sample: IoSample = reader.read_many(pids)
                if sample.read_bytes is not None:
                    self.apply(sample)
            await self._sleep(IO_SAMPLE_S)

    def _supervised_pids(self) -> tuple[int, ...]:
        pid = self.supervisor.pid if self.supervisor is not None else None
        return (pid,) if pid is not None else ()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)

    # -- publishing -------------------------------------------------------------------------

    def publish_soon(self) -> None:
        """Publish now, or once PUBLISH_MIN_S has passed since the last time: while a backlog
        streams in, a snapshot per read would cost more than the reading."""
        wait = PUBLISH_MIN_S - (time.monotonic() - self._published_mono)
        if wait <= 0:
            self.publish()
        elif not self._publish_pending and self._loop is not None:
            self._publish_pending = True
            self._loop.call_later(wait, self._publish_deferred)

    def _publish_deferred(self) -> None:
        if self._publish_pending:
            self.publish()

    def publish(self) -> None:
        self._publish_pending = False
        self._published_mono = time.monotonic()
        now = self.clock()
        snap = self.state.snapshot(now)
        self.published = Published(
            state=self.state,
            at=now,
            started_at=self.started_at,
            version=VERSION,
            totals=self._totals(snap),
            log=self._log_health(),
            gpu=self.gpu.health() if isinstance(self.gpu, GuardedGpuSource) else None,
            supervisor=self._supervisor_stats(),
            load_budget_s=self.cfg.forecast.load_budget_s,
            gpu_ccs=dict(self._gpu_ccs),
            _cache=[snap, now],
        )
        failed: str | None = None
        for hook in self.on_publish:
            try:
                hook(self.published)
            except Exception as exc:  # a hook's bug must not stop the loop: said once
                failed = f"after publishing: {type(exc).__name__}: {exc}"
        if failed is not None and failed != self._hook_error:
            self._log_problem(failed)
        self._hook_error = failed

    def _totals(self, snap: Snapshot) -> Totals:
        """Lifetime counts: sessions the state no longer details, plus the current one."""
        warnings = Counter(self._retired.warnings)
        failures = Counter(self._retired.failures)
        stalls = self._retired.stalls
        view = snap.session
        if view is not None:
            for w in view.warnings:
                warnings[w.code] += w.count
            if view.failure_kind is not None:
                failures[view.failure_kind] += 1
            stalls += view.stall.stalls_total
        return Totals(
            warnings=dict(warnings),
            failures=dict(failures),
            stalls=stalls,
            events=dict(self._events),
            xids=dict(self._xids),
        )

    def _log_health(self) -> LogHealth | None:
        f = self._follower
        if f is None:
            return None
        h = f.health()
        return LogHealth(
            up=h.file_exists and h.last_error is None,
            file_exists=h.file_exists,
            lines_total=h.records_total,
            bytes_total=h.bytes_total,
            cuts_total=h.cuts_total,
            rotations_total=h.rotations_total,
            truncations_total=h.truncations_total,
            errors_total=h.errors_total,
            last_error=h.last_error,
            last_success_ts=h.last_check_ts,
            mode=h.mode,
        )

    def _supervisor_stats(self) -> SupervisorStats | None:
        sup = self.supervisor
        if sup is None:
            return None
        exits = self._vllm_exits
        last_ok = self._vllm_last_ok
        if sup.pid is not None:
            last_ok = self.clock()
        return SupervisorStats(
            state=str(sup.state),
            starts_total=sum(exits.values()) + (1 if sup.pid is not None else 0),
            exits=dict(exits),
            errors_total=exits["failed"] + exits["signal"],
            last_success_ts=last_ok,
            orphans=self._orphans,
            health_up=self._health_up,
        )

    def snapshot(self) -> Snapshot:
        pub = self.published
        return pub.snapshot(self.clock()) if pub is not None else self.state.snapshot(self.clock())

    def _notify_status(self) -> None:
        line = status_line(self.snapshot())
        if line != self._last_status:
            self._last_status = line
            self.notifier.status(line)

    # -- lifecycle --------------------------------------------------------------------------

    def loop_call(self, fn: Callable[[], Any]) -> None:
        """Run `fn` on the daemon's loop, from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(fn)

    async def run(self) -> int:
        """Run until `stop_event` is set; returns the process exit code."""
        self._loop = asyncio.get_running_loop()
        self._load_model()
        follower = self.open_follower()
        self.publish()
        tasks = [
            asyncio.create_task(self.tick(), name="tick"),
            asyncio.create_task(self.poll_gpus(), name="gpu"),
        ]
        if follower is not None:
            tasks.append(asyncio.create_task(self.follow(), name="follow"))
        sup_task: asyncio.Task[Any] | None = None
        if self._supervisor_factory is not None:
            # Know the GPUs before vLLM starts: the preflight needs their compute capability.
            await self._wait_first_gpu_poll()
            self.supervisor = self._supervisor_factory(self)
            sup_task = asyncio.create_task(self.supervisor.run(), name="supervisor")
            tasks.append(asyncio.create_task(self.sample_io(self._supervised_pids), name="io"))
        elif follower is not None:
            tasks.append(
                asyncio.create_task(self.sample_io(lambda: self.state.node_pids), name="io")
            )
        tasks.append(asyncio.create_task(VllmWatch(self).run(), name="health"))
        if self.notifier.watchdog_interval_s:
            tasks.append(asyncio.create_task(self.notifier.run_watchdog(), name="watchdog"))
        self.notifier.ready(status_line(self.snapshot()))
        self.eventlog.emit(
            "daemon.started",
            version=VERSION,
            pid=os.getpid(),
            log=str(self.cfg.log.path) if self.cfg.log.path else None,
            supervise=self.cfg.supervise,
            scanner="c" if NATIVE else "python",  # the log's candidate search (parsers/_scan.c)
        )
        stopper = asyncio.create_task(self.stop_event.wait(), name="stop")
        done: set[asyncio.Task[Any]] = set()
        pending = {*tasks, stopper}
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
                    self._log_problem(f"{task.get_name()} stopped: {exc!r}")
                elif task is sup_task:
                    self.eventlog.emit("vllm.supervisor_done", state=str(self.supervisor.state))
        self.notifier.stopping("stopping")
        code = await self._shutdown(pending)
        return code

    async def _wait_first_gpu_poll(self, timeout_s: float = 5.0) -> None:
        end = self.clock() + timeout_s
        while self._last_reading is None and self.clock() < end and not self.stop_event.is_set():
            await asyncio.sleep(0.02)

    async def _shutdown(self, pending: set[asyncio.Task[Any]]) -> int:
        if self.supervisor is not None:
            result = await self.supervisor.stop("loadwatch is stopping")
            if result.tree_pids:
                self._start_orphan_check(result.tree_pids)
            for check in list(self._orphan_checks.values()):
                with contextlib.suppress(Exception):
                    await check
            self.eventlog.emit(
                "vllm.stopped",
                remaining=list(result.remaining_pids),
                tree_pids=list(result.tree_pids),
            )
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._follower is not None:
            self._follower.close(checkpoint=True)
        if self._marks is not None:
            self._marks.close()
        self.publish()
        self.eventlog.emit("daemon.stopped")
        return 0


def status_line(snap: Snapshot) -> str:
    """One line for systemd's STATUS= and the console: "loading 18/119 shards, ETA 15m"."""
    s = snap.session
    if s is None:
        return "waiting for vLLM"
    p = s.progress
    if s.phase in ("loading_weights", "stalled", "starting") and p.shards_total:
        eta = f", ETA {_human(p.eta.remaining_s)}" if p.eta is not None else ""
        stalled = " (stalled)" if s.phase == "stalled" else ""
        return f"loading {p.shards_done or 0}/{p.shards_total} shards{eta}{stalled}"
    if s.phase == "failed":
        return f"failed: {s.failure_kind or 'unknown'}"
    if s.phase == "ready" and s.time_to_ready_s is not None:
        return f"ready (in {_human(s.time_to_ready_s)})"
    return s.phase.replace("_", " ")


def _human(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
