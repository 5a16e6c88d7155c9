"""How far the event log got in the followed file, kept on disk so a restart writes nothing twice.

The follower's checkpoint is saved every few seconds. A daemon killed in between would, started
again, re-read the records after its checkpoint and write their events a second time. So around
every run of records whose events it writes, the loop notes in this small file the file's
identity, `done` (the end of the records whose events are all written) and `pending` (the end of
the records being written now): `pending` before writing, `done` after. A restart re-reads the
records before `done` as a replay (state rebuilt, nothing written), and goes on live after
`pending`. Between `done` and `pending` lies the run the kill cut short: some of its events may be
in the event log, the rest not. When the event log is a file, the note also says which file and
its size when the run began; `written()` reads the lines from there back, and the restart writes
exactly the events they lack, as usual. Without a file to read back (stdout only, or rotated
since) it writes them all again, marked as replays.

The mark names its file by the follower's identity string (inode and first bytes), which a
restart's follower gives the file again (`LogFollower.know`), so identities compare as strings.
A mark holds only where its file still reaches what it says was written (not deleted, not cut
back below it). A mark in the checkpoint's file holds wherever the follower finds that file: at
the path, at a rotated name (PATH.1 ..., PATH-<date>), or as the copy a copytruncate rotation left
there.
Otherwise the restart looks for the mark's file the same way (`LogFollower.where`) and places
it against where reading resumes: in a newer file than the checkpoint's (the killed daemon
followed a rotation after its last checkpoint: every record before the mark's file is then
re-read as a replay too), or an older one (nothing left to skip). With no checkpoint at all
(killed before its first), reading starts at the beginning of the mark's file, as the killed
daemon's did.

Each update is one `pwrite` of a fixed-size block over the same bytes, so a killed process leaves
either the old note or the new one. There is no fsync: the note has to outlive the process, not
the machine, and the event log's own lines are not synced either.

Beside a serving vLLM every read is a run. `begin` notes each run (its `pending` is the run's
end, `done` what was written before it: one `pwrite`); `end` notes `done` again at most once
every `every_s`, since the next `begin` notes it anyway, and `quiet` makes the note exact when
reading has caught up. (A note whose `pending` ran a byte budget ahead of the run, so that runs
within it needed none, lost a record's events across kills in the kill/restart tests: each run
is noted.)
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from loadwatch.daemon.sources.log.checkpoint import read_bounded

BLOCK = 512
MAX_MARK_BYTES = 1 << 16  # a note is a block or two: past this, not one (never read whole)
READ_BACK = 64 << 20  # at most this much of the event log is read back (else: not known)
EVERY_S = 1.0  # the log source's: `done` noted at the end of a run at most this often

Identity = tuple[Any, ...]


def identity(name: str, fields: Mapping[str, Any]) -> Identity | None:
    """An event line's identity by what caused it: a log event, or a state transition a log
    record caused, by the record's offset (its file is the mark's); None for any other event.
    Not by content: a transition's `at` is re-derived by a restart from its own clock. Of
    several lines of one name from one record, the k-th is ``(*identity, k)`` (`Ordinals`)."""
    offset = fields.get("offset")
    if name.startswith(("log.", "transition.")) and isinstance(offset, int):
        return (name, offset)
    return None


class Ordinals:
    """Numbers the lines of one name from one record in the order they were written, so that
    two transitions of one kind caused by one record are two identities."""

    def __init__(self) -> None:
        self._seen: dict[Identity, int] = {}

    def __call__(self, key: Identity) -> Identity:
        k = self._seen.get(key, 0)
        self._seen[key] = k + 1
        return (*key, k)


# A line that stands for records back to back (the event log's folded line, eventfeed.py) and
# the name each of its records has on a line of its own: a restart knows the records a folded
# line lists (`offsets`) as written.
FOLDED = {"log.kv_scale_run": "log.kv_scale_warning"}
FOLDED_AS = {single: fold for fold, single in FOLDED.items()}


@dataclass
class Written:
    """What the event log holds of a cut-short run: lines by identity, the records folded lines
    list (each by the identity of its own line), and those of folded lines that list none, by
    name and (first, last) offset."""

    keys: set[Identity] = field(default_factory=set)
    folded: set[Identity] = field(default_factory=set)
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def __contains__(self, key: object) -> bool:
        if key in self.keys or key in self.folded:
            return True
        if not isinstance(key, tuple) or len(key) < 2 or not isinstance(key[1], int):
            return False
        return any(a <= key[1] <= b for a, b in self.spans.get(key[0], ()))


def written(events_file: Path, mark: Mark, limit: int = READ_BACK) -> Written | None:
    """The events of the cut-short run [mark.done, mark.pending) that the event log holds
    (unmarked); None when that cannot be known: the mark does not say where the run's events
    began, the file there is another one (rotated since) or shorter, or it cannot be read.

    The run's events are the lines from `mark.events_at` on (after them, only what restarted
    daemons wrote). Lines torn or not JSON are passed over."""
    if mark.events_file is None or mark.events_at is None:
        return None
    try:  # (non-blocking: a FIFO or a terminal there must not hang the start)
        fd = os.open(events_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or f"{st.st_dev}:{st.st_ino}" != mark.events_file:
                return None
            if not mark.events_at <= st.st_size <= mark.events_at + limit:
                return None
            f.seek(mark.events_at)
            tail = f.read(st.st_size - mark.events_at)
    except OSError:
        return None
    found = Written()
    ordinal = Ordinals()
    for raw in tail.split(b"\n"):
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(doc, dict) or doc.get("replay"):
            continue
        name = doc.get("event")
        key = identity(name, doc) if isinstance(name, str) else None
        if key is None or not mark.done <= key[1] < mark.pending:
            continue
        found.keys.add(ordinal(key))
        offsets = doc.get("offsets")
        if name in FOLDED and isinstance(offsets, list):
            for o in offsets:
                if isinstance(o, int):
                    found.folded.add(ordinal((FOLDED[name], o)))
            continue
        last = doc.get("last_offset")  # a line that lists no offsets: those from first to last
        if name in FOLDED and isinstance(last, int):
            found.spans.setdefault(FOLDED[name], []).append((key[1], last))
    return found


@dataclass(frozen=True, slots=True)
class Mark:
    file_id: str
    done: int  # every record before this offset had its events written
    pending: int  # records up to here may have had theirs written (>= done)
    events_file: str | None = None  # the event log file ("dev:ino") the run's events went to
    events_at: int | None = None  # its size when the run began: where those events start


class EmitMark:
    """The note's file: `load()` once at start, then `begin`/`end` around each written run, and
    `quiet` when reading caught up (see the module doc: what is noted when)."""

    def __init__(
        self,
        path: Path,
        *,
        every_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.errors_total = 0
        self.last_error: str | None = None
        self.writes_total = 0
        self._every_s = every_s
        self._clock = clock
        self._fd: int | None = None
        self._file_id: str | None = None
        self._done = 0
        self._done_events: tuple[str, int] | None = None  # the event log where `done` was
        self._noted: Mark | None = None  # what the file says now
        self._done_noted_at = float("-inf")  # when `done` was last noted

    def load(self) -> Mark | None:
        """The note the last run left, or None (none, or unreadable: then nothing is skipped)."""
        try:
            raw = read_bounded(self.path, MAX_MARK_BYTES)
            if raw is None:
                self.last_error = f"the emit mark {self.path} is over {MAX_MARK_BYTES} bytes"
                return None
            doc = json.loads(raw.decode("utf-8").strip() or "null")
            mark = Mark(str(doc["file_id"]), int(doc["done"]), int(doc["pending"]))
            events, at = doc.get("events_file"), doc.get("events_at")
            if isinstance(events, str) and isinstance(at, int) and at >= 0:
                mark = Mark(mark.file_id, mark.done, mark.pending, events, at)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not a note of ours"
            self.last_error = f"the emit mark {self.path} is unreadable ({why})"
            return None
        if mark.done < 0 or mark.pending < mark.done:
            self.last_error = f"the emit mark {self.path} is unreadable (its offsets are not)"
            return None
        return mark

    def begin(
        self, file_id: str, start: int, end: int, events: tuple[str, int] | None = None
    ) -> None:
        """Events of the records in [start, end) of `file_id` are about to be written, to the
        event log file `events` = ("dev:ino", its size now), when there is one."""
        if file_id != self._file_id:
            self._file_id, self._done = file_id, start
        ev_file, ev_at = events if events is not None else (None, None)
        self._write(Mark(file_id, min(self._done, start), end, ev_file, ev_at))

    def end(self, file_id: str, end: int, events: tuple[str, int] | None = None) -> None:
        """Those events are written (and the event log file is now `events`)."""
        self._file_id, self._done, self._done_events = file_id, end, events
        if self._clock() - self._done_noted_at >= self._every_s:
            self._note_done()

    def quiet(self) -> None:
        """Reading caught up: the note says exactly what was written."""
        noted = self._noted
        if self._file_id is None or noted is None:
            return
        ev_file, ev_at = self._done_events if self._done_events is not None else (None, None)
        exact = Mark(self._file_id, self._done, self._done, ev_file, ev_at)
        if noted != exact:
            self._write(exact)
            self._done_noted_at = self._clock()

    def _note_done(self) -> None:
        assert self._file_id is not None
        ev_file, ev_at = self._done_events if self._done_events is not None else (None, None)
        self._write(Mark(self._file_id, self._done, self._done, ev_file, ev_at))
        self._done_noted_at = self._clock()

    def _write(self, mark: Mark) -> None:
        self._noted = mark
        self.writes_total += 1
        doc: dict[str, Any] = {"file_id": mark.file_id, "done": mark.done, "pending": mark.pending}
        if mark.events_file is not None:
            doc |= {"events_file": mark.events_file, "events_at": mark.events_at}
        data = orjson.dumps(doc).ljust(BLOCK - 1) + b"\n"  # (one per run of records)
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self.path, flags, 0o600)
            if os.pwrite(self._fd, data, 0) != len(data):  # a size limit cut it short
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
            if len(data) > BLOCK:  # a longer note once: drop what a shorter one would leave
                os.ftruncate(self._fd, len(data))
        except OSError as exc:
            self.errors_total += 1
            self.last_error = f"cannot note the event log's position in {self.path}: {exc.strerror}"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
