"""Golden files: `fixtures/NAME.log` -> `fixtures/NAME.events.jsonl`.

Regenerate after a deliberate grammar change with `LOADWATCH_REGEN_GOLDEN=1 pytest tests/parsers`,
then read the diff: every changed line is a claim about vLLM's log that must be true.
"""

from __future__ import annotations

import json
from pathlib import Path

from loadwatch.parsers import ChunkScanner, Event, EventStream, split_records
from loadwatch.parsers.scan import NATIVE

# Fixed reference time for yearless timestamps: 2026-12-01 00:00 UTC (conftest sets TZ=UTC).
REF_TS = 1796083200.0


def events_of(data: bytes) -> list[Event]:
    return EventStream(ref_ts=REF_TS).feed_all(split_records(data))


def scanned(data: bytes, chunk: int, native: bool = NATIVE) -> list[Event]:
    """The same input through the chunk scanner, cut into chunks at record boundaries;
    `native`: its candidate search in C (_scan.c), else in Python."""
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS), native=native)
    out: list[Event] = []
    pos = 0
    while pos < len(data):
        end = min(len(data), pos + chunk)
        cut = max(data.rfind(b"\n", pos, end), data.rfind(b"\r", pos, end)) + 1
        if cut <= pos:  # no terminator in reach: take the record whole
            nl = [i for i in (data.find(b"\n", end), data.find(b"\r", end)) if i >= 0]
            cut = min(nl) + 1 if nl else len(data)
        out.extend(scanner.feed(data[pos:cut], pos))
        pos = cut
    out.extend(scanner.stream.flush())
    return out


def to_jsonl(events: list[Event]) -> str:
    return "".join(
        json.dumps(e.to_dict(), ensure_ascii=False, sort_keys=False) + "\n" for e in events
    )


def golden_path(log: Path) -> Path:
    return log.with_name(log.name.removesuffix(".log") + ".events.jsonl")
