"""The anatomy of one vLLM log record: colour codes, process prefixes, the logging header.

Every pattern is linear on hostile input: bounded repeats, possessive quantifiers, and searches
limited to the first few hundred characters where a header can be.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Final, Literal

from loadwatch.parsers.collectors import (
    COLUMN_REACH,
    MAX_WRAPPERS,
    WRAPPER_START,
    compose_column,
    strip_wrapper,
    wrapper_end,
)
from loadwatch.parsers.entries import Head

# ESC [ ... m, and the same with the ESC byte lost in a copy (`[1;36m`).
_ANSI = re.compile(r"\x1b\[[0-9;]{0,16}+[A-Za-z]|\[[0-9]{1,3}+(?:;[0-9]{1,3}+){0,7}+m")

# `(Worker_TP0 pid=1700) `, `(VllmWorker rank=1 pid=9)`, `(VllmWorker PP0_TP1 pid=2)`,
# `(RayWorkerWrapper pid=5, ip=10.0.0.2)`.
_PREFIX_CORE = (
    r"\((?P<name>[A-Za-z][A-Za-z0-9_-]{0,63}+)"  # `VllmWorker-0` since 2026
    r"(?: rank=(?P<rank>\d{1,6}+))?"
    r"(?: (?P<ranks>[A-Z]{1,8}+\d{1,6}+(?:_[A-Z]{1,8}+\d{1,6}+){0,7}+))?"
    r" pid=(?P<pid>\d{1,10}+)(?:, ip=[0-9A-Fa-f.:]{1,64}+)?\)"
)
_PREFIX = re.compile(r"(?:\s{0,8}+" + _PREFIX_CORE + r" ?){1,16}+")
# A prefix in mid-record marks where another process's line begins (tqdm `\r` bars).
_MIDLINE_PREFIX = re.compile(_PREFIX_CORE + r" ")
MAX_SEGMENTS = 64
_RAY_REPEAT = re.compile(r" \[repeated (\d{1,9}+)x across cluster\]\s*+$")

# `INFO 11-30 10:00:00 [file.py:123] msg` and the older `INFO 11-30 10:00:00 file.py:123] msg`.
_HEADER = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) "
    r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d{1,6}+)? "
    r"(?:\[(?P<src>[^\]\s]{1,200}+)\]|(?P<osrc>[^\]\s]{1,200}+)\]) ?"
)
# uvicorn's own format: `INFO:     Application startup complete.`
_UVICORN = re.compile(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s{1,8}+")
# flashinfer: `2025-11-21 10:26:22,420 - INFO - msg`
_DATED = re.compile(
    r"(?P<Y>\d{4})-(?P<mon>\d\d)-(?P<day>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)[.,]\d{1,6}+"
    r" - (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) - "
)
_MISSING = object()
_HEADER_WINDOW: Final = 256  # a VLLM_LOGGING_PREFIX may stand before the header; nothing longer

# The record shape that makes up nearly every line of a vLLM log: at most one process prefix,
# then the bracketed header. Every class is ASCII and explicit, so whatever these match,
# `_PREFIX` + `_HEADER` match the same way (their `\d`, `\s` also take non-ASCII characters);
# anything else takes the general path.
_ONE_PREFIX = re.compile(
    r"\((?P<name>[A-Za-z][A-Za-z0-9_-]{0,63})(?: rank=(?P<rank>[0-9]{1,6}))?"
    r"(?: (?P<ranks>[A-Z]{1,8}[0-9]{1,6}(?:_[A-Z]{1,8}[0-9]{1,6}){0,7}))?"
    r" pid=(?P<pid>[0-9]{1,10})(?:, ip=[0-9A-Fa-f.:]{1,64})?\) "
)
# The header of either age (the source in brackets, or, before 2025-02, without the opening
# one), as `_HEADER` reads it: its source holds no `]`, so the first `] ` ends it (`header_end`).
_STANDARD_HEADER = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) "
    r"(?P<stamp>[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:[.,][0-9]{1,6})? "
    r"(?:\[(?P<src>[\x21-\x5c\x5e-\x7e]{1,200})\]|(?P<osrc>[\x21-\x5c\x5e-\x7e]{1,200})\]) "
)
_LEVEL_WORDS: Final = ("DEBUG", "INFO", "WARN", "ERROR", "CRITICAL")  # what any header starts with
_HEAD_CACHE_MAX: Final = 4096
_HEADER_REACH: Final = 400  # a bracketed header ends this near a record's start, or is not one
_CODE_REACH: Final = 24  # a colour code that closes a prefix ends this near its `)`


def strip_ansi(text: str) -> str:
    # Cheap test first: colour codes end in `m`, after an ESC or a digit ("[0m", "[1;36m").
    if "\x1b" not in text and "0m" not in text and "6m" not in text:
        return text
    return _ANSI.sub("", text)


def split_segments(text: str) -> list[str]:
    """Split a record where another process's prefix starts in mid-record.

    Walks the `pid=` occurrences (rare) instead of running a pattern at every position, and stops
    after a bounded number of segments: the rest stays in the last one.
    """
    cuts: list[int] = []
    tries = 0
    i = text.find(" pid=", 1)
    while i >= 0 and len(cuts) < MAX_SEGMENTS and tries < 4 * MAX_SEGMENTS:
        tries += 1
        open_at = text.rfind("(", max(0, i - 80), i)
        if open_at > 0 and not text[open_at - 1].isspace() and _after_bar(text, open_at):
            m = _MIDLINE_PREFIX.match(text, open_at)
            if m is not None:
                cuts.append(open_at)
        i = text.find(" pid=", i + 5)
    if not cuts:
        return [text]
    parts: list[str] = []
    start = 0
    for cut in cuts:
        parts.append(text[start:cut])
        start = cut
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _after_bar(text: str, at: int) -> bool:
    """Whether `text[:at]` ends as a tqdm bar does (`... 25.1it/s]`, `?B/s]`): the one place
    another process's line lands on the same physical line (a `\r`-only bar has no newline).
    Anywhere else a process prefix is somebody's text (a prompt, a model's output)."""
    return text.endswith(("it/s]", "s/it]", "B/s]"), max(0, at - 8), at)


class YearResolver:
    """vLLM timestamps have no year: pick the one that puts the time nearest before `ref_ts`."""

    def __init__(self, ref_ts: float | None = None) -> None:
        self.ref_ts = time.time() if ref_ts is None else ref_ts
        self._cache: dict[tuple[int, int, int], float | None] = {}
        self._stamps: dict[str | bytes, float | None] = {}

    def set_reference(self, ref_ts: float) -> None:
        """A long-running reader moves its reference along with the clock (a log read across New
        Year must put January's lines in the new year); cached answers go when the day changes."""
        if int(ref_ts // 86400) != int(self.ref_ts // 86400):
            self._cache.clear()
            self._stamps.clear()
        self.ref_ts = ref_ts

    def resolve(self, mon: int, day: int, h: int, m: int, s: int) -> float | None:
        key = (mon, day, h)
        if key not in self._cache:
            self._cache[key] = self._hour_start(mon, day, h)
        base = self._cache[key]
        return None if base is None else base + m * 60 + s

    def stamp(self, text: str | bytes) -> float | None:
        """`MM-DD HH:MM:SS` to epoch seconds; consecutive lines share their second, so cache."""
        ts = self._stamps.get(text, _MISSING)
        if ts is _MISSING:
            if len(self._stamps) > 4096:
                self._stamps.clear()
            ts = self._stamps[text] = self.resolve(
                int(text[0:2]), int(text[3:5]), int(text[6:8]), int(text[9:11]), int(text[12:14])
            )
        return ts  # type: ignore[return-value]

    def _hour_start(self, mon: int, day: int, h: int) -> float | None:
        ref_year = datetime.fromtimestamp(self.ref_ts).year
        best: float | None = None
        for year in (ref_year + 1, ref_year, ref_year - 1):
            try:
                ts = datetime(year, mon, day, h).timestamp()
            except (ValueError, OverflowError):
                continue
            # A line can be at most a little ahead of the reference (clock skew, late reads).
            if ts <= self.ref_ts + 86400 and (best is None or ts > best):
                best = ts
        return best


class StandardHeads:
    """`parse_head` for whole records of the common shapes, with prefixes and headers parsed
    once per distinct text (a process has one prefix; records within one second share a header).

    `head(text)` is the `Head` that `split_segments(strip_ansi(text))` + `parse_head` would give
    for a record that turns out to be one segment, or None when the record is not of a common
    shape (colour codes past the prefix, a second prefix in mid-record, an unusual header): then
    use the general path. Common shapes: `(NAME pid=N) LEVEL MM-DD HH:MM:SS [src] msg`, the same
    without the prefix, and a record with no header at all (a progress bar), with a prefix or
    without; each with its prefix and header coloured or not (vLLM colours both on a terminal),
    the header's source in brackets or in the older `src] ` form, after a launcher's or
    collector's own text or not.
    """

    def __init__(self, years: YearResolver) -> None:
        self.years = years
        # text -> what it parses to, or False: not of the common shape
        self._prefixes: dict[str, tuple[str, int] | Literal[False]] = {}
        self._headers: dict[str, tuple[str, float | None, str] | Literal[False]] = {}
        # A record's text after its process prefix -> (level, ts, source, body), or False: the
        # workers of a tensor-parallel group print the same line in the same second, each
        # behind its own prefix, and it is read once.
        self._rests: dict[str, tuple[str | None, float | None, str | None, str] | Literal[False]]
        self._rests = {}
        # compose columns (`compose_column`) -> True; other texts up to a first `| ` -> False
        self._columns: dict[str, bool] = {}

    def head(self, text: str) -> Head | None:
        split = self.split(text)
        return None if split is None else self.rest_head(*split)

    def split(self, text: str) -> tuple[str | None, int | None, str] | None:
        """(process, pid, the text after the prefix) of a record of a common shape's prefix (the
        whole text when it has none); None: the general path's."""
        spot = self.spot(text)
        if spot is None:
            return None
        process, pid, p = spot
        return process, pid, text[p:]

    def spot(self, text: str) -> tuple[str | None, int | None, int] | None:
        """`split`, with where the text after the prefix starts in place of that text (the
        common case reads on in `text`, no copy made). A prefix is judged once, when first seen
        (`_prefix`): colour codes on it are taken off, a Ray suffix sends the record to the
        general path. What a launcher or collector wrote before the line (`strip_wrapper`:
        journald's, docker compose's, a CI stamp) is passed over, as `parse_head` passes it; a
        compose column, the same before every line, is judged once (`_column_end`)."""
        c = text[:1]
        w = 0  # where vLLM's own line starts: after what a launcher or collector wrote first
        if c != "(" and c in WRAPPER_START:
            w = self._column_end(text)  # (the first step, when a column: judged once)
            end = wrapper_end(text, w, MAX_WRAPPERS - 1 if w else MAX_WRAPPERS)
            if end > w and _odd(text[w:end]):
                return None
            w = end
            c = text[w : w + 1]
        if c == "(":
            p = text.find(") ", w + 1, w + _HEADER_WINDOW) + 2
        elif c == "\x1b":  # coloured (before 2025-11 always): `ESC[1;36m(NAME pid=N)ESC[0;0m `
            p = text.find(")\x1b[", w + 1, w + _HEADER_WINDOW)
            if p < 0:  # no prefix: a coloured header, maybe (`header_end`)
                return _NO_SPOT if w == 0 else (None, None, w)
            p = text.find("m ", p + 3, p + _CODE_REACH) + 2
        else:
            return _NO_SPOT if w == 0 else (None, None, w)
        if p < w + 2:
            return None
        prefix = self._prefixes.get(text[w:p]) or self._prefix(text[w:p])
        if prefix is False:
            return None
        return prefix[0], prefix[1], p

    def _column_end(self, text: str) -> int:
        """The length of the compose column the record starts with (`compose_column`), judged
        once per distinct column; 0: none (docker compose writes one before every line)."""
        k = text.find("| ", 1, COLUMN_REACH)
        if k < 0 or text.find(":", 0, k) >= 0:  # (a stamp's, a tag's, a bar's: not a column)
            return 0
        key = text[: k + 2]
        known = self._columns.get(key)
        if known is None:
            known = compose_column(key) and not _odd(key)
            if len(self._columns) >= _HEAD_CACHE_MAX:
                self._columns.clear()
            self._columns[key] = known
        return len(key) if known else 0

    def rest_head(self, process: str | None, pid: int | None, rest: str) -> Head | None:
        """`head` of a record split as `split` splits it. A rest is judged once, when first seen
        (`_rest`), as its prefix is."""
        got = self._rests.get(rest)
        if got is None:
            got = self._rest(rest)
            if got is False or got[0] is not None:  # (a bar's text is new with each update)
                if len(self._rests) >= _HEAD_CACHE_MAX:
                    self._rests.clear()
                self._rests[rest] = got
        if got is False:
            return None
        level, ts, source, body = got  # (unpacked: a starred tuple display is built slowly)
        return _tuple_new(Head, (process, pid, level, ts, source, body, False))

    def _rest(self, rest: str) -> tuple[str | None, float | None, str | None, str] | Literal[False]:
        """What `head` makes of a record's text after its prefix (the whole text without one)."""
        if rest.startswith("[repeated ") or " [repeated " in rest:
            return False  # (the general path drops a Ray suffix)
        k = header_end(rest)
        if k < 0:  # no header: a bar (after its prefix, or alone), or other bare text
            bare = None if _odd(rest) else self._bare(rest)
            return False if bare is None else (None, None, None, bare.body)
        body = rest[k:]
        header = self.header(rest[:k])  # (its colour codes, if any, taken off)
        if header is False or _odd(body) or rest.find(" pid=") >= 0:
            return False  # (another process's record may start in this one)
        level, ts, src = header
        return level, ts, src, body

    def header(self, key: str) -> tuple[str, float | None, str] | Literal[False]:
        """(level, time, source) of a record's header, the text up to `header_end`, read once
        per distinct text (records within one second share one); False: not of the common
        shape (nor when it holds what `_odd` looks for once its colour codes are off). A header
        vLLM coloured (on a terminal, since 2025-11) has its codes taken off first, as the
        general path takes them off the whole record (a code in the message sends the record
        there: `rest_head`)."""
        header = self._headers.get(key)
        if header is None:
            header = False
            plain = strip_ansi(key) if key[:1] == "\x1b" else key
            m = None if _odd(plain) else _STANDARD_HEADER.fullmatch(plain)
            if m is not None:
                level = m.group("level")
                stamp = self.years.stamp(m.group("stamp"))
                src = m.group("src") or m.group("osrc")
                header = ("WARNING" if level == "WARN" else level, stamp, src)
            if len(self._headers) >= _HEAD_CACHE_MAX:
                self._headers.clear()
            self._headers[key] = header
        return header

    def _prefix(self, text: str) -> tuple[str, int] | Literal[False]:
        """A prefix's (process, pid), or False: not of the common shape. Colour codes on it are
        taken off first, as the general path takes them off the whole record (a code in the
        rest sends that rest to the general path: `rest_head`)."""
        prefix = self._prefixes.get(text)
        if prefix is None:
            plain = strip_ansi(text) if text[:1] == "\x1b" else text
            m = None if _odd(plain) else _ONE_PREFIX.fullmatch(plain)
            prefix = (_process_name(m), int(m.group("pid"))) if m else False
            if len(self._prefixes) >= _HEAD_CACHE_MAX:
                self._prefixes.clear()
            self._prefixes[text] = prefix
        return prefix

    def lone_prefix(self, text: str) -> tuple[str, int] | None:
        """(process, pid) when `text` is exactly one process prefix and its space (the record
        before a `\r` bar), as `parse_head` would read it; None: not that shape."""
        spot = self.spot(text)
        if spot is None or spot[0] is None or spot[1] is None or spot[2] != len(text):
            return None
        return spot[0], spot[1]

    def says_more(self, text: str) -> bool:
        """Whether `text` is one process prefix of the common shape with a message after it
        (most short records are): then `parse_head` finds no prefix alone in it, as only blanks
        and more prefixes can follow a prefix in one. False: not known that way."""
        split = self.split(text)
        if split is None or split[0] is None:
            return False
        rest = split[2]
        return rest.lstrip()[:1] not in ("(", "") and not _odd(rest)

    @staticmethod
    def _bare(text: str) -> Head | None:
        """A record without prefix or header (a bar, stderr): no level word in reach of
        `parse_head`'s header search, nothing that starts a prefix. (What a collector wrote
        before it `spot` passed over, as `parse_head` passes over it.)"""
        c = text[:1]
        if not c or c == "(" or c.isspace() or " pid=" in text:
            return None
        window = text[: _HEADER_WINDOW + 16]
        for word in _LEVEL_WORDS:
            if word in window:
                return None
        return _tuple_new(Head, (None, None, None, None, None, text, False))


def header_end(rest: str, start: int = 0) -> int:
    """Where the message starts in a record's text after its prefix (from `start` in it), when
    a header (`LEVEL MM-DD HH:MM:SS [file.py:N] `) may stand before it: after its `] `, or,
    where vLLM coloured it (`ESC[32mINFO ... [file.py:N]ESC[0m `), after the code that closes
    its source; -1: none there."""
    if rest[start : start + 1] == "\x1b":
        k = rest.find("]\x1b[", start, start + _HEADER_REACH)
        k = rest.find("m ", k + 3, k + _CODE_REACH) if k >= 0 else -1
    else:
        k = rest.find("] ", start, start + _HEADER_REACH)
    return -1 if k < 0 else k + 2


def _odd(text: str) -> bool:
    """Colour codes to strip, or a Ray suffix to drop: not a common shape. A code that lost its
    escape counts (`[1;36m`: `strip_ansi` takes it off where the record holds another code), and
    so does any `0m` or `6m` (which make `strip_ansi` look at all)."""
    if "\x1b" in text or " [repeated " in text:
        return True
    # looked for at each `m`: a record holds far fewer of those than of digits
    i = text.find("m", 1)
    while i > 0:
        c = text[i - 1]
        if c == "0" or c == "6":
            return True
        if "1" <= c <= "9":
            k = text.rfind("[", max(0, i - _CODE_REACH), i)
            if k >= 0 and text[k + 1 : i].replace(";", "").isdigit():
                return True
        i = text.find("m", i + 1)
    return False


_NO_SPOT: Final = (None, None, 0)  # (`spot` of a record without a prefix)
_tuple_new: Final = tuple.__new__  # a NamedTuple without its Python-level __new__


def owned(head: Head, who: tuple[str, int | None]) -> Head:
    """`head` of a record without a prefix, owned by the process (name, pid) whose prefix stood
    alone in the record before it (a `\\r` bar's): `_replace` without its Python-level call."""
    _process, _pid, level, ts, source, body, prefix_only = head
    return _tuple_new(Head, (who[0], who[1], level, ts, source, body, prefix_only))


def parse_head(segment: str, years: YearResolver) -> Head:
    """Peel the process prefix(es) and the logging header off one segment."""
    process: str | None = None
    pid: int | None = None
    pos = 0
    segment = strip_wrapper(segment)
    # Prefixes may nest or repeat (before 2026-03): the innermost (last) names the process.
    if segment.startswith("(") or segment[:1].isspace():
        m = _PREFIX.match(segment)
        if m is not None:
            process = _process_name(m)
            pid = int(m.group("pid"))
            pos = m.end()
    rest = segment[pos:]
    if process is not None and not rest.strip():
        return Head(process, pid, None, None, None, "", prefix_only=True)
    if " [repeated " in rest:
        rest = _RAY_REPEAT.sub("", rest)

    h = _HEADER.match(rest)
    if h is None and len(rest) > 20 and rest[:1] not in " \t" and _UVICORN.match(rest) is None:
        h = _HEADER.search(rest, 0, _HEADER_WINDOW)  # a VLLM_LOGGING_PREFIX before the header
        if h is not None and not _logging_prefix(rest[: h.start()]):
            h = None  # a header inside somebody's text (a request path, an exception message)
    if h is not None:
        level, stamp, src, osrc = h.group("level", "stamp", "src", "osrc")
        if level == "WARN":
            level = "WARNING"
        return Head(process, pid, level, years.stamp(stamp), src or osrc, rest[h.end() :])
    u = _UVICORN.match(rest)
    if u is not None:
        return Head(process, pid, u["level"], None, None, rest[u.end() :])
    d = _DATED.match(rest)
    if d is not None:
        try:
            ts2: float | None = datetime(
                int(d["Y"]), int(d["mon"]), int(d["day"]), int(d["h"]), int(d["m"]), int(d["s"])
            ).timestamp()
        except (ValueError, OverflowError):
            ts2 = None
        return Head(process, pid, d["level"], ts2, None, rest[d.end() :])
    return Head(process, pid, None, None, None, rest)


def _logging_prefix(text: str) -> bool:
    """Whether `text` can be a VLLM_LOGGING_PREFIX (a constant the operator sets: `[node-1] `,
    `vllm | `): short, and none of what a quoted path, a repr or an exception message holds."""
    return len(text) <= _LOGGING_PREFIX_MAX and not any(c in text for c in _NOT_IN_PREFIX)


_LOGGING_PREFIX_MAX = 64
_NOT_IN_PREFIX = ('"', "'", "`", "(", ")", "=", ": ", "/")


def _process_name(m: re.Match[str]) -> str:
    name = m.group("name")
    if m.group("ranks"):
        return f"{name}_{m.group('ranks')}"
    if m.group("rank"):
        return f"{name}_rank{m.group('rank')}"
    return name
