"""Python tracebacks folded into one failure each, across the records they span.

An engine written in Python logs a traceback over many records: its head (`Traceback (most recent
call last):`, alone or after a message), frames, chained exceptions, and the exception line that
names what failed. `Tracebacks` follows them per process (several workers' tracebacks interleave),
ends each at its exception line (held one record: a chained exception or a terminal-wrapped line
may go on), and closes it into one `Failure`. What the failure is (its kind, whether it is a
consequence of another) is the grammar's word: a `FailureWords` it is handed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from loadwatch.parsers.entries import Head
from loadwatch.parsers.events import FAILURE_RANK, Event, Failure, FailureKind
from loadwatch.parsers.wrapped import is_piece, may_continue

TRACEBACK_START: Final = "Traceback (most recent call last):"
CHAIN_MARKERS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
TRACEBACK_LEVELS: Final = (None, "ERROR", "CRITICAL")  # the record levels a traceback opens at
# A traceback's frames logged with these levels (an ERROR header on each of its lines) are read
# even without the traceback's head: a log may begin inside one.
CUT_LEVELS: Final = ("ERROR", "CRITICAL")
MAX_TRACEBACK_RECORDS = 2000
MAX_MESSAGE_CHARS = 2000
CUT_TRACEBACK = "traceback without an exception line"  # a traceback cut before its end
EXCEPTION_LINE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Za-z_][A-Za-z0-9_]{0,80}"
    r"(?:Error|Exception|Exit|Interrupt|Warning|Fault|Failure|Dead))(?:: ?(?P<msg>.*+))?$"
)
# In a traceback anything shaped `dotted.Name: message` ends it, whatever the class is called.
EXCEPTION_LINE_LOOSE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Z][A-Za-z0-9_]{0,80}+)(?:: (?P<msg>.*+))?$"
)


@dataclass(frozen=True)
class FailureWords:
    """What a grammar says of a failure: its kind from the exception (`classify`), and the
    failure event as the grammar states it (`failure`, which every failure it emits goes
    through)."""

    classify: Callable[[str | None, str], FailureKind]
    failure: Callable[..., Failure]


@dataclass(slots=True)
class _Traceback:
    offset: int
    ts: float | None
    process: str | None
    pid: int | None
    first_line: str
    records: int = 1
    last_offset: int = 0
    exc_type: str | None = None
    message: str = ""
    kind: FailureKind | None = None
    tail_open: bool = False  # its exception line may go on in the next record (wrapped)
    joined: bool = False  # a wrapped exception line's pieces were joined
    cut_head: bool = False  # its head is not in the log (the log begins inside it)

    @classmethod
    def opened(cls, head: Head, offset: int, last_ts: float | None, cut_head: bool) -> _Traceback:
        """A traceback its record `head` opens (`cut_head`: a frame, the head not in the log)."""
        ts = head.ts if head.ts is not None else last_ts
        first = head.body.strip()[:500]
        return cls(offset, ts, head.process, head.pid, first, last_offset=offset, cut_head=cut_head)

    def take(self, head: Head, offset: int, words: FailureWords) -> bool | None:
        """None: the line belongs to the traceback; True: it ended it; False: not ours."""
        body = head.body
        stripped = body.strip()
        if head.level in ("INFO", "DEBUG", "WARNING") or self.records >= MAX_TRACEBACK_RECORDS:
            return False
        self.records += 1
        self.last_offset = offset
        if not stripped or body[:1].isspace() or stripped.startswith(TRACEBACK_START):
            return None
        if stripped.startswith(CHAIN_MARKERS) or stripped.startswith("^"):
            return None
        m = EXCEPTION_LINE.match(stripped) or EXCEPTION_LINE_LOOSE.match(stripped)
        if m is None:
            self.records -= 1
            return False
        exc_type = m["exc"]
        message = (m["msg"] or "").strip()[:MAX_MESSAGE_CHARS]
        kind = words.classify(exc_type, message)
        if self.kind is None or FAILURE_RANK[kind] < FAILURE_RANK[self.kind]:
            self.kind = kind
        self.exc_type, self.message = exc_type, message
        return True

    def close(self, words: FailureWords) -> Failure | None:
        """The traceback as one failure; None for frames alone, with neither head nor
        exception line (they say nothing of what failed)."""
        if self.cut_head and self.exc_type is None and not self.message:
            return None
        kind = self.kind or "other"
        if self.joined:  # a wrapped message joined: its whole text decides
            joined = words.classify(self.exc_type, self.message)
            if FAILURE_RANK[joined] < FAILURE_RANK[kind]:
                kind = joined
        if kind == "other" and self.first_line:
            # `Exception in worker ... while processing method init_device: NCCL error: ...,
            # Traceback (most recent call last):` names the error before the frames
            kind = words.classify(None, self.first_line)
        message = self.message
        if not message:
            message = self.first_line if kind != "other" else CUT_TRACEBACK
        return words.failure(
            kind=kind,
            message=message,
            exc_type=self.exc_type,
            first_line=self.first_line,
            records=self.records,
            last_offset=self.last_offset,
            offset=self.offset,
            ts=self.ts,
            process=self.process,
            pid=self.pid,
        )


Segment = Callable[[Head, int], list[Event]]


class Tracebacks:
    """The tracebacks open now, per process, and an exception line held for one record."""

    def __init__(self, words: FailureWords) -> None:
        self._words = words
        self._open: dict[tuple[str | None, int | None], _Traceback] = {}
        self._wrapped: _Traceback | None = None  # an exception line whose end may come next
        self.active = False  # one is open or held: the next record must be seen, whatever it is

    def segment(
        self, head: Head, offset: int, last_ts: float | None, parse: Segment, again: Segment
    ) -> list[Event]:
        """The events of one segment (not a client's text): part of a traceback, its end, the
        opening of one, or `parse`d as usual. `again`: the caller's segment, for a record that
        turns out not to continue a held exception line."""
        if self._wrapped is not None:
            return self._wrapped_piece(head, offset, again)
        key = (head.process, head.pid)
        body = head.body
        tb = self._open.get(key)
        if tb is not None:
            done = tb.take(head, offset, self._words)
            if done is None:
                return []
            del self._open[key]
            if done:
                # Held for one record: a chained exception (`During handling of the above
                # exception ...`) continues it, a terminal-wrapped exception line goes on.
                tb.tail_open = tb.process is not None and may_continue(body)
                self._wrapped = tb
                return []
            self.active = bool(self._open)
            # Not part of the traceback after all: close it, then parse the record as usual.
            closed = tb.close(self._words)
            return [*([closed] if closed is not None else []), *parse(head, offset)]
        # `EngineCore hit an exception: Traceback (most recent call last):` opens one too; so
        # does a frame with no traceback open: the log begins inside one (a tail of a log),
        # and its exception line, when it comes, names the failure.
        head_line = head.level in TRACEBACK_LEVELS and body.rstrip().endswith(TRACEBACK_START)
        if head_line or (
            head.level in CUT_LEVELS and body[:1].isspace() and body.lstrip().startswith('File "')
        ):
            self.active = True
            self._open[key] = _Traceback.opened(head, offset, last_ts, not head_line)
            return []
        events = parse(head, offset)
        if head.level is None and head.process is not None and may_continue(body) and events:
            return self._hold_wrapped(events)
        return events

    def flush(self) -> list[Event]:
        """End of input: close any open traceback (a log cut off mid-traceback)."""
        held = [self._wrapped] if self._wrapped is not None else []
        closed = [tb.close(self._words) for tb in [*held, *self._open.values()]]
        self._open.clear()
        self._wrapped = None
        self.active = False
        return [f for f in closed if f is not None]

    def _hold_wrapped(self, events: list[Event]) -> list[Event]:
        """A bare prefixed exception line that may go on in the next record: its failure waits."""
        failure = next((e for e in events if type(e) is Failure), None)
        if failure is None or failure.exc_type is None:
            return events
        self._wrapped = _Traceback(
            offset=failure.offset,
            ts=failure.ts,
            process=failure.process,
            pid=failure.pid,
            first_line=failure.first_line,
            last_offset=failure.last_offset,
            exc_type=failure.exc_type,
            message=failure.message,
            kind=failure.kind,
            tail_open=True,
        )
        self.active = True  # the next record must be seen, whatever it holds
        return [e for e in events if e is not failure]

    def _wrapped_piece(self, head: Head, offset: int, again: Segment) -> list[Event]:
        """The record after a held exception line: its continuation, or something else."""
        tb = self._wrapped
        assert tb is not None
        key = (head.process, head.pid)
        if key == (tb.process, tb.pid) and head.body.lstrip().startswith(CHAIN_MARKERS):
            # a chained exception: one traceback, its last exception the one raised
            tb.records += 1
            tb.last_offset = offset
            self._wrapped = None
            self._open[key] = tb
            return []
        piece = tb.tail_open and is_piece(head)
        if piece:
            tb.message = (tb.message + head.body.rstrip())[:MAX_MESSAGE_CHARS]
            tb.records += 1
            tb.last_offset = offset
            tb.joined = True
            tb.tail_open = may_continue(head.body)
            if tb.tail_open and tb.records < MAX_TRACEBACK_RECORDS:
                return []
        self._wrapped = None
        self.active = bool(self._open)
        closed = tb.close(self._words)
        done: list[Event] = [closed] if closed is not None else []
        return done if piece else [*done, *again(head, offset)]
