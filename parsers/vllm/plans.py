"""The vLLM grammar's scan plans: which substrings the chunk scanner searches for, per mode, and
the shape of a quiet record (an INFO or DEBUG line that yields nothing).

A needle (stream.py's `PREFILTER`) that shares an anchor with others is found by the anchor,
then checked; the order puts the dense ones first (a load's per-layer warnings), so the rest
are searched between them.
"""

from __future__ import annotations

import re

from loadwatch.parsers.dispatch import (
    LEVEL_NEEDLES,
    Mode,
)
from loadwatch.parsers.grammar import Group
from loadwatch.parsers.vllm.segment import (
    PREFILTER,
)

# Substrings that stand for several needles each, per mode, tried in this order; a needle that
# contains none of them is searched for itself. Chosen by measurement (bench/scan_anchors.py):
# a short anchor scans a little slower than a long needle, so an anchor pays only where it
# replaces two or more scans.
ANCHORS: dict[Mode, tuple[str, ...]] = {
    "startup": (
        "in the checkpoint (e.g.",  # the dense ones first: the rest is searched between them
        "it/s]",
        "s/it]",
        "version",
        "down",
        "pplication ",
        "vailable",
        "heckpoint",
        "KV cache",
        " took",
        "torch.compile",
        "Start",
        "args: ",
        "died",
        " memory",
        "failed",
        "raph",
        "scal",
        "backend",
    ),
    "serving": ("version", "down"),
}


def plan(mode: Mode) -> tuple[Group, ...]:
    groups: dict[str, list[str]] = {}
    for needle in PREFILTER[mode]:
        anchor = next((a for a in ANCHORS[mode] if a in needle), needle)
        groups.setdefault(anchor, []).append(needle)
    order = {a: i for i, a in enumerate(ANCHORS[mode])}

    def rank(item: tuple[str, list[str]]) -> tuple[bool, int]:
        anchor, needles = item
        level_only = all(n in LEVEL_NEEDLES for n in needles)
        return (mode == "serving" and level_only, order.get(anchor, len(order)))

    out: list[Group] = []
    for anchor, needles in sorted(groups.items(), key=rank):
        if len(needles) == 1:
            anchor = needles[0]  # a longer string scans faster
        exact = needles == [anchor]
        out.append(
            Group(
                anchor.encode(),
                None if exact else tuple(n.encode() for n in needles),
                all(n in LEVEL_NEEDLES for n in needles),
            )
        )
    return tuple(out)


PLANS: dict[Mode, tuple[Group, ...]] = {"startup": plan("startup"), "serving": plan("serving")}


# An INFO or DEBUG record of the common shape (see lines._STANDARD, whose ASCII classes these
# are): its header is all `parse_head` would find, so with no catalog needle in it the record
# yields no event and cannot open a traceback.
QUIET = re.compile(
    rb"(?:\([A-Za-z][A-Za-z0-9_-]{0,63}(?: rank=[0-9]{1,6})?"
    rb"(?: [A-Z]{1,8}[0-9]{1,6}(?:_[A-Z]{1,8}[0-9]{1,6}){0,7})?"
    rb" pid=[0-9]{1,10}(?:, ip=[0-9A-Fa-f.:]{1,64})?\) ?)?"
    rb"(?:INFO|DEBUG) ([0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:[.,][0-9]{1,6})? "
    rb"\[[\x21-\x5c\x5e-\x7e]{1,200}\]"
)


def _coloured(data: bytes, start: int, end: int) -> bool:
    """`strip_ansi` would look at this record: it has an ESC, `0m` or `6m`."""
    return (
        data.find(b"\x1b", start, end) >= 0
        or data.find(b"0m", start, end) >= 0
        or data.find(b"6m", start, end) >= 0
    )


def quiet_record(data: bytes, start: int, end: int) -> bytes | None:
    """The header time of `data[start:end]` if it is a quiet record, else None.

    Quiet: a single-segment INFO or DEBUG record of the common shape, without colour codes.
    The caller knows it holds no catalog needle and that no traceback is open; then feeding it
    would only note its time. (_scan.c's `candidates` tests the same in C.)
    """
    m = QUIET.match(data, start, end)
    if m is None or data.find(b" pid=", m.start(1), end) >= 0 or _coloured(data, start, end):
        return None
    return m.group(1)
