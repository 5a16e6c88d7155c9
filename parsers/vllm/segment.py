"""The vLLM grammar's per-record parse: its catalog run by the generic dispatch
(parsers/dispatch.py), the records that carry a client's text (`ClientLines`), and the limits
its stream keeps to.
"""

from __future__ import annotations

from typing import Final

from loadwatch.parsers.dispatch import Dispatch, Mode
from loadwatch.parsers.entries import MESSAGE, Head
from loadwatch.parsers.events import ClientText, ClientTextKind, Event
from loadwatch.parsers.vllm.catalog import CATALOG, client_text

DISPATCH = Dispatch(CATALOG)
PREFILTER = DISPATCH.prefilter
parse_segment = DISPATCH.parse_segment
has_needle = DISPATCH.has_needle

PREFIX_RECORD_MAX: Final = 256  # a record holding only a process prefix (colour codes included)
MAX_PARSE_CHARS: Final = 16384  # a record is parsed up to here (the follower's cap is 64 KiB)
# distinct messages whose events are kept as recipes (parsers/recipes.py)
PARSE_CACHE_MAX: Final = 4096


class ClientLines:
    """Which records are text a client chose: of a client-text shape (catalog.py's
    CLIENT_TEXT), or a further line of one. vLLM repeats a message's header on each of its
    lines, and a client can put line breaks into a request id: a record with the very header
    (process, level, time, file:line) of the client-text record before it is more of that text."""

    def __init__(self) -> None:
        # (process, pid, level, time, source) of the last client-text record: a record with the
        # very same is more of its text (read for every record: an attribute, not a property)
        self.header: tuple[object, ...] | None = None
        self._kind: ClientTextKind = "request_received"
        self.last_offset = -1  # where the last one set aside starts

    def kind(self, head: Head) -> ClientTextKind | None:
        process, pid, level, ts, source, body, _prefix_only = head
        if source is not None and (process, pid, level, ts, source) == self.header:
            return self._kind
        kind = client_text(body, level)
        if kind is not None:
            self.header, self._kind = (process, pid, level, ts, source), kind
        return kind

    def aside(self, kind: ClientTextKind, head: Head, offset: int, mode: Mode) -> list[Event]:
        """The event of such a record: one count of its kind. An INFO or DEBUG one holding no
        word of the catalog (only a level word, such as "Traceback") yields nothing, as the
        chunk scanner's quiet records do (plans.py)."""
        self.last_offset = offset
        if head.level in MESSAGE and not DISPATCH.has_word(head.body, mode):
            return []
        return [
            ClientText(kind=kind, offset=offset, ts=head.ts, process=head.process, pid=head.pid)
        ]
