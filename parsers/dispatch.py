"""A catalog run over one record: its entries per mode and record level, the needles that make a
record worth parsing, and `parse_segment` (one segment of one record in, events out). Pure.

Two modes. While the engine starts, every catalog message matters. Once its API server is up,
the log is mostly request lines and only warnings, errors, tracebacks, stalls and the markers of
a new start matter: a much smaller needle set keeps the pre-filter cheap on a busy server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from loadwatch.parsers.entries import LEVELS, MESSAGE, Entry, Head, Level
from loadwatch.parsers.events import Event, LogError, LogWarning

Mode = Literal["startup", "serving"]
MODES: tuple[Mode, ...] = ("startup", "serving")
# Python logging's level words and a traceback's first line: a record holding one is looked at
# whatever the catalog says (an unknown warning or error is still one).
LEVEL_NEEDLES: frozenset[str] = frozenset(("WARNING", "ERROR", "CRITICAL", "Traceback"))
MAX_MESSAGE_CHARS = 2000


class Dispatch:
    """One catalog's lookup tables (built once) and the parse of a segment against them."""

    def __init__(self, catalog: Sequence[Entry]) -> None:
        self.catalog = tuple(catalog)
        self.table: dict[tuple[Mode, Level], tuple[Entry, ...]] = {
            (mode, level): self._entries(mode, level) for mode in MODES for level in LEVELS
        }
        # Every substring that can make a record worth parsing, per mode.
        self.prefilter: dict[Mode, tuple[str, ...]] = {mode: self._needles(mode) for mode in MODES}
        # The catalog's own words per mode, without the level words ("WARNING", "Traceback", ...)
        self.words: dict[Mode, tuple[str, ...]] = {
            mode: tuple(n for n in needles if n not in LEVEL_NEEDLES)
            for mode, needles in self.prefilter.items()
        }

    def _entries(self, mode: Mode, level: Level) -> tuple[Entry, ...]:
        def wanted(e: Entry) -> bool:
            if level not in e.levels:
                return False
            return mode == "startup" or e.serving or level not in MESSAGE

        return tuple(e for e in self.catalog if wanted(e))

    def _needles(self, mode: Mode) -> tuple[str, ...]:
        entries = self.catalog if mode == "startup" else [e for e in self.catalog if e.serving]
        return tuple(sorted({n for e in entries for n in e.needles} | LEVEL_NEEDLES))

    def has_needle(self, text: str, mode: Mode = "startup") -> bool:
        return _holds_any(text, self.prefilter[mode])

    def has_word(self, text: str, mode: Mode = "startup") -> bool:
        """`has_needle` without the level words: a word of the catalog's own."""
        return _holds_any(text, self.words[mode])

    def parse_segment(self, head: Head, offset: int, mode: Mode = "startup") -> list[Event]:
        """Catalog lookup for one segment whose head has been peeled off (and that is not a
        client's text: the grammar's stream sets those aside first)."""
        body = head.body
        out: list[Event] = []
        # An indented line is a traceback's frame or quoted source (`raise RuntimeError("Engine
        # core initialization failed. "`): never a failure of its own; exception lines start at
        # column 0.
        indented = body[:1] in (" ", "\t") or body.startswith(">   ")  # pytest quotes source so
        at = 0  # where the next message starts: 0, or after one that `more` says may follow
        for entry in self.table[(mode, head.level)]:
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


def _holds_any(text: str, needles: tuple[str, ...]) -> bool:
    for n in needles:  # noqa: SIM110 (a plain loop: no generator per record)
        if n in text:
            return True
    return False


def _after_separator(body: str, end: int) -> int:
    """Where a second message on the same line starts (`CPU KV cache size: N tokens, Maximum
    concurrency for ...`): after the `, ` or `. ` that ends the first."""
    while end < len(body) and body[end] in ",.; ":
        end += 1
    return end
