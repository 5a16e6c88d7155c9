"""The crash loop under way (daemon/state/crashloop.py), in the state directory: one JSON file,
written each time the loop changes (a first failure, a remedy applied or reverted) and removed
when a start reaches ready, so a restart of the daemon keeps the root cause and the ladder's
place.

Written and read as every state file is (statefile.py: whole or not at all; one that cannot be
read as a crash loop is set aside with one `daemon.problem` line, and the daemon goes on with
none). The argv in it is redacted before it is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadwatch.daemon.state.crashloop import (
    MAX_ARGV,
    MAX_DIFF_LINES,
    MAX_EXCERPT_LINES,
    MAX_LINE_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_STEPS,
    OUTCOMES,
    CrashLoop,
    FirstFailure,
    RemedyStep,
    diff_lines,
)
from loadwatch.daemon.statefile import BadDocument, StateFile, bounded_list, document

FILE_NAME = "crash_loop.json"
FORMAT = 1
MAX_BYTES = 256 * 1024


class BadCrashLoop(BadDocument):
    pass


def to_json(loop: CrashLoop) -> bytes:
    first = asdict(loop.first_failure) if loop.first_failure is not None else None
    # (a change of the command gives its diff again; a patch's diff, of files, is kept)
    steps = [
        {k: v for k, v in asdict(s).items() if k != "diff" or s.option is None}
        for s in loop.remedies
    ]
    doc = {"format": FORMAT, "first_failure": first, "remedies": steps, "exhausted": loop.exhausted}
    return json.dumps(doc, indent=1).encode() + b"\n"


def _text(v: Any, what: str, limit: int, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > limit:
        raise BadCrashLoop(f"{what} is not text")
    return v


def _time(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadCrashLoop("a time is not a number")
    return float(v)


def _texts(v: Any, what: str, count: int, limit: int) -> tuple[str, ...]:
    if not isinstance(v, list) or len(v) > count:
        raise BadCrashLoop(f"{what} is not a list")
    return tuple(_text(x, what, limit) for x in v)


def _first(d: Any) -> FirstFailure | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise BadCrashLoop("first_failure is not an object")
    return FirstFailure(
        kind=_text(d.get("kind"), "kind", 80),
        phase=_text(d.get("phase"), "phase", 80),
        message=_text(d.get("message"), "message", MAX_MESSAGE_CHARS),
        excerpt=_texts(d.get("excerpt"), "excerpt", MAX_EXCERPT_LINES, MAX_LINE_CHARS),
        argv=_texts(d.get("argv"), "argv", MAX_ARGV, 65536),
        at=_time(d.get("at")),
    )


def _step(d: Any) -> RemedyStep:
    if not isinstance(d, dict) or d.get("outcome") not in OUTCOMES:
        raise BadCrashLoop("a remedy is not one")
    option = _text(d.get("option"), "option", 80, True)
    before = _text(d.get("before"), "before", 4096, True)
    after = _text(d.get("after"), "after", 4096, True)
    diff = diff_lines(option, before, after)
    if option is None and d.get("diff") is not None:
        diff = _texts(d.get("diff"), "diff", MAX_DIFF_LINES, MAX_LINE_CHARS * 4)
    return RemedyStep(
        remedy=_text(d.get("remedy"), "remedy", 80),
        outcome=d["outcome"],
        reason=_text(d.get("reason"), "reason", MAX_MESSAGE_CHARS),
        option=option,
        before=before,
        after=after,
        at=_time(d.get("at")),
        diff=diff,
        patched=_text(d.get("patched"), "patched", 4096, True),
    )


def from_json(data: bytes) -> CrashLoop:
    doc = document(data, FORMAT, "a crash loop")
    steps = bounded_list(doc, "remedies", MAX_STEPS)
    exhausted = doc.get("exhausted", False)
    if not isinstance(exhausted, bool):
        raise BadCrashLoop("exhausted is not true or false")
    return CrashLoop(_first(doc.get("first_failure")), tuple(_step(s) for s in steps), exhausted)


class CrashLoopFile:
    """The crash-loop file of one state directory (statefile.py); `problem` says one line of
    what went wrong."""

    def __init__(self, state_dir: Path, problem: Callable[[str], None]) -> None:
        self.file = StateFile(
            state_dir,
            FILE_NAME,
            what="crash loop",
            max_bytes=MAX_BYTES,
            parse=from_json,
            none=CrashLoop(),
            problem=problem,
        )
        self.path = self.file.path

    def load(self) -> CrashLoop:
        """The loop kept; none when there is no file, or one set aside as corrupt."""
        return self.file.load()

    def save(self, loop: CrashLoop) -> None:
        """Write `loop`; remove the file when there is no loop under way."""
        if loop.first_failure is None:
            self.file.remove()
        else:
            self.file.save(to_json(loop))


__all__ = ["FILE_NAME", "BadCrashLoop", "CrashLoopFile", "from_json", "to_json"]
