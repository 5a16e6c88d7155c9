"""From records to events: the per-record parse (segment.py) and the little context it needs.

`parse_segment` is pure: one segment of one record in, events out. `EventStream` adds the context
that spans records and nothing else: tracebacks folded into one `Failure` (parsers/traceback.py,
with the catalog's words for what failed), the process of a tqdm bar whose prefix stood in the
record before it (a bar's owner and time: parsers/bars.py), and the time of records that carry
none. Records that contain no catalog needle are dropped before any other work, unless a
traceback is open, so the chunk scanner (scan.py) that only hands over candidate records yields
the same events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loadwatch.parsers.bars import Bars
from loadwatch.parsers.dispatch import (
    Mode,
)
from loadwatch.parsers.entries import (
    Head,
)
from loadwatch.parsers.events import (
    Event,
    Milestone,
    Record,
    ShardProgress,
)
from loadwatch.parsers.recipes import (
    Maker,
    Recipe,
    cook,
    recipe_of,
    set_fields,
)
from loadwatch.parsers.stream import Stream
from loadwatch.parsers.traceback import (
    CUT_LEVELS,
    TRACEBACK_LEVELS,
    TRACEBACK_START,
    FailureWords,
    Tracebacks,
)
from loadwatch.parsers.vllm.catalog import classify, failure
from loadwatch.parsers.vllm.lines import (
    StandardHeads,
    YearResolver,
    header_end,
    owned,
    parse_head,
    split_segments,
    strip_ansi,
)
from loadwatch.parsers.vllm.segment import (
    MAX_PARSE_CHARS,
    PARSE_CACHE_MAX,
    PREFIX_RECORD_MAX,
    ClientLines,
    has_needle,
    parse_segment,
)

# A message read before, whose one event comes from a recipe (the mode it was read in, the maker
# and values of its recipe, the level and source of its header): such a record is neither a
# traceback's start or part, nor client text; under a header of the same level and source, what
# it yields depends on its message alone, and its header gives the event its time.
_Plan = tuple[Mode, Maker, tuple[Any, ...], str, str]


class EventStream(Stream):
    """Feeds records in order, returns events. One instance per followed log."""

    def __init__(self, ref_ts: float | None = None) -> None:
        self.years = YearResolver(ref_ts)
        self._tracebacks = Tracebacks(FailureWords(classify, failure))
        self._pending_prefix: tuple[str, int | None] | None = None
        self._last_ts: float | None = None
        # The header time of the last quiet record, when it came after `_last_ts`: read only if
        # a record without a time of its own needs it (`_last_time`)
        self._quiet_stamp: bytes | str | None = None
        self._bars = Bars()
        self._heads = StandardHeads(self.years)
        self._recipes: dict[tuple[str, str | None, str | None, str], Recipe] = {}
        # A record's message (after its prefix and header) -> how the common case made its one
        # event (`_Plan`): the workers print the same lines, each second under a new header
        self._plans: dict[str, _Plan] = {}
        self.mode: Mode = "startup"
        self._clients = ClientLines()

    @property
    def in_traceback(self) -> bool:
        """A traceback is open (or an exception line held): every record must be seen."""
        return self._tracebacks.active

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
        if len(text) > MAX_PARSE_CHARS:
            # Every message the catalog knows is far shorter; a longer record is a dump whose
            # start tells what it is. Parsing only the start bounds a record's cost, however long.
            text = text[:MAX_PARSE_CHARS]
        pending = self._pending_prefix
        self._pending_prefix = None
        tracebacks = self._tracebacks
        if not candidate and not tracebacks.active and not has_needle(text, self.mode):
            self._note_prefix(text)
            return []
        spot = self._heads.spot(text)
        rest: str | None = None
        if spot is None:
            head = None
        else:
            process, pid, p = spot
            k = header_end(text, p) if not tracebacks.active else -1
            if k > 0:
                # A message read before, behind any prefix and under a header of the common
                # shape with a time: what the common case below made of it (`_Plan`), unless
                # the record goes on the client text before it.
                header = self._heads.header(text[p:k])
                plan = self._plans.get(text[k:]) if header is not False else None
                if plan is not None and header is not False:
                    mode, make, values, said_level, said_by = plan
                    level_now, ts, source = header
                    if (
                        mode == self.mode
                        and said_level == level_now
                        and said_by == source
                        and ts is not None
                    ):
                        if process is None and pending is not None:
                            process, pid = pending
                        before = self._clients.header
                        if before is None or before != (process, pid, level_now, ts, source):
                            self._last_ts, self._quiet_stamp = ts, None
                            return [make(values, offset, ts, process, pid)]
            rest = text[p:]
            head = self._heads.rest_head(process, pid, rest)
        if head is None:
            out = self._general(text, offset, pending)
        else:
            if head.process is None and pending is not None:
                head = owned(head, pending)
            ts = head.ts
            level = head.level
            body = head.body
            if (
                tracebacks.active
                or ts is None
                or (level in TRACEBACK_LEVELS and body.rstrip().endswith(TRACEBACK_START))
                or (level in CUT_LEVELS and body[:1].isspace())  # (a frame: `_segment`)
            ):
                out = self._segment(head, offset)
            else:  # `_segment` for the common case: no traceback to join, none to open
                self._last_ts, self._quiet_stamp = ts, None
                kind = self._clients.kind(head)
                if kind is not None:
                    out = self._clients.aside(kind, head, offset, self.mode)
                else:
                    recipe = self._recipes.get((self.mode, level, head.source, head.body))
                    if recipe is not None and len(recipe) == 1:
                        # `_parse` of a message read before, whose one event is neither a bar
                        # nor a milestone (`recipe_of`): made from its recipe
                        make, values = recipe[0]
                        if rest is not None and level is not None and head.source is not None:
                            # (a header with a time: `rest_head` read it by `header_end`)
                            if len(self._plans) >= PARSE_CACHE_MAX:
                                self._plans.clear()
                            self._plans[body] = (self.mode, make, values, level, head.source)
                        return [make(values, offset, ts, head.process, head.pid)]
                    out = self._parse(head, offset)
        if out:
            for event in out:
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
                head = owned(head, pending)
            out.extend(self._segment(head, offset))
            if self._clients.last_offset == offset:
                break  # a process prefix after it is the client's text, not another line
        return out

    def plain(self, text: str) -> None:
        """`feed_text` of a record the caller knows holds no needle of the current mode, while
        no traceback is open: only a process prefix in it matters."""
        self._pending_prefix = None
        self._note_prefix(text)

    def _note_prefix(self, text: str) -> None:
        # A prefix alone in its record names the process of the `\r` bar that follows.
        if "pid=" in text and len(text) <= PREFIX_RECORD_MAX:
            lone = self._heads.lone_prefix(text)
            if lone is not None:
                self._pending_prefix = lone
                return
            if self._heads.says_more(text):
                return
            head = parse_head(strip_ansi(text), self.years)
            if head.prefix_only and head.process is not None:
                self._pending_prefix = (head.process, head.pid)

    def quiet(self, stamp: bytes | str) -> None:
        """Candidate records the caller proved to yield nothing (single-segment INFO or DEBUG
        records with no catalog needle, outside any traceback), `stamp` the header time of the
        last: what feeding them would leave, at a fraction of the cost."""
        self._pending_prefix = None
        self._quiet_stamp = stamp

    def _last_time(self) -> float | None:
        """The time of the last record that had one (a quiet record's is read now)."""
        stamp = self._quiet_stamp
        if stamp is not None:
            self._quiet_stamp = None
            ts = self.years.stamp(stamp)
            if ts is not None:
                self._last_ts = ts
        return self._last_ts

    def feed_all(self, records: Iterable[Record]) -> list[Event]:
        out: list[Event] = []
        for r in records:
            out.extend(self.feed(r))
        out.extend(self.flush())
        return out

    def flush(self) -> list[Event]:
        """End of input: close any open traceback (a log cut off mid-traceback)."""
        return self._tracebacks.flush()

    # -- internals --------------------------------------------------------------------------

    def _segment(self, head: Head, offset: int) -> list[Event]:
        if head.ts is not None:
            self._last_ts, self._quiet_stamp = head.ts, None
        kind = self._clients.kind(head)
        if kind is not None:  # never part of a traceback, never the start of one
            return self._clients.aside(kind, head, offset, self.mode)
        tracebacks = self._tracebacks
        opening = not tracebacks.active
        out = tracebacks.segment(head, offset, self._last_time(), self._parse, self._segment)
        if opening and tracebacks.active:
            # A client's lines are written at once, so none goes on across a traceback's
            # start; and the chunk scanner skips the client text before it unseen, then walks
            # every record: forgetting the header here makes both read the same.
            self._clients.header = None
        return out

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
        if head.ts is None:
            last = self._last_time()
            if last is not None:
                return [self._timed(e, last) for e in events]
        return events

    def _timed(self, event: Event, last: float) -> Event:
        """Give a record without a header a time (`last`, the last record's): bars from their
        own elapsed field."""
        if isinstance(event, ShardProgress) and event.elapsed_s is not None:
            at = self._bars.time(event.process, event.desc, event.done, event.elapsed_s, last)
            set_fields(event, ts=at)
        else:
            set_fields(event, ts=last)
        return event
