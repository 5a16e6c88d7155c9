"""Which records' effects are already out: the replay decision of a restart, in one place.

A restarted daemon must rebuild the state of the current vLLM session and write every record's
effects (its log events and the state transitions it causes) exactly once. Two notes on disk say
how far the last daemon got:

- the follower's checkpoint (checkpoint.py), saved every few seconds, with the position where
  the current session began in its `extra`: reading starts there again and every record up to
  the checkpoint is a replay (state rebuilt, nothing written: written already);
- the emit mark (emitmark.py), set around every run of records whose effects are written: the
  records before its `done` are a replay too, those in [done, pending) a run the kill cut short
  (each effect written unless the event log file already holds it), the rest new.

`Resume` is built once at start from both notes and the follower, then asked of each run of
records: `split` cuts a chunk where the answer changes, `emit` gives the answer ("none", "missing"
or "new"). What it has to say about the start (a replay, a cut run, a lost file) it leaves in
`notices`, in the order the event log must show them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.emitmark import EmitMark, Mark, Written, written
from loadwatch.daemon.sources.log.follower import Position
from loadwatch.daemon.sources.log.inputs import LogInput

# What the event log still needs of a run's effects: nothing (written before), those the event
# log file lacks (a run a kill cut short), or all of them.
Emit = Literal["none", "missing", "new"]


@dataclass(frozen=True, slots=True)
class Notice:
    """A line the event log gets about reading itself (``daemon.*``)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)


class Resume:
    """The replay decision of one start; see the module doc."""

    def __init__(
        self, follower: LogInput, marks: EmitMark, events_file: Path | None = None
    ) -> None:
        self.notices: list[Notice] = []
        self.session_start: dict[str, Any] | None = None  # where the current session began
        self.written: Written | None = None  # what the event log has of the cut run
        self._follower = follower
        self._until: Position | None = None  # replay up to the checkpoint
        self._until_seen = False  # a record of the checkpoint's file was read in the replay
        self._mark_ahead = False  # the mark's file comes after the one reading resumes in
        # checkpoint or emit mark unreadable: no note of what was written (`_tell_untrusted`)
        self.untrusted = False
        cp_error = follower.health().last_error if follower.loaded_checkpoint is None else None
        self._seek_session_start()
        loaded = marks.load()
        if cp_error is not None or marks.last_error is not None:
            self._tell_untrusted(cp_error, marks.last_error, loaded is not None)
        self.mark = self._place(loaded)
        m = self.mark
        if m is not None and m.pending > m.done:
            found = written(events_file, m) if events_file is not None else None
            self.written = found
            # the last daemon was killed while writing the effects of [done, pending)
            n = None if found is None else len(found.keys)
            self.notices.append(
                Notice("daemon.cut_run", {"done": m.done, "pending": m.pending, "found": n})
            )

    def _tell_untrusted(self, cp_error: str | None, mark_error: str | None, mark: bool) -> None:
        """One line for state that cannot be trusted, and the choice it leaves. With the emit
        mark unreadable (or gone with the checkpoint) nothing tells which of the records read
        again had their effects written: they are all written again, marked `replay`, until
        reading catches up with what the log held (`caught_up_with_backlog`); none is lost, and
        a consumer can drop the repeats."""
        errors = "; ".join(e for e in (cp_error, mark_error) if e is not None)
        self.untrusted = mark_error is not None or not mark
        if self.untrusted:
            where = "from the checkpoint" if cp_error is None else "from the log's start"
            then = (
                f"reading {where}, the events of what is read until it catches up are written "
                'again, marked "replay": true (some may have been written before)'
            )
        else:
            then = "reading from the start of the emit mark's file; what it says was written "
            then += "is not written again"
        line = f"log {self._follower.path}: {errors}: {then}"
        self.notices.append(Notice("daemon.problem", {"error": line}))

    def caught_up_with_backlog(self) -> None:
        """A read took all the log held: what comes after is new, whatever the state said."""
        self.untrusted = False

    def _seek_session_start(self) -> None:
        follower = self._follower
        cp = follower.loaded_checkpoint
        if cp is None:
            return
        start = cp.extra.get("session_start") if isinstance(cp.extra, dict) else None
        resume = follower.position()
        if not isinstance(start, dict) or resume is None:
            return
        try:
            at = Position.from_dict(start)
        except ValueError:
            return
        follower.know(at.file_id)
        # With the checkpoint's file gone or cut back there is no end to replay to: what is
        # there is read from its start, as new (`LogSource` says so in one line).
        if at == resume or follower.where(resume) is None:
            return
        if follower.seek(at):
            self._until = resume
            self.session_start = start
            self.notices.append(
                Notice("daemon.replay", {"since": start, "until": resume.to_dict()})
            )
        elif follower.health().last_error is None:  # (an error is told as one)
            self.notices.append(
                Notice(
                    "daemon.problem",
                    {
                        "error": f"log {follower.path}: the file the current vLLM session began "
                        f"in (at byte {at.offset}) is gone: the session's state is rebuilt "
                        "without what was logged before the checkpoint"
                    },
                )
            )

    def _place(self, mark: Mark | None) -> Mark | None:
        """The emit mark, if it names a file reading will reach (see emitmark.py); when it names
        a newer file than the checkpoint's, everything before that file is a replay."""
        follower = self._follower
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
        if at == base:
            # One name holds both: one file, named twice (a checkpoint taken while it was
            # empty names its inode by no bytes, the mark by its first bytes). Reading names
            # it as the checkpoint does, and runs are matched to the mark by that name.
            return replace(mark, file_id=cp.file_id)
        self._mark_ahead = base is not None and at < base
        return mark

    @property
    def replaying(self) -> bool:
        """Records before the checkpoint or the mark may still come: not live yet."""
        return self._until is not None or self.mark is not None

    def split(self, chunk: Chunk) -> list[tuple[bytes, int, int]]:
        """The chunk as runs of records, cut where the answer of `emit` changes."""
        cuts: set[int] = set()
        until, mark = self._until, self.mark
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

    def emit(self, file_id: str, start: int, end: int) -> Emit:
        """What the event log needs of the effects of the records [start, end) of `file_id`
        (one of `split`'s runs)."""
        until = self._until
        if until is not None:
            if file_id == until.file_id:
                self._until_seen = True
                if start < until.offset:
                    return "none"
            elif not self._until_seen:
                return "none"  # a file before the checkpoint's
            # at the checkpoint, or in a file after it (that one ended there, rotated since)
            self._end_replay()
        if self.untrusted:
            return "missing"  # with `written` None: all of them, marked replay
        mark = self.mark
        if mark is not None and mark.file_id == file_id:
            self._mark_ahead = False
            if end <= mark.done:
                return "none"
            if end <= mark.pending:
                return "missing"
            self.mark = self.written = None
        elif mark is not None and self._mark_ahead:
            return "none"  # a file before the mark's: its effects were written
        return "new"

    def events_from(self) -> tuple[str, int] | None:
        """Where the killed daemon began writing the cut run's effects in the event log file
        (None: not known). Going on with that run, the mark keeps saying so, so a kill now
        still finds those lines."""
        mark = self.mark
        if mark is None or mark.events_file is None or mark.events_at is None:
            return None
        return mark.events_file, mark.events_at

    def caught_up(self) -> None:
        """Reading found nothing more: whatever the mark names is not coming, nor a record
        after the checkpoint in its file."""
        self.mark = self.written = None
        if self._until is not None:
            self._end_replay()

    def _end_replay(self) -> None:
        self._until = None
        self.notices.append(Notice("daemon.replay_done"))
