"""Helpers every test directory shares: appending to a log as vLLM does, waiting for a condition."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def append(path: Path | str, data: bytes | str | Iterable[str]) -> None:
    """Append to a file, as a writer that opens it for each write (vLLM's redirected stdout
    holds it open; to a reader that is the same)."""
    if isinstance(data, str):
        data = data.encode()
    elif not isinstance(data, bytes):
        data = "".join(data).encode()
    with open(path, "ab") as f:
        f.write(data)


def wait_for(
    check: Callable[[], object], what: str, timeout_s: float = 20.0, every_s: float = 0.02
) -> None:
    """Wait until `check()` is true; an AssertionError naming `what` (and the last error the
    check raised, if any) when `timeout_s` passes first. A check that raises (the daemon is not
    up yet, the document has no such key yet) counts as not yet."""
    end = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < end:
        try:
            if check():
                return
        except (AssertionError, KeyError, TypeError, ValueError, OSError) as exc:
            last = exc
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def per_record(events: list[dict[str, Any]], logs: Iterable[bytes]) -> list[dict[str, Any]]:
    """The event log's lines with each folded `log.kv_scale_run` line written out as the records
    it stands for, one `log.kv_scale_warning` line each with that record's fields (and the
    folded line's replay mark), as `[events] fold = false` writes them. `logs`: the bytes of the
    files the offsets point into; a folded line must stand for exactly `count` k/v warning
    records of one of them, from its first offset to its last, or this fails."""
    from loadwatch.parsers import ChunkScanner, KvScaleWarning

    kv: list[list[int]] = []
    fields: dict[int, dict[str, Any]] = {}  # a record's line, by its offset
    for data in logs:
        scanner = ChunkScanner()
        evs = [e for e in scanner.feed(data) + scanner.stream.flush() if type(e) is KvScaleWarning]
        kv.append([e.offset for e in evs])
        for e in evs:
            doc = {k: v for k, v in e.to_dict().items() if v is not None and k != "type"}
            fields.setdefault(e.offset, json.loads(json.dumps(doc)))
    out: list[dict[str, Any]] = []
    for e in events:
        if e.get("event") != "log.kv_scale_run":
            out.append(e)
            continue
        first, last, count = e["offset"], e["last_offset"], e["count"]
        spans = [[o for o in offsets if first <= o <= last] for offsets in kv]
        records = next(
            (s for s in spans if len(s) == count and s[0] == first and s[-1] == last), None
        )
        assert records is not None, f"a folded line stands for no {count} records: {e}"
        mark = {"replay": True} if e.get("replay") else {}
        out += [{"event": "log.kv_scale_warning", **fields[o], **mark} for o in records]
    return out
