"""Whole-chunk pre-filter: find the few records worth parsing with C-level substring scans.

A chunk is a run of complete records as the follower hands them over. Instead of splitting it into
records and testing each one, every pre-filter needle is searched over the whole chunk with
`bytes.find`, and only the records around the hits are decoded and fed to the `EventStream`. While
a traceback is open every record matters, so the scanner then walks records one by one until it
closes. The result is the same event list as feeding every record (a property test checks this).
"""

from __future__ import annotations

from collections.abc import Iterator

from loadwatch.parsers.events import Event, Record
from loadwatch.parsers.stream import PREFILTER_NEEDLES, EventStream, has_needle

_NEEDLES_B = tuple(n.encode() for n in PREFILTER_NEEDLES)
_PREFIX_TAIL = 256  # a prefix-only record is short; keep this much of the previous chunk
_TERMINATORS = (0x0A, 0x0D)


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def split_records(data: bytes, base: int = 0, file_id: str | None = None) -> Iterator[Record]:
    """Every non-empty record in `data`; `\\n`, `\\r\\n` and lone `\\r` all end a record."""
    start = 0
    n = len(data)
    while start < n:
        i = _next_terminator(data, start, n)
        if i > start:
            yield Record(decode(data[start:i]), base + start, file_id)
        start = i + 1


def _next_terminator(data: bytes, start: int, end: int) -> int:
    lf = data.find(b"\n", start, end)
    cr = data.find(b"\r", start, lf if lf >= 0 else end)
    if cr >= 0:
        return cr
    return lf if lf >= 0 else end


def _record_start(data: bytes, pos: int) -> int:
    return max(data.rfind(b"\n", 0, pos), data.rfind(b"\r", 0, pos)) + 1


class ChunkScanner:
    """Feed chunks of whole records; get the events `EventStream.feed` would give for each."""

    def __init__(self, stream: EventStream | None = None) -> None:
        self.stream = stream if stream is not None else EventStream()
        self.lines = 0  # terminators seen: a cheap record count for health metrics
        self._tail = b""  # the last record of the previous chunk, if short

    def feed(self, data: bytes, base: int = 0, file_id: str | None = None) -> list[Event]:
        self.lines += data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
        out: list[Event] = []
        n = len(data)
        pos = 0
        stream = self.stream
        for start in self._candidates(data):
            if start < pos:
                continue
            if stream.in_traceback:
                pos = self._walk(data, pos, base, file_id, out)
                if start < pos:
                    continue
            self._feed_prefix_before(data, start, base, file_id, out)
            end = _next_terminator(data, start, n)
            out.extend(stream.feed(Record(decode(data[start:end]), base + start, file_id)))
            pos = end + 1
        if stream.in_traceback:
            self._walk(data, pos, base, file_id, out)
        last = _record_start(data, max(n - 1, 0))
        self._tail = data[last:] if n - last <= _PREFIX_TAIL else b""
        return out

    def _walk(self, data: bytes, pos: int, base: int, file_id: str | None, out: list[Event]) -> int:
        """Feed every record from `pos` while a traceback is open; return where it stopped."""
        n = len(data)
        stream = self.stream
        while pos < n and stream.in_traceback:
            end = _next_terminator(data, pos, n)
            if end > pos:
                out.extend(stream.feed(Record(decode(data[pos:end]), base + pos, file_id)))
            pos = end + 1
        return pos

    def _feed_prefix_before(
        self, data: bytes, start: int, base: int, file_id: str | None, out: list[Event]
    ) -> None:
        """Feed the record before a candidate when it may be a prefix alone (`(P pid=1) \\r`)."""
        j = start
        while j > 0 and data[j - 1] in _TERMINATORS:
            j -= 1
        if j == 0:
            prev = self._tail.rstrip(b"\r\n")
            prev_start = _record_start(prev, len(prev))
            offset = base - len(self._tail) + prev_start
            prev = prev[prev_start:]
        else:
            prev_start = _record_start(data, j)
            prev = data[prev_start:j]
            offset = base + prev_start
        if prev and len(prev) <= _PREFIX_TAIL and prev.rstrip().endswith(b")") and b"pid=" in prev:
            text = decode(prev)
            if not has_needle(text):  # a candidate itself was fed already
                out.extend(self.stream.feed(Record(text, offset, file_id)))

    def _candidates(self, data: bytes) -> list[int]:
        starts: set[int] = set()
        n = len(data)
        for needle in _NEEDLES_B:
            i = data.find(needle)
            while i >= 0:
                s = _record_start(data, i)
                starts.add(s)
                e = _next_terminator(data, i, n)
                i = data.find(needle, e + 1)
        return sorted(starts)
