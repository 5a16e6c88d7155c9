"""Whole-chunk pre-filter: find the few records worth parsing without per-record Python work.

A chunk is a run of complete records as the follower hands them over. Instead of splitting it into
records and testing each one, a few anchors are searched over the whole chunk, and only the
records around the hits are looked at. An anchor is a substring shared by several needles
("version" stands for "server version" and "  version "): a record it hits is then checked for
the needles themselves. The anchors, needles and the rest are the grammar's (parsers/grammar.py;
vLLM's: parsers/vllm/). The records holding a needle are fed to the grammar's stream. While a
traceback is open every record matters, so the scanner then walks records one by one until it
closes. The result is the same event list as feeding every record (property tests check this).

On a serving log most records a level needle hits are request echoes: an INFO line whose prompt
says "ERROR" or "Traceback". The grammar's `quiet_record` proves such a record yields nothing with
one match of its header, and of a run of them the stream is handed only the count and the last one's time.

The search itself comes in two equal versions (tests/perf/test_scan_native.py compares them on
arbitrary bytes):
- in C (`_scan.c`, built at install when a C compiler is there; `NATIVE` says so): all anchors in
  one pass over the chunk through a hashed table of their first bytes, the record bounds, needle
  checks and quiet headers of the hits in C too, with the GIL released. On the 1M-line serving log
  of bench/throughput_vs_mtail.py the whole pipeline is about three times as fast as with the
  Python search; the scan no longer dominates, the per-chunk and per-event Python work does;
- in Python (`ChunkScanner._candidates_py`), the reference and the fallback: one `bytes.find` or
  libc `memmem` scan per anchor, with Python work per hit; when candidates fill most of a chunk
  (a load's per-layer warnings), the rarer anchors are searched in the bytes between them.
Measured and left out before the C search: one `re` alternation over a chunk (ten times slower
than the scans it would replace), an Aho-Corasick automaton (ahocorasick-rs: about what `memmem`
gives) and hyperscan (the scan 1.2x faster, the pipeline 1.0x: the per-hit work stayed in Python).
"""

from __future__ import annotations

import ctypes
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Final

from loadwatch.parsers.events import Event, Record
from loadwatch.parsers.grammar import Grammar, load
from loadwatch.parsers.stream import Stream

DENSE_SHARE = 0.5  # candidates this share of a chunk: search the other anchors between them
WINDOW_BYTES: Final = 64 * 1024  # the C search's reach in one call (records past it: the next call)


def _load_native() -> ModuleType | None:
    """The candidate search in C (_scan.c), when it was built: the same result as
    `ChunkScanner._candidates_py`, every anchor in one pass, no Python work per hit."""
    try:
        from loadwatch.parsers import _scan
    except ImportError:  # built without a C compiler: the Python search, same events, slower
        return None
    return _scan


_native = _load_native()
NATIVE = _native is not None
_TERMINATORS: Final = (0x0A, 0x0D)


def _libc_memmem() -> Callable[[int, int, bytes, int], int | None] | None:
    """libc's memmem, when there is one: it finds a string absent from a chunk two to three
    times faster than `bytes.find` (its shift table looks at two bytes at a time)."""
    try:
        fn = ctypes.CDLL(None).memmem
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    return fn


MEMMEM = _libc_memmem()
MEMMEM_MIN = 16 * 1024  # below this a ctypes call costs more than it saves


def first(data: bytes, address: int, needle: bytes, start: int, end: int) -> int:
    """`data.find(needle, start, end)`, with libc's memmem over long ranges. `address` is
    where `data`'s bytes are (`address_of`)."""
    if MEMMEM is None or end - start < MEMMEM_MIN:
        return data.find(needle, start, end)
    hit = MEMMEM(address + start, end - start, needle, len(needle))
    return -1 if hit is None else hit - address


