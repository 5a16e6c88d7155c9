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
from loadwatch.parsers.stream import PREFILTER, PREFIX_RECORD_MAX, EventStream, Mode, has_needle

_NEEDLES_B: dict[Mode, tuple[bytes, ...]] = {
    mode: tuple(n.encode() for n in needles) for mode, needles in PREFILTER.items()
}
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
    lf = data.rfind(b"\n", 0, pos)
    # look for a `\r` only after that newline: an unbounded rfind would scan the whole chunk
    return max(lf, data.rfind(b"\r", lf + 1, pos)) + 1


class ChunkScanner:
    """Feed chunks of whole records; get the events `EventStream.feed` would give for each."""

    def __init__(self, stream: EventStream | None = None) -> None:
        self.stream = stream if stream is not None else EventStream()
        self.lines = 0  # terminators seen: a cheap record count for health metrics
        self._tail = b""  # the last record of the previous chunk, if short
        self._fed_end = -1  # absolute end offset of the last record handed to the stream

    def feed(self, data: bytes, base: int = 0, file_id: str | None = None) -> list[Event]:
        self.lines += data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
        out: list[Event] = []
        n = len(data)
        pos = 0
        stream = self.stream
        mode = stream.mode
        candidates = self._candidates(data, 0, mode)
        i = 0
        while i < len(candidates):
            start = candidates[i]
            i += 1
            if start < pos:
                continue
            if stream.in_traceback:
                pos = self._walk(data, pos, base, file_id, out)
                if start < pos:
                    continue
            self._before(data, start, base, file_id, out)
            end = _next_terminator(data, start, n)
            self._feed(data[start:end], base + start, file_id, out, candidate=True)
            pos = end + 1
            if stream.mode != mode:  # the needle set changed: look again from here
                mode = stream.mode
                candidates = self._candidates(data, pos, mode)
                i = 0
        if stream.in_traceback:
            self._walk(data, pos, base, file_id, out)
        self._keep_tail(data, base)
        return out

    def _keep_tail(self, data: bytes, base: int) -> None:
        """Remember the chunk's last record if it may be a prefix for the next chunk's first."""
        j = len(data)
        while j > 0 and data[j - 1] in _TERMINATORS:
            j -= 1
        last = _record_start(data, j)
        self._tail = b""
        if j == 0 or base + j == self._fed_end:
            return
        if j - last <= PREFIX_RECORD_MAX and b"pid=" in data[last:j]:
            self._tail = data[last:]
        else:
            self.stream.forget_pending()

    def _feed(
        self,
        raw: bytes,
        offset: int,
        file_id: str | None,
        out: list[Event],
        candidate: bool = False,
    ) -> None:
        out.extend(self.stream.feed(Record(decode(raw), offset, file_id), candidate))
        self._fed_end = offset + len(raw)

    def _walk(self, data: bytes, pos: int, base: int, file_id: str | None, out: list[Event]) -> int:
        """Feed every record from `pos` while a traceback is open; return where it stopped."""
        n = len(data)
        while pos < n and self.stream.in_traceback:
            end = _next_terminator(data, pos, n)
            if end > pos:
                self._feed(data[pos:end], base + pos, file_id, out)
            pos = end + 1
        return pos

    def _before(
        self, data: bytes, start: int, base: int, file_id: str | None, out: list[Event]
    ) -> None:
        """Give the stream the record just before a candidate, as feeding every record would.

        Only that record decides whether a bar inherits a process prefix (`(P pid=1) \\r`).
        """
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
        if not prev or offset + len(prev) == self._fed_end:
            return  # nothing there, or the stream has seen it already
        self.stream.forget_pending()
        if (
            len(prev) <= PREFIX_RECORD_MAX
            and b"pid=" in prev
            and not has_needle(decode(prev), self.stream.mode)
        ):
            self._feed(prev, offset, file_id, out)

    def _candidates(self, data: bytes, pos: int, mode: Mode) -> list[int]:
        starts: set[int] = set()
        n = len(data)
        for needle in _NEEDLES_B[mode]:
            i = data.find(needle, pos)
            while i >= 0:
                starts.add(_record_start(data, i))
                e = _next_terminator(data, i, n)
                i = data.find(needle, e + 1)
        return sorted(starts)
