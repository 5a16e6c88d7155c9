"""Events of repeated messages, built once and copied after that.

Messages repeat: every tensor-parallel worker prints the same per-layer warning, a noisy server
the same warning again and again. A grammar's stream keeps, per distinct message, a recipe of its
events (`recipe_of`) and cooks each later record's events from it (`cook`). Only these types:
what they hold besides the record's offset, time and process comes from the message alone (a
Failure also carries its own offset).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from loadwatch.parsers.entries import Head
from loadwatch.parsers.events import (
    Event,
    KvScaleWarning,
    LogError,
    LogWarning,
    ScaleFactorWarning,
    StallHint,
    filler,
)

_CACHED_TYPES = (KvScaleWarning, ScaleFactorWarning, LogWarning, LogError, StallHint)
_CONTEXT = ("offset", "ts", "process", "pid")
# (a maker of the event's class, the values of its fields but the context ones)
Maker = Callable[[tuple[Any, ...], int, "float | None", "str | None", "int | None"], Event]
Recipe = tuple[tuple[Maker, tuple[Any, ...]], ...]
_MAKERS: dict[type[Event], Maker] = {}


def _maker(cls: type[Event]) -> Maker:
    """A function that builds an event of `cls` from the values of its message fields and the
    record's context (`filler`), made once per class."""
    make = _MAKERS.get(cls)
    if make is None:
        names = [f.name for f in fields(cls) if f.name not in _CONTEXT]
        make = _MAKERS[cls] = filler(cls, (*names, *_CONTEXT))
    return make


def recipe_of(events: list[Event]) -> Recipe | None:
    out = []
    for e in events:
        if type(e) not in _CACHED_TYPES:
            return None  # (a bar's update: asked of each, so no generator made first)
        names = [f.name for f in fields(e) if f.name not in _CONTEXT]
        out.append((_maker(type(e)), tuple(getattr(e, n) for n in names)))
    return tuple(out)


def cook(recipe: Recipe, offset: int, ts: float | None, head: Head) -> list[Event]:
    """The recipe's events for one record."""
    process, pid = head.process, head.pid
    return [make(values, offset, ts, process, pid) for make, values in recipe]


def set_fields(event: Event, **values: Any) -> None:
    """Fill in a field of an event a builder just made and nobody else holds yet."""
    for name, value in values.items():
        object.__setattr__(event, name, value)
