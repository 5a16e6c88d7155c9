"""The pure per-record parse of the vLLM grammar: the catalog's entries per mode and level,
the needles that make a record worth parsing, and `parse_segment` (one segment of one record in,
events out). Repeated messages are built once and copied after that (`recipe_of`, `cook`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, Literal

from loadwatch.parsers.events import (
    ClientText,
    ClientTextKind,
    Event,
    KvScaleWarning,
    LogError,
    LogWarning,
    ScaleFactorWarning,
    StallHint,
)
from loadwatch.parsers.vllm.catalog import (
    CATALOG,
    MESSAGE,
    Entry,
    Level,
    client_text,
)
from loadwatch.parsers.vllm.lines import (
    Head,
)

TRACEBACK_START = "Traceback (most recent call last):"
CHAIN_MARKERS = (
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
# The catalog's own words per mode, without the level words ("WARNING", "Traceback", ...)
_WORDS: dict[Mode, tuple[str, ...]] = {
    mode: tuple(n for n in needles if n not in _LEVEL_NEEDLES)
    for mode, needles in PREFILTER.items()
}
MAX_TRACEBACK_RECORDS = 2000
PREFIX_RECORD_MAX = 256  # a record holding only a process prefix (colour codes included)
MAX_MESSAGE_CHARS = 2000
MAX_PARSE_CHARS = 16384  # a record is parsed up to here (the follower's cap is 64 KiB)
LEVEL_NEEDLES: frozenset[str] = frozenset(_LEVEL_NEEDLES)

# Messages repeat: every tensor-parallel worker prints the same per-layer warning, a noisy
# server the same warning again and again. Their events are built once per distinct message and
# copied after that. Only these types: what they hold besides the record's offset, time and
# process comes from the message alone (a Failure also carries its own offset).
_CACHED_TYPES = (KvScaleWarning, ScaleFactorWarning, LogWarning, LogError, StallHint)
_CONTEXT = ("offset", "ts", "process", "pid")
PARSE_CACHE_MAX = 4096
TRACEBACK_LEVELS = (None, "ERROR", "CRITICAL")  # the record levels a traceback opens at
# (a maker of the event's class, the values of its fields but the context ones)
Maker = Callable[[tuple[Any, ...], int, "float | None", "str | None", "int | None"], Event]
Recipe = tuple[tuple[Maker, tuple[Any, ...]], ...]
_MAKERS: dict[type[Event], Maker] = {}


def _maker(cls: type[Event]) -> Maker:
    """A function that builds an event of `cls` from the values of its message fields and the
    record's context: each field's slot is set by a line of its own through the slot's own
    setter (where `object.__setattr__`, which the frozen dataclass's `__init__` calls, ends),
    generated once per class as dataclasses generates `__init__` (a load builds one such event
    per record)."""
    make = _MAKERS.get(cls)
    if make is None:
        names = [f.name for f in fields(cls) if f.name not in _CONTEXT]
        scope: dict[str, Any] = {"_new": object.__new__, "cls": cls}
        lines = [f"def make(values, {', '.join(_CONTEXT)}):\n    ev = _new(cls)\n"]
        for i, name in enumerate((*names, *_CONTEXT)):
            scope[f"set{i}"] = _slot(cls, name).__set__
            value = f"values[{i}]" if i < len(names) else name
            lines.append(f"    set{i}(ev, {value})\n")
        exec("".join(lines) + "    return ev\n", scope)  # (made from the field names alone)
        make = _MAKERS[cls] = scope["make"]
    return make


def _slot(cls: type, name: str) -> Any:
    """The slot descriptor of field `name` (the class's own, or a base's)."""
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    raise AttributeError(name)


def recipe_of(events: list[Event]) -> Recipe | None:
    if not all(type(e) in _CACHED_TYPES for e in events):
        return None
    out = []
    for e in events:
        names = [f.name for f in fields(e) if f.name not in _CONTEXT]
        out.append((_maker(type(e)), tuple(getattr(e, n) for n in names)))
    return tuple(out)


def cook(recipe: Recipe, offset: int, ts: float | None, head: Head) -> list[Event]:
    """The recipe's events for one record."""
    process, pid = head.process, head.pid
    return [make(values, offset, ts, process, pid) for make, values in recipe]


def set_fields(event: Event, **values: Any) -> None:
    """Fill in a field of an event this module just built and nobody else holds yet."""
    for name, value in values.items():
        object.__setattr__(event, name, value)


def has_needle(text: str, mode: Mode = "startup") -> bool:
    for n in PREFILTER[mode]:  # noqa: SIM110 (a plain loop: no generator per record)
        if n in text:
            return True
    return False


def _after_separator(body: str, end: int) -> int:
    """Where a second message on the same line starts (`CPU KV cache size: N tokens, Maximum
    concurrency for ...`): after the `, ` or `. ` that ends the first."""
    while end < len(body) and body[end] in ",.; ":
        end += 1
    return end


class ClientLines:
    """Which records are text a client chose: of a client-text shape (catalog.py's
    CLIENT_TEXT), or a further line of one. vLLM repeats a message's header on each of its
    lines, and a client can put line breaks into a request id: a record with the very header
    (process, level, time, file:line) of the client-text record before it is more of that text."""

    def __init__(self) -> None:
        self._header: tuple[object, ...] | None = None  # of the last client-text record
        self._kind: ClientTextKind = "request_received"
        self.last_offset = -1  # where the last one set aside starts

    def kind(self, head: Head) -> ClientTextKind | None:
        header = (head.process, head.pid, head.level, head.ts, head.source)
        if head.source is not None and header == self._header:
            return self._kind
        kind = client_text(head.body, head.level)
        if kind is not None:
            self._header, self._kind = header, kind
        return kind

    def aside(self, kind: ClientTextKind, head: Head, offset: int, mode: Mode) -> list[Event]:
        """The event of such a record: one count of its kind. An INFO or DEBUG one holding no
        word of the catalog (only a level word, such as "Traceback") yields nothing, as the
        chunk scanner's quiet records do (plans.py)."""
        self.last_offset = offset
        if head.level in MESSAGE and not any(n in head.body for n in _WORDS[mode]):
            return []
        return [
            ClientText(kind=kind, offset=offset, ts=head.ts, process=head.process, pid=head.pid)
        ]


def parse_segment(head: Head, offset: int, mode: Mode = "startup") -> list[Event]:
    """Catalog lookup for one segment whose head has been peeled off (and that is not a
    client's text: the stream sets those aside first). Pure."""
    body = head.body
    out: list[Event] = []
    # An indented line is a traceback's frame or quoted source (`raise RuntimeError("Engine core
    # initialization failed. "`): never a failure of its own; exception lines start at column 0.
    indented = body[:1] in (" ", "\t") or body.startswith(">   ")  # pytest quotes source so
    at = 0  # where the next message starts: 0, or after one that `more` says may be followed
    for entry in DISPATCH[(mode, head.level)]:
        if indented and entry.severity == "error":
            continue
        for needle in entry.needles:
            if needle in body:
                break
        else:
            continue
        if head.source is not None and not entry.spoken_by(head.source):
            continue  # the words, but another logger's: not this message
        # Only where a message starts: text a client put inside a message is never read.
        m = entry.pattern.match(body, at)
        if m is None:
            continue
        ctx = {"offset": offset, "ts": head.ts, "process": head.process, "pid": head.pid}
        event = entry.build(m, head, ctx)
        if event is not None:
            out.append(event)
            if not entry.more:
                return out
            at = _after_separator(body, m.end())
    if out or indented or head.level not in ("WARNING", "ERROR", "CRITICAL"):
        return out  # an indented line is part of a traceback whose head came before
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
