"""The crash loop a log ends with, for `loadwatch analyze`: its length and its first failure, the
one with the root cause (the later starts' failures are often its echoes, or the same again).

The daemon keeps the same first failure in its state directory while it supervises
(daemon/state/crashloop.py); this is what the log alone holds of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loadwatch.daemon.state.snapshot import STARTUP_UNKNOWN


@dataclass(frozen=True, slots=True)
class CrashLoopReport:
    failed_starts: int  # the sessions, back to back at the log's end, that failed
    session: int  # the first of them
    line: int | None  # of its root cause's first record
    kind: str | None
    phase: str  # the start-up step under way when it failed (timeline.py's phases)
    exc_type: str | None
    message: str | None


def crash_loop_of(sessions: Sequence[Any]) -> CrashLoopReport | None:
    """The failed sessions the log ends with, when there are two or more, by the first one
    (`sessions`: report.py's `SessionReport`s, which import this module)."""
    run = []
    for s in reversed(sessions):
        if s.verdict.status != "failed":
            break
        run.append(s)
    if len(run) < 2:
        return None
    first = run[-1]
    roots = [f for f in first.failures if f.fatal]
    root = next((f for f in roots if f.kind == first.failure_kind), roots[0] if roots else None)
    phase = first.timeline[-1].phase if first.timeline else STARTUP_UNKNOWN
    return CrashLoopReport(
        failed_starts=len(run),
        session=first.id,
        line=root.line if root is not None else first.line,
        kind=root.kind if root is not None else first.failure_kind,
        phase=phase,
        exc_type=root.exc_type if root is not None else None,
        message=root.message if root is not None else None,
    )


def crash_loop_text(c: CrashLoopReport) -> str:
    """One line: `crash loop of 3 failed starts; the first (session 1, line 40): ...`."""
    where = f"session {c.session}" + (f", line {c.line}" if c.line is not None else "")
    what = f"{c.kind or 'unknown'} in {c.phase}"
    if c.message:
        msg = f"{c.exc_type}: {c.message}" if c.exc_type else c.message
        what += f": {msg[:300]}"
    return f"crash loop of {c.failed_starts} failed starts; the first ({where}): {what}"


__all__ = ["CrashLoopReport", "crash_loop_of", "crash_loop_text"]
