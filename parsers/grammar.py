"""The seam between the chunk scanner (scan.py) and a log grammar.

A grammar is a folder under parsers/ (parsers/vllm/ is the one there is) whose `grammar` module
holds `GRAMMAR`, a `Grammar`: the scan plans the scanner searches a chunk with, per mode, the
quiet-record test, what a record holding only a process prefix looks like, and how to start the
event stream that parses the records the scanner hands it. Adding a grammar is adding a folder;
`load(name)` finds it (`[log] grammar` names it), and nothing in the scanner, the loop or analyze names one.
Its messages are data: `Entry`s (entries.py) with their builders, run over each record by a
`Dispatch` (dispatch.py); what any grammar needs besides lives beside this module, so a grammar
folder holds its catalog, its builders and what is its engine's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loadwatch.parsers.stream import Stream

DEFAULT = "vllm"


class Group:
    """One scan: an anchor and the needles it stands for (None: the anchor is the needle)."""

    __slots__ = ("anchor", "level", "needles")

    def __init__(self, anchor: bytes, needles: tuple[bytes, ...] | None, level: bool) -> None:
        self.anchor = anchor
        self.needles = needles
        self.level = level  # only level needles: a hit alone may be a quiet record


NativePlan = tuple[tuple[bytes, tuple[bytes, ...] | None, bool], ...]


@dataclass(frozen=True)
class Grammar:
    name: str
    plans: Mapping[Any, tuple[Group, ...]]  # per mode, the scans in the order they run
    new_stream: Callable[[float | None], Stream]  # ref_ts: the year of stamps without one
    # Modes whose level needles ("WARNING", ...) may hit a record that yields nothing: such a
    # record is told by `quiet_record`, and of a run of them only the count and the last
    # one's time go to the stream. The C search's quiet test is vLLM's header shape: a grammar
    # of another shape has no quiet modes with it (`native_quiet`).
    quiet_modes: frozenset[str] = frozenset()
    quiet_record: Callable[[bytes, int, int], bytes | None] | None = None
    native_quiet: bool = False
    prefix_marker: bytes = b"\x00"  # in every record that is only a process prefix
    prefix_record_max: int = 256
    native_plans: Mapping[str, NativePlan] = field(init=False)

    def __post_init__(self) -> None:
        native = {
            mode: tuple((g.anchor, g.needles, g.level) for g in groups)
            for mode, groups in self.plans.items()
        }
        object.__setattr__(self, "native_plans", native)


def available() -> tuple[str, ...]:
    """The grammars there are: each folder under parsers/ with a `grammar` module."""
    import loadwatch.parsers as here

    return tuple(
        sorted(
            m.name
            for m in pkgutil.iter_modules(here.__path__)
            if m.ispkg and importlib.util.find_spec(f"loadwatch.parsers.{m.name}.grammar")
        )
    )


def load(name: str = DEFAULT) -> Grammar:
    """The grammar in parsers/NAME/grammar.py."""
    module = importlib.import_module(f"loadwatch.parsers.{name}.grammar")
    grammar: Grammar = module.GRAMMAR
    return grammar
