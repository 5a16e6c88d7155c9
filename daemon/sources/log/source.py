"""The log source: vLLM's log as runs of events, each tagged with what a restart owes it.

The one owner of resuming, for every input. It holds the input (inputs.py: how the bytes
arrive, and its checkpoint), the emit mark and the replay decision (resume.py), and hands the
loop `Run`s: the events of a run of records, tagged

- `replay`: the records were written before this daemon could watch them (read back to rebuild
  the state, or a backlog caught up on): they happened at their own stamps, moved onto the
  daemon's clock by `stamp_offset_s`; else they happen now (live);
- `emit`: what the event log still needs of their effects: "none" (written by the daemon before),
  "missing" (a run a kill cut short: those `written` lacks; with `written` None, all of them,
  marked replay), "new".

and `Notice`s, the ``daemon.*`` lines about reading, in the order the event log must show them.
The loop applies each run and writes its effects between `begin(run, ...)` and `end(run, ...)`,
which keep the emit mark; it tells `session_began` when a record opened a vLLM session (the
checkpoint keeps where, so a restart replays the session from there).

Time. vLLM stamps its lines in its own local time with no zone; the parser reads them in the
daemon's zone. Nothing here compares a stamp with the daemon's clock to decide anything: the
offset between the two (daemon clock minus stamp) is measured on live records (the smallest
seen lately: a line is read a little after it was written, never before), saved in the
checkpoint, and on a first start taken from the log file's modification time against the last
stamp of its backlog. A replay lands on the daemon's timeline whatever vLLM's zone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.inputs import Chunk, joined
from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.daemon.sources.log.emitmark import EVERY_S, EmitMark, Written
from loadwatch.daemon.sources.log.files import stat_file
from loadwatch.daemon.sources.log.follower import FollowerError
from loadwatch.daemon.sources.log.inputs import LogInput
from loadwatch.daemon.sources.log.resume import Emit, Notice, Resume
from loadwatch.daemon.sources.log.wake import Disarm, Fire
from loadwatch.parsers import ChunkScanner, Event

__all__ = ["Emit", "LogSource", "Notice", "Run"]

OFFSET_KEEP_S = 300.0  # a smaller (daemon clock - stamp) replaces the estimate; so, past this
PEEK_BYTES = 64 * 1024  # of the log's end, for the last stamp of a first start's backlog
QUIET_CLOSE_S = 2.0  # a traceback open this long with nothing more logged is complete


@dataclass(frozen=True, slots=True)
class Run:
    """The events of the records [start, end) of one file, and what is owed to them."""

    file_id: str
    start: int
    end: int
    events: list[Event]
    replay: bool
    emit: Emit
    stamp_offset_s: float
    written: Written | None = None  # emit "missing": what the event log holds
    # emit "missing": where the killed daemon began writing the run's effects in the event log
    # file (the emit mark's note; None: not known), so a kill now still finds them
    events_from: tuple[str, int] | None = None


class LogSource:
    """See the module doc. `read()` returns what the log holds now as runs and notices."""

    def __init__(
        self,
        log_input: LogInput,
        *,
        state_dir: Path,
        scanner: Callable[[], ChunkScanner],
        events_file: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.input = log_input  # how the bytes arrive (inputs.py); the rest is this class's
        self.path = path = log_input.path
        self._clock = clock
        self._new_scanner = scanner
        self.scanner = scanner()
        name = checkpoint_name(path).replace("follower-", "events-", 1)
        self.marks = EmitMark(state_dir / name, every_s=EVERY_S)
        self.resume = Resume(log_input, self.marks, events_file)
        self._pending: list[Notice] = []
        cp = self.input.loaded_checkpoint
        self._error_told: str | None = None
        error = self.input.health().last_error
        if cp is None and error is not None:  # said by `Resume`, with the emit mark's state
            self._error_told = error
        self._pending.extend(self.resume.notices)
        self.resume.notices.clear()
        self._kept: dict[str, Any] = {}  # what others keep in the checkpoint (`keep`)
        self._kept_unsaved = False
        saved = cp.extra.get("stamp_offset_s") if cp is not None else None
        self._offset: float | None = float(saved) if isinstance(saved, int | float) else None
        self._offset_at = clock()
        self._backlog_key: tuple[int, int] | None = None
        self._backlog_size = 0
        try:
            st = stat_file(str(path))
        except OSError:  # unreachable (EACCES, ENAMETOOLONG): the first read says so
            st = None
        if st is not None and st.st_size > 0:
            self._backlog_key, self._backlog_size = (st.st_dev, st.st_ino), st.st_size
            if self._offset is None:
                self._offset = peek_offset(
                    path, st.st_size, st.st_mtime, log_input.content, self._new_scanner
                )
        # Live once caught up; at once when nothing is there to catch up on.
        self._live = self._backlog_key is None and not self.resume.replaying and cp is None
        self._start_told = False
        self._rewrites_told = 0  # the follower's rewrites_total said so far
        self._read_any = False  # the last read found records
        self._last_chunk: tuple[float, str, int] | None = None  # (monotonic, file, end) read

    # -- time -------------------------------------------------------------------------------

    @property
    def stamp_offset_s(self) -> float:
        """Daemon clock minus vLLM's stamp, as last measured (0 before any)."""
        return self._offset if self._offset is not None else 0.0

    def _measure(self, events: list[Event], now: float) -> None:
        for ev in events:
            ts = ev.ts
            if ts is None:
                continue
            c = now - ts
            if self._offset is None or c <= self._offset or now - self._offset_at > OFFSET_KEEP_S:
                self._offset, self._offset_at = c, now

    # -- reading ----------------------------------------------------------------------------

    @property
    def backlog(self) -> bool:
        return self.input.backlog

    def read(self) -> list[Run | Notice]:
        """Everything readable now, as runs of events and the notices between them."""
        log_input = self.input
        out: list[Run | Notice] = self._take()
        try:
            chunks = joined(log_input.read())
        except FollowerError as exc:
            out.append(_problem(f"log {log_input.path}: {exc}"))
            chunks = []
        if not self._start_told and log_input.start != "pending":
            self._start_told = True  # (before the events the line explains)
            line = start_line(log_input)
            if line is not None:
                self._rewrites_told = log_input.rewrites_total  # (said by that line, not again)
                out.append(_problem(line))
        now = self._clock()
        self.scanner.stream.set_reference(now)
        for chunk in chunks:
            out.extend(self._runs(chunk, now))
        out.extend(self._take())
        if log_input.rewrites_total > self._rewrites_told:
            self._rewrites_told = log_input.rewrites_total
            warning = (
                f"log {log_input.path} was rewritten in place (the same first bytes, other bytes "
                "before where reading was): read again from where it differs"
            )
            out.append(Notice("daemon.warning", {"warning": warning}))
        self._read_any = bool(chunks)
        if chunks:
            self._last_chunk = (time.monotonic(), chunks[-1].file_id, chunks[-1].next_offset)
        if not log_input.backlog:
            self._live = True
            self.resume.caught_up_with_backlog()
            if not chunks and log_input.file_exists:
                self.resume.caught_up()
                self.marks.quiet()  # (the note, exact again once nothing is being read)
                out.extend(self._take())
                out.extend(self._close_traceback(quiet=True))
        return out

    def writer_exited(self) -> list[Run | Notice]:
        """vLLM exited and all it wrote is in the log (the supervisor saw the exit after its
        output ended): what the log holds now, with a traceback still open closed as its last
        word, so the exit is judged on the whole crash (its root cause is often the traceback's
        last line)."""
        out = self.read()
        while self.input.backlog:
            out.extend(self.read())
        out.extend(self._close_traceback(quiet=False))
        return out

    def _close_traceback(self, *, quiet: bool) -> list[Run | Notice]:
        """A traceback still open once the log has been quiet for QUIET_CLOSE_S (or, not
        `quiet`, now) is the log's last word (a vLLM that died printing it): closed as analyze
        closes it at the end of the file, so the failure is not held back for ever. One the last
        daemon read before its checkpoint was its to write: state only."""
        stream = self.scanner.stream
        last = self._last_chunk
        if last is None or not stream.in_traceback:
            return []
        if quiet and time.monotonic() - last[0] < QUIET_CLOSE_S:
            return []
        _, file_id, end = last
        events = stream.flush()
        cp = self.input.loaded_checkpoint
        limit = cp.offset if cp is not None and file_id == cp.file_id else -1
        old = [ev for ev in events if ev.offset < limit]
        new = [ev for ev in events if ev.offset >= limit]
        out: list[Run | Notice] = []
        parts: tuple[tuple[list[Event], Emit], ...] = ((old, "none"), (new, "new"))
        for part, emit in parts:
            if part:
                replay = emit == "none"
                out.append(
                    Run(file_id, part[0].offset, end, part, replay, emit, self.stamp_offset_s)
                )
        return out

    def settle(self) -> list[Notice]:
        """After the loop applied what `read` gave: the checkpoint (when due, and something was
        read), then a line when reading or saving failed, or works again."""
        if self._kept_unsaved:  # (no read may come while vLLM is stalled: saved now)
            self._kept_unsaved = not self.input.checkpoint(self._extra())
        elif self._read_any and self.input.checkpoint_due():  # (a clock check, per read)
            self.input.maybe_checkpoint(self._extra())
        log_input = self.input
        out: list[Notice] = []
        error = log_input.last_error
        if error and error != self._error_told:
            where = "" if error.startswith(str(log_input.path)) else f"{log_input.path}: "
            out.append(_problem(f"log {where}{error}"))
        elif error is None and self._error_told is not None:
            out.append(Notice("daemon.recovered", {"source": "log"}))
        self._error_told = error
        return out

    def _take(self) -> list[Run | Notice]:
        out: list[Run | Notice] = [*self._pending, *self.resume.notices]
        self._pending.clear()
        self.resume.notices.clear()
        return out

    def _runs(self, chunk: Chunk, now: float) -> list[Run | Notice]:
        out: list[Run | Notice] = []
        resume = self.resume
        for data, start, end in resume.split(chunk):
            emit = resume.emit(chunk.file_id, start, end)
            out.extend(self._take())  # (the replay's end before the run it lets through)
            events = self.scanner.feed(data, start, chunk.file_id)
            if not self._live and self._backlog_key is not None and emit == "new":
                key = _file_key(chunk.file_id)
                if key == self._backlog_key and start >= self._backlog_size:
                    self._live = True  # past what the file held when the daemon started
            replay = emit != "new" or not self._live
            if not replay:
                self._measure(events, now)
            written, since = None, None
            if emit == "missing":
                written, since = resume.written, resume.events_from()
            out.append(
                Run(
                    chunk.file_id,
                    start,
                    end,
                    events,
                    replay,
                    emit,
                    self.stamp_offset_s,
                    written,
                    since,
                )
            )
        return out

    # -- writing a run's effects ------------------------------------------------------------

    def begin(self, run: Run, events_at: tuple[str, int] | None) -> None:
        """The run's effects are about to be written (`events_at`: the event log file now)."""
        if run.emit == "missing":
            events_at = run.events_from
        if run.emit != "none" and run.events:
            self.marks.begin(run.file_id, run.start, run.end, events_at)

    def end(self, run: Run, events_at: tuple[str, int] | None) -> None:
        """They are written."""
        if run.emit != "none" and run.events:
            self.marks.end(run.file_id, run.end, events_at)

    def session_began(self, run: Run, offset: int) -> None:
        """The record at `offset` of the run's file opened a vLLM session."""
        self.resume.session_start = {"file_id": run.file_id, "offset": offset}

    # -- checkpoints and shutdown -----------------------------------------------------------

    def kept(self, name: str) -> Any:
        """What the loaded checkpoint holds under `name` (`keep`), or None."""
        cp = self.input.loaded_checkpoint
        return cp.extra.get(name) if cp is not None else None

    def keep(self, name: str, value: Any) -> None:
        """A value for the checkpoint (the live judgements in force: judgements.py), saved at
        the next `settle` when it changed: between runs, as every checkpoint is."""
        if self._kept.get(name, self.kept(name)) != value:
            self._kept[name] = value
            self._kept_unsaved = True

    def _extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.resume.session_start:
            extra["session_start"] = self.resume.session_start
        extra.update(self._kept)
        if self._offset is not None:
            extra["stamp_offset_s"] = round(self._offset, 3)
        return extra

    def arm(self, loop: asyncio.AbstractEventLoop, fire: Fire, timeout_s: float) -> Disarm:
        return self.input.arm(loop, fire, timeout_s)  # (the wait, as the daemon's loop has it)

    def close(self) -> None:
        """A clean stop: the final checkpoint and an exact emit mark, then the files closed."""
        self.marks.quiet()
        self.input.checkpoint(self._extra())
        self.input.close(checkpoint=False)
        self.marks.close()


