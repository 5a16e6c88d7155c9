"""From records to events: the per-record parse (segment.py) and the little context it needs.

`parse_segment` is pure: one segment of one record in, events out. `EventStream` adds the context
that spans records and nothing else: tracebacks folded into one `Failure`, the process of a tqdm
bar whose prefix stood in the record before it (a bar's owner and time: parsers/bars.py), and the
time of records that carry none. Records
that contain no catalog needle are dropped before any other work, unless a traceback is open, so
the chunk scanner (scan.py) that only hands over candidate records yields the same events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from loadwatch.parsers.bars import Bars
from loadwatch.parsers.dispatch import (
    MAX_MESSAGE_CHARS,
    Mode,
)
from loadwatch.parsers.entries import (
    Head,
)
from loadwatch.parsers.events import (
    FAILURE_RANK,
    Event,
    Failure,
    FailureKind,
    Milestone,
    Record,
    ShardProgress,
)
from loadwatch.parsers.recipes import (
    Recipe,
    cook,
    recipe_of,
    set_fields,
)
from loadwatch.parsers.vllm.catalog import (
    CUT_TRACEBACK,
    EXCEPTION_LINE,
    EXCEPTION_LINE_LOOSE,
    classify,
    failure,
)
from loadwatch.parsers.vllm.lines import (
    StandardHeads,
    YearResolver,
    parse_head,
    split_segments,
    strip_ansi,
)
from loadwatch.parsers.vllm.segment import (
    CHAIN_MARKERS,
    MAX_PARSE_CHARS,
    MAX_TRACEBACK_RECORDS,
    PARSE_CACHE_MAX,
    PREFIX_RECORD_MAX,
    TRACEBACK_LEVELS,
    TRACEBACK_START,
    ClientLines,
    has_needle,
    parse_segment,
)
from loadwatch.parsers.vllm.wrapped import is_piece, may_continue

# A traceback's frames logged with these levels (vLLM's ERROR header on each of its lines) are
# read even without the traceback's head: a log may begin inside one.
CUT_LEVELS = ("ERROR", "CRITICAL")


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

    def take(self, head: Head, offset: int) -> bool | None:
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
        kind = classify(exc_type, message)
        if self.kind is None or FAILURE_RANK[kind] < FAILURE_RANK[self.kind]:
            self.kind = kind
        self.exc_type, self.message = exc_type, message
        return True

    def close(self) -> Failure | None:
        """The traceback as one failure; None for frames alone, with neither head nor
        exception line (they say nothing of what failed)."""
        if self.cut_head and self.exc_type is None and not self.message:
            return None
        kind = self.kind or "other"
        if self.joined:  # a wrapped message joined: its whole text decides
            joined = classify(self.exc_type, self.message)
            if FAILURE_RANK[joined] < FAILURE_RANK[kind]:
                kind = joined
        if kind == "other" and self.first_line:
            # `Exception in worker ... while processing method init_device: NCCL error: ...,
            # Traceback (most recent call last):` names the error before the frames
            kind = classify(None, self.first_line)
        message = self.message
        if not message:
            message = self.first_line if kind != "other" else CUT_TRACEBACK
        return failure(
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


@dataclass
class StreamStats:
    records: int = 0
    candidates: int = 0
    events: int = 0
    tracebacks: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    truncated: int = 0  # records parsed only up to MAX_PARSE_CHARS


class EventStream:
    """Feeds records in order, returns events. One instance per followed log."""

    def __init__(self, ref_ts: float | None = None) -> None:
        self.years = YearResolver(ref_ts)
        self.stats = StreamStats()
        self._tracebacks: dict[tuple[str | None, int | None], _Traceback] = {}
        self._wrapped: _Traceback | None = None  # an exception line whose end may come next
        self.in_traceback = False  # kept with `_tracebacks`: read for every record
        self._pending_prefix: tuple[str, int | None] | None = None
        self._last_ts: float | None = None
        self._bars = Bars()
        self._heads = StandardHeads(self.years)
        self._recipes: dict[tuple[str, str | None, str | None, str], Recipe] = {}
        self.mode: Mode = "startup"
        self._clients = ClientLines()

    def set_reference(self, ts: float) -> None:
        """The daemon's clock, for the year of stamps that have none (vLLM's)."""
        self.years.set_reference(ts)

    def forget_pending(self) -> None:
        """Records were skipped unseen: a prefix seen before them names nothing now."""
        self._pending_prefix = None

    def feed(self, record: Record, candidate: bool = False) -> list[Event]:
        """Events of one record. `candidate=True`: the caller knows it holds a needle of the
        current mode (the chunk scanner does), so the pre-filter test is skipped."""
        return self.feed_text(record.text, record.offset, candidate)

    def feed_text(self, text: str, offset: int, candidate: bool = False) -> list[Event]:
        """`feed` of a record given as its text and offset."""
        stats = self.stats
        stats.records += 1
        if len(text) > MAX_PARSE_CHARS:
            # Every message the catalog knows is far shorter; a longer record is a dump whose
            # start tells what it is. Parsing only the start bounds a record's cost, however long.
            text = text[:MAX_PARSE_CHARS]
            stats.truncated += 1
        pending = self._pending_prefix
        self._pending_prefix = None
        if not candidate and not self.in_traceback and not has_needle(text, self.mode):
            self._note_prefix(text)
            return []
        stats.candidates += 1
        head = self._heads.head(text)
        if head is None:
            out = self._general(text, offset, pending)
        else:
            if head.process is None and pending is not None:
                head = head._replace(process=pending[0], pid=pending[1])
            ts = head.ts
            level = head.level
            body = head.body
            if (
                self.in_traceback
                or ts is None
                or (level in TRACEBACK_LEVELS and body.rstrip().endswith(TRACEBACK_START))
                or (level in CUT_LEVELS and body[:1].isspace())  # (a frame: `_segment`)
            ):
                out = self._segment(head, offset)
            else:  # `_segment` for the common case: no traceback to join, none to open
                self._last_ts = ts
                kind = self._clients.kind(head)
                if kind is not None:
                    out = self._clients.aside(kind, head, offset, self.mode)
                else:
                    recipe = self._recipes.get((self.mode, level, head.source, head.body))
                    if recipe is not None and len(recipe) == 1:
                        # `_parse` of a message read before, whose one event is neither a bar
                        # nor a milestone (`recipe_of`): made from its recipe
                        make, values = recipe[0]
                        event = make(values, offset, ts, head.process, head.pid)
                        stats.events += 1
                        by_type = stats.by_type
                        by_type[event.type] = by_type.get(event.type, 0) + 1
                        return [event]
                    out = self._parse(head, offset)
        if out:
            stats.events += len(out)
            by_type = stats.by_type
            for event in out:
                by_type[event.type] = by_type.get(event.type, 0) + 1
                if type(event) is Milestone:
                    if event.kind == "app_startup_complete":
                        self.mode = "serving"
                    elif event.kind in ("version", "model_load_start"):
                        self.mode = "startup"
        return out

    def _general(
        self, text: str, offset: int, pending: tuple[str, int | None] | None
    ) -> list[Event]:
        """Any record: colour codes, several processes' lines in one, no or another header."""
        out: list[Event] = []
        for i, segment in enumerate(split_segments(strip_ansi(text))):
            head = parse_head(segment, self.years)
            if head.prefix_only:
                if head.process is not None:
                    self._pending_prefix = (head.process, head.pid)
                continue
            if i == 0 and head.process is None and pending is not None:
                head = head._replace(process=pending[0], pid=pending[1])
            out.extend(self._segment(head, offset))
            if self._clients.last_offset == offset:
                break  # a process prefix after it is the client's text, not another line
        return out

    def plain(self, text: str) -> None:
        """`feed_text` of a record the caller knows holds no needle of the current mode, while
        no traceback is open: only a process prefix in it matters."""
        self.stats.records += 1
        self._pending_prefix = None
        self._note_prefix(text)

    def _note_prefix(self, text: str) -> None:
        # A prefix alone in its record names the process of the `\r` bar that follows.
        if "pid=" in text and len(text) <= PREFIX_RECORD_MAX:
            lone = self._heads.lone_prefix(text)
            if lone is not None:
                self._pending_prefix = lone
                return
            head = parse_head(strip_ansi(text), self.years)
            if head.prefix_only and head.process is not None:
                self._pending_prefix = (head.process, head.pid)

    def quiet(self, stamp: bytes | str, records: int = 1) -> None:
        """Candidate records the caller proved to yield nothing (single-segment INFO or DEBUG
        records with no catalog needle, outside any traceback), `stamp` the header time of the
        last: what feeding them would leave, at a fraction of the cost."""
        self.stats.records += records
        self.stats.candidates += records
        self._pending_prefix = None
        ts = self.years.stamp(stamp)
        if ts is not None:
            self._last_ts = ts

    def feed_all(self, records: Iterable[Record]) -> list[Event]:
        out: list[Event] = []
        for r in records:
            out.extend(self.feed(r))
        out.extend(self.flush())
        return out

    def flush(self) -> list[Event]:
        """End of input: close any open traceback (a log cut off mid-traceback)."""
        held = [self._wrapped] if self._wrapped is not None else []
        closed = [tb.close() for tb in [*held, *self._tracebacks.values()]]
        out: list[Event] = [f for f in closed if f is not None]
        self._tracebacks.clear()
        self._wrapped = None
        self.in_traceback = False
        return out

    # -- internals --------------------------------------------------------------------------

    def _segment(self, head: Head, offset: int) -> list[Event]:
        if head.ts is not None:
            self._last_ts = head.ts
        kind = self._clients.kind(head)
        if kind is not None:  # never part of a traceback, never the start of one
            return self._clients.aside(kind, head, offset, self.mode)
        if self._wrapped is not None:
            return self._wrapped_piece(head, offset)
        key = (head.process, head.pid)
        body = head.body
        tb = self._tracebacks.get(key)
        if tb is not None:
            done = tb.take(head, offset)
            if done is None:
                return []
            del self._tracebacks[key]
            if done:
                # Held for one record: a chained exception (`During handling of the above
                # exception ...`) continues it, a terminal-wrapped exception line goes on.
                tb.tail_open = tb.process is not None and may_continue(body)
                self._wrapped = tb
                return []
            self.in_traceback = bool(self._tracebacks)
            # Not part of the traceback after all: close it, then parse the record as usual.
            closed = tb.close()
            return [*([closed] if closed is not None else []), *self._parse(head, offset)]
        # `EngineCore hit an exception: Traceback (most recent call last):` opens one too; so
        # does a frame with no traceback open: the log begins inside one (a tail of a log),
        # and its exception line, when it comes, names the failure.
        head_line = head.level in TRACEBACK_LEVELS and body.rstrip().endswith(TRACEBACK_START)
        if head_line or (
            head.level in CUT_LEVELS and body[:1].isspace() and body.lstrip().startswith('File "')
        ):
            self.stats.tracebacks += 1
            self.in_traceback = True
            self._tracebacks[key] = _Traceback.opened(head, offset, self._last_ts, not head_line)
            return []
        events = self._parse(head, offset)
        if head.level is None and head.process is not None and may_continue(body) and events:
            return self._hold_wrapped(events, head)
        return events

    def _hold_wrapped(self, events: list[Event], head: Head) -> list[Event]:
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
        self.in_traceback = True  # the next record must be seen, whatever it holds
        return [e for e in events if e is not failure]

    def _wrapped_piece(self, head: Head, offset: int) -> list[Event]:
        """The record after a held exception line: its continuation, or something else."""
        tb = self._wrapped
        assert tb is not None
        key = (head.process, head.pid)
        if key == (tb.process, tb.pid) and head.body.lstrip().startswith(CHAIN_MARKERS):
            # a chained exception: one traceback, its last exception the one raised
            tb.records += 1
            tb.last_offset = offset
            self._wrapped = None
            self._tracebacks[key] = tb
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
        self.in_traceback = bool(self._tracebacks)
        closed = tb.close()
        done: list[Event] = [closed] if closed is not None else []
        return done if piece else [*done, *self._segment(head, offset)]

    def _parse(self, head: Head, offset: int) -> list[Event]:
        key = (self.mode, head.level, head.source, head.body)
        recipe = self._recipes.get(key)
        if recipe is not None:
            events = cook(recipe, offset, head.ts, head)
        else:
            events = parse_segment(head, offset, self.mode)
            if events:
                made = recipe_of(events)
                if made is not None:
                    if len(self._recipes) >= PARSE_CACHE_MAX:
                        self._recipes.clear()
                    self._recipes[key] = made
        if events and isinstance(events[0], ShardProgress):
            events[0] = self._bars.own(events[0])
        if head.ts is None and self._last_ts is not None:
            return [self._timed(e) for e in events]
        return events

    def _timed(self, event: Event) -> Event:
        """Give a record without a header a time: bars from their own elapsed field."""
        assert self._last_ts is not None
        if isinstance(event, ShardProgress) and event.elapsed_s is not None:
            at = self._bars.time(
                event.process, event.desc, event.done, event.elapsed_s, self._last_ts
            )
            set_fields(event, ts=at)
        else:
            set_fields(event, ts=self._last_ts)
        return event