def address_of(data: bytes) -> int:
    """The address of the bytes of `data` (which the caller keeps alive while it is used)."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def count_records(data: bytes) -> int:
    """Records ended in `data` (`\\r\\n` counts once)."""
    if _native is not None:
        return int(_native.count_records(data))
    return count_records_py(data)


def long_record(data: bytes, cap: int, cr: bool) -> bool:
    """Whether `data` holds a run of at least `cap` bytes with no `\\n` (nor `\\r` when `cr`):
    a record that long, an unterminated end counted as one."""
    if _native is not None:
        return bool(_native.long_record(data, cap, cr))
    return long_record_py(data, cap, cr)


def long_record_py(data: bytes, cap: int, cr: bool) -> bool:
    if cr:
        data = data.replace(b"\r", b"\n")
    return max(map(len, data.split(b"\n"))) >= cap


def count_lines(data: bytes, start: int = 0, end: int | None = None) -> int:
    """The `\\n` in `data[start:end]`."""
    stop = len(data) if end is None else end
    if _native is not None:
        return int(_native.count_lines(data, start, stop))
    return data.count(b"\n", start, stop)


def count_records_py(data: bytes) -> int:
    """`count_records` in Python. `bytes.count` of one byte is a plain loop; `replace` finds the
    bytes with memchr, about three times faster."""
    n = len(data) - len(data.replace(b"\n", b""))
    cr = data.find(b"\r")
    if cr < 0:
        return n
    crs = len(data) - len(data.replace(b"\r", b""))
    if crs > 64:
        return n + crs - data.count(b"\r\n")
    while cr >= 0:  # a few `\r` (bars): look at each
        if data[cr + 1 : cr + 2] != b"\n":
            n += 1
        cr = data.find(b"\r", cr + 1)
    return n


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


# A run of quiet records with no other candidate between them: (start of the first, how many,
# end of the last, header time of the last). Of a run the stream needs only that much.
QuietRun = tuple[int, int, int, bytes]


def quiet_runs(
    candidates: list[tuple[int, int, str]], quiet: dict[int, tuple[int, bytes]]
) -> list[QuietRun]:
    """The quiet records (start -> (end, header time)) as runs, split by the candidates."""
    runs: list[QuietRun] = []
    c = 0
    gap = -1  # the candidates before the open run
    for s in sorted(quiet):
        e, stamp = quiet[s]
        while c < len(candidates) and candidates[c][0] < s:
            c += 1
        if runs and gap == c:
            first, count, _e, _stamp = runs[-1]
            runs[-1] = (first, count + 1, e, stamp)
        else:
            runs.append((s, 1, e, stamp))
            gap = c
    return runs


class ChunkScanner:
    """Feed chunks of whole records; get the events the grammar's stream would give for each
    (fed every record). `grammar`: parsers/grammar.py's `Grammar` (default: vLLM's);
    `stream`: its event stream, when the caller made it."""

    def __init__(
        self,
        stream: Stream | None = None,
        native: bool = NATIVE,
        grammar: Grammar | None = None,
    ) -> None:
        self.grammar = g = grammar if grammar is not None else load()
        self.stream = stream if stream is not None else g.new_stream(None)
        self._plans = g.native_plans
        self._native_quiet = g.quiet_modes if g.native_quiet else frozenset()
        self._marker = g.prefix_marker
        self._prefix_max = g.prefix_record_max
        if native and _native is None:
            raise RuntimeError("the C scanner (loadwatch.parsers._scan) is not built")
        self._native = _native if native else None  # else the Python search: tests compare
        self.quiet = 0  # candidates proven quiet without parsing them
        self._tail = b""  # the last record of the previous chunk, if short
        self._fed_end = -1  # absolute end offset of the last record handed to the stream

    def feed(self, data: bytes, base: int = 0, file_id: str | None = None) -> list[Event]:
        out: list[Event] = []
        n = len(data)
        stream = self.stream
        cr: bool | None = None  # whether the chunk has a `\r`: the Python search asks
        pos = 0
        while pos < n:
            if stream.in_traceback:
                pos = self._walk(data, pos, base, file_id, out)
                continue
            mode = stream.mode
            stop = n
            # (declared: the C search's result is typed at run time, and a compiled loop over
            # an untyped list unpacks each tuple through the iterator protocol)
            found: tuple[list[tuple[int, int, str]], list[QuietRun]]
            if self._native is not None:
                # A window of whole records: what a mode change makes be searched again (the
                # rest of the window, with the new mode's needles) stays this small
                if n - pos > WINDOW_BYTES:
                    stop = data.find(b"\n", pos + WINDOW_BYTES) + 1 or n
                found = self._native.candidates(
                    data if stop == n else memoryview(data)[:stop],
                    pos,
                    self._plans[mode],
                    mode in self._native_quiet,
                )
            else:
                if cr is None:
                    cr = data.find(b"\r") >= 0
                found = self._candidates_py(data, pos, mode, cr)
            candidates, quiet = found
            r = 0  # runs of quiet records before this index are accounted for
            for start, end, text in candidates:
                if start < pos:
                    continue
                if r < len(quiet) and quiet[r][0] < start:  # quiet records since the last one
                    pos = self._quiet(quiet[r], base)
                    r += 1
                fed = self._fed_end - base
                if not (fed == start - 1 or (fed == start - 2 and data[start - 1] in _TERMINATORS)):
                    self._before(data, start, base, file_id, out)  # a record between: look at it
                events = stream.feed_text(text, base + start, True)
                self._fed_end = base + end
                pos = end + 1
                if events:
                    out += events
                if stream.mode != mode or stream.in_traceback:
                    break  # look again from here with other needles, or walk the traceback
            else:
                if r < len(quiet):  # after the last candidate: at most one run
                    pos = self._quiet(quiet[r], base)
                if stop < n:  # the next window
                    pos = max(pos, stop)
                    continue
                break
        if stream.in_traceback:
            self._walk(data, pos, base, file_id, out)
        self._keep_tail(data, base)
        return out

    def _quiet(self, run: QuietRun, base: int) -> int:
        """Account for a run of quiet records, which come after everything fed so far: feeding
        them would leave only the time of the last one. Returns where reading goes on."""
        _first, count, end, stamp = run
        self.stream.quiet(stamp)
        self.quiet += count
        self._fed_end = base + end
        return end + 1

    def _keep_tail(self, data: bytes, base: int) -> None:
        """Remember the chunk's last record if it may be a prefix for the next chunk's first."""
        j = len(data)
        while j > 0 and data[j - 1] in _TERMINATORS:
            j -= 1
        if j == 0:  # only terminators: the record before them is still the last one
            if len(self._tail) + len(data) <= 2 * self._prefix_max:
                self._tail += data
            else:
                self._tail = b""
                self.stream.forget_pending()
            return
        self._tail = b""
        if base + j == self._fed_end:
            return
        last = _record_start(data, j)
        if j - last <= self._prefix_max and self._marker in data[last:j]:
            self._tail = data[last:]
        else:
            self.stream.forget_pending()

    def _walk(self, data: bytes, pos: int, base: int, file_id: str | None, out: list[Event]) -> int:
        """Feed every record from `pos` while a traceback is open; return where it stopped."""
        n = len(data)
        stream = self.stream
        while pos < n and stream.in_traceback:
            end = _next_terminator(data, pos, n)
            if end > pos:
                out += stream.feed_text(decode(data[pos:end]), base + pos)
                self._fed_end = base + end
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
            source = self._tail.rstrip(b"\r\n")
            j = len(source)
            offset = base - len(self._tail)
        else:
            if base + j == self._fed_end:
                return  # the stream has seen it already
            source, offset = data, base
        prev_start = _record_start(source, j)
        offset += prev_start
        size = j - prev_start
        if not size or offset + size == self._fed_end:
            return  # nothing there, or the stream has seen it already
        self.stream.forget_pending()
        if size > self._prefix_max:
            return  # (a long record, an echoed prompt, is not copied to learn that)
        prev = source[prev_start:j]
        if self._marker not in prev:
            return
        # It holds no needle of the current mode: else it would have been a candidate of this
        # chunk, or of the last one with the same mode, and fed already.
        self.stream.plain(decode(prev))
        self._fed_end = offset + len(prev)

    def _candidates_py(
        self, data: bytes, pos: int, mode: str, cr: bool
    ) -> tuple[list[tuple[int, int, str]], list[QuietRun]]:
        """The records from `pos` holding a needle of `mode`, as (start, end, text) in order, and
        apart from them the quiet ones (the grammar's `quiet_record`) as `quiet_runs` gives them.
        A record is a maximal run of bytes without `\\n` or `\\r`. _scan.c's `candidates`
        returns the same (tests/perf/test_scan_native.py)."""
        found: dict[int, int] = {}
        quiet: dict[int, tuple[int, bytes]] = {}
        # Quiet records must hold no needle but level words: in serving mode every scan goes
        # over the whole chunk, the level words last, so a record they hit is known by then.
        g = self.grammar
        quiet_of = g.quiet_record
        quiet_ok = quiet_of is not None and mode in g.quiet_modes
        n = len(data)
        find, rfind = data.find, data.rfind
        address = address_of(data)
        groups = g.plans[mode]
        lo, hi = pos, n
        crs: list[int] | None = None  # where the `\r` are, when there are few
        ncr = 0
        if cr:
            crs = []
            # from the start of the line `pos` is in: a `\r` before `pos` may start a record
            c = data.find(b"\r", data.rfind(b"\n", 0, pos) + 1)
            while c >= 0 and ncr < 256:
                crs.append(c)
                ncr += 1
                c = data.find(b"\r", c + 1)
            if c >= 0:
                crs = None  # `\r\n` lines, most likely: look around each hit instead
        between: _Between | None = None
        for gi, group in enumerate(groups):
            anchor, needles = group.anchor, group.needles
            level = quiet_ok and group.level
            if between is not None:
                for i in between.hits(anchor):
                    s = _record_start(data, i)
                    e = _next_terminator(data, i, n)
                    if needles is None or any(find(x, s, e) >= 0 for x in needles):
                        found[s] = e
                continue
            b = hi
            i = first(data, address, anchor, lo, hi)
            while i >= 0:
                # the record around the hit (`_record_start`, `_next_terminator` inlined)
                s = rfind(b"\n", 0, i) + 1
                if level and not cr and (s in found or s in quiet):
                    i = find(anchor, i + 1, b)  # a level word again in a known record
                    continue
                e = find(b"\n", i)
                if e < 0:
                    e = n
                if crs is not None:  # a few `\r` (bars): do any cut this line?
                    k = bisect_left(crs, i)
                    if k < ncr and crs[k] < e:
                        e = crs[k]
                    if k and crs[k - 1] >= s:
                        s = crs[k - 1] + 1
                elif cr:
                    c = rfind(b"\r", s, i)
                    if c >= 0:
                        s = c + 1
                    c = find(b"\r", i, e)
                    if c >= 0:
                        e = c
                hit = needles is None
                if not hit:
                    for needle in needles:  # type: ignore[union-attr]
                        if find(needle, s, e) >= 0:
                            hit = True
                            break
                if hit and level and cr and (s in found or s in quiet):
                    hit = False  # known already (this check waits for the `\r` bounds)
                if hit:
                    if level:
                        stamp = quiet_of(data, s, e)  # type: ignore[misc]
                        if stamp is not None:
                            quiet[s] = (e, stamp)
                            i = find(anchor, e + 1, b)
                            continue
                    found[s] = e
                i = find(anchor, e + 1, b)
            if gi < 3 and not quiet_ok and len(found) > 8:
                between = _Between.of(data, found, lo, hi)
        candidates = [(s, found[s], decode(data[s : found[s]])) for s in sorted(found)]
        return candidates, quiet_runs(candidates, quiet)


class _Between:
    """The bytes between the records found so far, joined: when those fill most of a chunk (a
    load's per-layer warnings), the other anchors are searched here, once each."""

    __slots__ = ("cum", "joined", "starts")

    def __init__(self, joined: bytes, starts: list[int], cum: list[int]) -> None:
        self.joined = joined
        self.starts = starts  # where each joined range begins in the chunk
        self.cum = cum  # where it begins in `joined`

    @classmethod
    def of(cls, data: bytes, found: dict[int, int], lo: int, hi: int) -> _Between | None:
        if sum(e - s for s, e in found.items()) < DENSE_SHARE * (hi - lo):
            return None
        parts: list[bytes] = []
        starts: list[int] = []
        cum: list[int] = []
        size = 0
        at = lo
        for s in sorted(found):
            if s > at:  # whole records: from a record start to the next found one
                starts.append(at)
                cum.append(size)
                parts.append(data[at:s])
                size += s - at
            at = max(at, found[s] + 1)
        if at < hi:
            starts.append(at)
            cum.append(size)
            parts.append(data[at:hi])
        return cls(b"".join(parts), starts, cum)

    def hits(self, needle: bytes) -> Iterator[int]:
        """Where `needle` is in the chunk, outside the records found, in order."""
        joined, starts, cum = self.joined, self.starts, self.cum
        j = joined.find(needle)
        while j >= 0:
            g = bisect_right(cum, j) - 1
            yield starts[g] + j - cum[g]
            j = joined.find(needle, j + 1)