def peek_offset(
    path: Path,
    size: int,
    mtime: float,
    content: Callable[[bytes], bytes],
    scanner: Callable[[], ChunkScanner],
) -> float | None:
    """The file's modification time minus the last stamp in its last bytes: when its last line
    was written, on the daemon's clock, against when vLLM says it was (a first start's estimate
    of the offset between the two)."""
    try:
        with open(path, "rb") as f:
            at = max(0, size - PEEK_BYTES)
            f.seek(at)
            data = f.read(size - at)
    except OSError:
        return None
    if at > 0:
        nl = data.find(b"\n")
        data, at = data[nl + 1 :], at + nl + 1
    data = data[: max(data.rfind(b"\n"), data.rfind(b"\r")) + 1]
    data = content(data)  # (the input's lines as vLLM wrote them)
    stamps = [ev.ts for ev in scanner().feed(data, at) if ev.ts is not None]
    return mtime - max(stamps) if stamps else None


def start_line(log_input: LogInput) -> str | None:
    """One line when a restart could not resume where the last daemon stopped reading."""
    cp, start = log_input.loaded_checkpoint, log_input.start
    if cp is None or start not in ("gone", "changed"):
        return None
    path, keep = log_input.path, log_input.rotated_keep
    if start == "gone":
        names = (
            f"{path}"
            if keep == 0
            else f"{path} nor at {path}.1 ... {path}.{keep} nor at a dated {path}-<date>"
        )
        why = f"is no longer at {names} (deleted, rotated further, or unreadable)"
    else:
        why = "was cut back below that byte while the daemon was down"
        if log_input.rewrites_total:
            why = "was rewritten in place while the daemon was down (the same first bytes, "
            why += "other bytes before that one)"
    if log_input.recovered:  # rotated away after the checkpoint: newer than its file
        files = ", ".join((*log_input.recovered, str(path)))
        reading = f"{files} from their start (rotated files written after the checkpoint)"
    else:
        reading = f"{path} from its start"
    return (
        f"log {path}: the file the checkpoint names (at byte {cp.offset}) {why}: reading "
        f"{reading}; what that file held after byte {cp.offset}, if anything, is not read"
    )


def _problem(line: str) -> Notice:
    return Notice("daemon.problem", {"error": line})


def _file_key(file_id: str) -> tuple[int, int]:
    dev, ino = file_id.split(":", 2)[:2]
    return int(dev), int(ino)
