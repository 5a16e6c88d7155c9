"""From records to events: the pure per-record parse, and the little context it needs.

`parse_segment` is pure: one segment of one record in, events out. `EventStream` adds the context
that spans records and nothing else: tracebacks folded into one `Failure`, the process of a tqdm
bar whose prefix stood in the record before it, and the time of records that carry none. Records
that contain no catalog needle are dropped before any other work, unless a traceback is open, so
the chunk scanner (scan.py) that only hands over candidate records yields the same events.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from loadwatch.parsers.catalog import (
    CATALOG,
    EXCEPTION_LINE,
    EXCEPTION_LINE_LOOSE,
    KIND_RANK,
    MESSAGE,
    Entry,
    Level,
    classify,
)
from loadwatch.parsers.events import (
    Event,
    Failure,
    FailureKind,
    LogError,
    LogWarning,
    Milestone,
    Record,
    ShardProgress,
)
from loadwatch.parsers.lines import Head, YearResolver, parse_head, split_segments, strip_ansi

TRACEBACK_START = "Traceback (most recent call last):"
_CHAIN_MARKERS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
_LEVELS: tuple[Level, ...] = (None, "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LEVEL_NEEDLES = ("WARNING", "ERROR", "CRITICAL", "Traceback")

# Two modes. While vLLM starts, every catalog message matters. Once the API server is up, the log
# is mostly request lines and only warnings, errors, tracebacks, stalls and the markers of a new
# start matter: a much smaller needle set keeps the pre-filter cheap on a busy server.
Mode = Literal["startup", "serving"]


def _entries(mode: Mode, level: Level) -> tuple[Entry, ...]:
    def wanted(e: Entry) -> bool:
        if level not in e.levels:
            return False
        return mode == "startup" or e.serving or level not in MESSAGE

    return tuple(e for e in CATALOG if wanted(e))


def _needles(mode: Mode) -> tuple[str, ...]:
    entries = CATALOG if mode == "startup" else tuple(e for e in CATALOG if e.serving)
    return tuple(sorted({n for e in entries for n in e.needles} | set(_LEVEL_NEEDLES)))


DISPATCH: dict[tuple[Mode, Level], tuple[Entry, ...]] = {
    (mode, level): _entries(mode, level) for mode in ("startup", "serving") for level in _LEVELS
}
# Every substring that can make a record worth parsing, per mode.
PREFILTER: dict[Mode, tuple[str, ...]] = {
    "startup": _needles("startup"),
    "serving": _needles("serving"),
}
PREFILTER_NEEDLES = PREFILTER["startup"]
MAX_TRACEBACK_RECORDS = 2000
PREFIX_RECORD_MAX = 256  # a record holding only a process prefix (colour codes included)
MAX_MESSAGE_CHARS = 2000


def _set(event: Event, **values: Any) -> None:
    """Fill in a field of an event this module just built and nobody else holds yet."""
    for name, value in values.items():
        object.__setattr__(event, name, value)


def has_needle(text: str, mode: Mode = "startup") -> bool:
    return any(n in text for n in PREFILTER[mode])


def parse_segment(head: Head, offset: int, mode: Mode = "startup") -> list[Event]:
    """Catalog lookup for one segment whose head has been peeled off. Pure."""
    body = head.body
    out: list[Event] = []
    for entry in DISPATCH[(mode, head.level)]:
        for needle in entry.needles:
            if needle in body:
                break
        else:
            continue
        m = entry.pattern.search(body)
        if m is None:
            continue
        ctx = {"offset": offset, "ts": head.ts, "process": head.process, "pid": head.pid}
        event = entry.build(m, head, ctx)
        if event is not None:
            out.append(event)
            if not entry.more:
                return out
    if out or head.level not in ("WARNING", "ERROR", "CRITICAL"):
        return out
    message = body.strip()[:MAX_MESSAGE_CHARS]
    if not message:
        return out  # a header with nothing after it
    cls = LogWarning if head.level == "WARNING" else LogError
    return [
        cls(
            source=head.source,
            message=message,
            offset=offset,
            ts=head.ts,
            process=head.process,
            pid=head.pid,
        )
    ]


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


@dataclass(slots=True)
class _BarAnchor:
    start_ts: float
    last_done: int


@dataclass
class StreamStats:
    records: int = 0
    candidates: int = 0
    events: int = 0
    tracebacks: int = 0
    by_type: dict[str, int] = field(default_factory=dict)


class EventStream:
    """Feeds records in order, returns events. One instance per followed log."""

    def __init__(self, ref_ts: float | None = None) -> None:
        self.years = YearResolver(ref_ts)
        self.stats = StreamStats()
        self._tracebacks: dict[tuple[str | None, int | None], _Traceback] = {}
        self._pending_prefix: tuple[str, int | None] | None = None
        self._last_ts: float | None = None
        self._bars: dict[tuple[str | None, str], _BarAnchor] = {}
        self._bar_owner: dict[str, tuple[str, int | None]] = {}
        self.mode: Mode = "startup"

    @property
    def in_traceback(self) -> bool:
        return bool(self._tracebacks)

    def forget_pending(self) -> None:
        """Records were skipped unseen: a prefix seen before them names nothing now."""
        self._pending_prefix = None

    def feed(self, record: Record, candidate: bool = False) -> list[Event]:
        """Events of one record. `candidate=True`: the caller knows it holds a needle of the
        current mode (the chunk scanner does), so the pre-filter test is skipped."""
        self.stats.records += 1
        pending, self._pending_prefix = self._pending_prefix, None
        text = record.text
        if not candidate and not self._tracebacks and not has_needle(text, self.mode):
            # A prefix alone in its record names the process of the `\r` bar that follows.
            if "pid=" in text and len(text) <= PREFIX_RECORD_MAX:
                head = parse_head(strip_ansi(text), self.years)
                if head.prefix_only and head.process is not None:
                    self._pending_prefix = (head.process, head.pid)
            return []
        self.stats.candidates += 1
        out: list[Event] = []
        for i, segment in enumerate(split_segments(strip_ansi(text))):
            head = parse_head(segment, self.years)
            if head.prefix_only:
                if head.process is not None:
                    self._pending_prefix = (head.process, head.pid)
                continue
            if i == 0 and head.process is None and pending is not None:
                head = Head(pending[0], pending[1], head.level, head.ts, head.source, head.body)
            out.extend(self._segment(head, record.offset))
        for event in out:
            self.stats.events += 1
            self.stats.by_type[event.type] = self.stats.by_type.get(event.type, 0) + 1
            if isinstance(event, Milestone):
                if event.kind == "app_startup_complete":
                    self.mode = "serving"
                elif event.kind in ("version", "model_load_start"):
                    self.mode = "startup"
        return out

    def feed_all(self, records: Iterable[Record]) -> list[Event]:
        out: list[Event] = []
        for r in records:
            out.extend(self.feed(r))
        out.extend(self.flush())
        return out

    def flush(self) -> list[Event]:
        """End of input: close any open traceback (a log cut off mid-traceback)."""
        out: list[Event] = [self._close(tb) for tb in list(self._tracebacks.values())]
        self._tracebacks.clear()
        return out

    # -- internals --------------------------------------------------------------------------

    def _segment(self, head: Head, offset: int) -> list[Event]:
        if head.ts is not None:
            self._last_ts = head.ts
        key = (head.process, head.pid)
        body = head.body
        tb = self._tracebacks.get(key)
        if tb is not None:
            done = self._traceback_line(tb, head, offset)
            if done is None:
                return []
            del self._tracebacks[key]
            if done:
                return [self._close(tb)]
            # Not part of the traceback after all: close it, then parse the record as usual.
            return [self._close(tb), *self._parse(head, offset)]
        # `EngineCore hit an exception: Traceback (most recent call last):` opens one too.
        if body.rstrip().endswith(TRACEBACK_START) and head.level in (None, "ERROR", "CRITICAL"):
            self.stats.tracebacks += 1
            self._tracebacks[key] = _Traceback(
                offset=offset,
                ts=head.ts if head.ts is not None else self._last_ts,
                process=head.process,
                pid=head.pid,
                first_line=body.strip()[:500],
                last_offset=offset,
            )
            return []
        return self._parse(head, offset)

    def _parse(self, head: Head, offset: int) -> list[Event]:
        events = parse_segment(head, offset, self.mode)
        if events and isinstance(events[0], ShardProgress):
            events[0] = self._bar_process(events[0])
        if head.ts is None and self._last_ts is not None:
            return [self._timed(e) for e in events]
        return events

    def _bar_process(self, event: ShardProgress) -> ShardProgress:
        """`\r`-only bars repeat no prefix: an update belongs to whoever drew that bar last."""
        if event.process is not None:
            self._bar_owner[event.desc] = (event.process, event.pid)
            return event
        owner = self._bar_owner.get(event.desc)
        if owner is not None:
            _set(event, process=owner[0], pid=owner[1])
        return event

    def _timed(self, event: Event) -> Event:
        """Give a record without a header a time: bars from their own elapsed field."""
        assert self._last_ts is not None
        if isinstance(event, ShardProgress) and event.elapsed_s is not None:
            key = (event.process, event.desc)
            anchor = self._bars.get(key)
            if anchor is None or event.done < anchor.last_done or event.done == 0:
                anchor = _BarAnchor(self._last_ts - event.elapsed_s, event.done)
                self._bars[key] = anchor
            anchor.last_done = event.done
            _set(event, ts=anchor.start_ts + event.elapsed_s)
        else:
            _set(event, ts=self._last_ts)
        return event

    def _traceback_line(self, tb: _Traceback, head: Head, offset: int) -> bool | None:
        """None: the line belongs to the traceback; True: it ended it; False: not ours."""
        body = head.body
        stripped = body.strip()
        if head.level in ("INFO", "DEBUG", "WARNING") or tb.records >= MAX_TRACEBACK_RECORDS:
            return False
        tb.records += 1
        tb.last_offset = offset
        if not stripped or body[:1].isspace() or stripped.startswith(TRACEBACK_START):
            return None
        if stripped.startswith(_CHAIN_MARKERS) or stripped.startswith("^"):
            return None
        m = EXCEPTION_LINE.match(stripped) or EXCEPTION_LINE_LOOSE.match(stripped)
        if m is None:
            tb.records -= 1
            return False
        exc_type = m["exc"]
        message = (m["msg"] or "").strip()[:MAX_MESSAGE_CHARS]
        kind = classify(exc_type, message)
        if tb.kind is None or KIND_RANK[kind] < KIND_RANK[tb.kind]:
            tb.kind = kind
        tb.exc_type, tb.message = exc_type, message
        return True

    def _close(self, tb: _Traceback) -> Failure:
        return Failure(
            kind=tb.kind or "other",
            message=tb.message or "traceback without an exception line",
            exc_type=tb.exc_type,
            first_line=tb.first_line,
            records=tb.records,
            last_offset=tb.last_offset,
            offset=tb.offset,
            ts=tb.ts,
            process=tb.process,
            pid=tb.pid,
        )
