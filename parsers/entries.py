"""What any grammar's catalog is made of: the head a record's header parses to, the record levels
a message is read at, the catalog entry, and the helpers its builders share.

A grammar folder (parsers/vllm/) states its messages as `Entry`s: the needles that make a record
worth matching, the pattern anchored at the message's start, the builder that turns a match into
an event, and who logs it. `dispatch.py` runs them; nothing here names an engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from loadwatch.parsers.events import Event, Severity


class Head(NamedTuple):
    """What stands before the message of one record."""

    process: str | None
    pid: int | None
    level: str | None  # None: no recognised header (bare stderr, tracebacks, bars)
    ts: float | None
    source: str | None
    body: str
    prefix_only: bool = False


Builder = Callable[["re.Match[str]", Head, dict[str, Any]], Event | None]

Level = str | None  # "DEBUG" .. "CRITICAL", or None for a record without a logging header
LEVELS: tuple[Level, ...] = (None, "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MESSAGE: frozenset[Level] = frozenset({"INFO", "DEBUG"})
# Failures fire only on ERROR/CRITICAL records or records without a header (tracebacks, stderr),
# so a user prompt echoed at INFO that says "CUDA out of memory" is not a failure.
FAILURE: frozenset[Level] = frozenset({"ERROR", "CRITICAL", None})
WARNING: frozenset[Level] = frozenset({"WARNING", "INFO", "DEBUG", None})
BARE: frozenset[Level] = frozenset({None})


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    needles: tuple[str, ...]
    pattern: re.Pattern[str]
    build: Builder
    severity: Severity
    levels: frozenset[Level] = MESSAGE  # the record levels this message is printed at
    serving: bool = False  # still looked for once the server is up (restart markers, stalls)
    more: bool = False  # the same record may hold a second message: keep looking after a match
    # Who says it: the source files (`[file.py:123]` in the header) that print this message in
    # the engine versions the grammar knows, `*name.py` for any file whose name ends so
    # (`*model_runner.py`: gpu_, cpu_, tpu_model_runner.py). A record with a header from any
    # other file is not this message, whatever it says: an engine repeats a message's header on
    # each of its lines, so the lines of a request id holding line breaks carry the request
    # logger's header. ANY_LOGGER: whoever logs it (an exception is logged where it is caught;
    # failures are held as warnings while the engine serves). Records without a header
    # (uvicorn's own format, bare stderr) are read by their shape alone.
    loggers: tuple[str, ...] = ()

    def spoken_by(self, source: str) -> bool:
        """Whether the header's `file.py:123` (or a DEBUG path `dir/.../file.py:123`) is one of
        this message's loggers."""
        if not self.loggers:
            return True
        name = source.partition(":")[0].rpartition("/")[2]
        for logger in self.loggers:
            if name == logger or (logger[:1] == "*" and name.endswith(logger[1:])):
                return True
        return False


ANY_LOGGER: tuple[str, ...] = ()


def rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


SEC = r"(?P<sec>\d{1,9}+(?:\.\d{1,9}+)?)"
GIB = r"(?P<gib>\d{1,9}+(?:\.\d{1,9}+)?)"


def number(text: str | None) -> float | None:
    """A logged number (`1,234.5`), None when there is none."""
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def integer(text: str | None) -> int | None:
    value = number(text)
    return None if value is None else int(value)


@lru_cache(maxsize=4096)  # (every bar update has two; they repeat from bar to bar)
def hms_seconds(text: str | None) -> float | None:
    """tqdm's `MM:SS` / `H:MM:SS` (or `?`) to seconds."""
    if not text or "?" in text:
        return None
    total = 0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return float(total)


def tqdm_rate(text: str | None) -> float | None:
    """tqdm's `2.50it/s` or `1.20s/it` as items per second."""
    if not text or "?" in text:
        return None
    if text.endswith("s/it"):
        per = number(text[:-4])
        return None if not per else 1.0 / per
    if text.endswith("it/s"):
        return number(text[:-4])
    return None


# tqdm's unit-scaled numbers (`unit_scale=True`, divisor 1000): `0.00`, `13.3G`, `155G`, `1.20T`
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def scaled(text: str | None) -> float | None:
    if not text:
        return None
    suffix = text[-1] if text[-1] in _SCALE else ""
    value = number(text[: len(text) - len(suffix)])
    return None if value is None else value * _SCALE[suffix]
