"""A crash loop as the daemon keeps it: the first failure (the one with the root cause, which the
later attempts' echoes bury) and the remedies tried on the way (daemon/supervise/remedies.py).

Kept in the state directory (daemon/crashloop_file.py) until a start reaches ready, so a restart
of vLLM or of the daemon neither loses the root cause nor starts the ladder of remedies again;
shown on `/status` as `first_failure` and `remedies`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from loadwatch.daemon.state.failures import FailureTally

MAX_EXCERPT_LINES = 12
MAX_LINE_CHARS = 400
MAX_MESSAGE_CHARS = 2000
MAX_ARGV = 256  # arguments kept of the command
MAX_DIFF_LINES = 40  # of a change of files (a patch's report)
MAX_STEPS = 32  # remedies of one loop (each is applied at most once: there are few)

# What became of a remedy: applied before a start; that start reached ready (helped) or failed
# again (reverted before the next remedy); `none`: no remedy for this failure, said why.
OUTCOMES = ("applied", "helped", "reverted", "none")


@dataclass(frozen=True, slots=True)
class FirstFailure:
    """The first failed start of a crash loop."""

    kind: str  # the failure catalog's kind (`other` or `exited` when none was classified)
    phase: str  # the start-up step under way when it failed (timeline.py's phases)
    message: str
    excerpt: tuple[str, ...]  # the failure's records: its first line, its exception, echoes
    argv: tuple[str, ...]  # the command, redacted
    at: float


@dataclass(frozen=True, slots=True)
class RemedyStep:
    """One remedy of a crash loop: the change of the command, why, and what became of it."""

    remedy: str
    outcome: str  # OUTCOMES
    reason: str
    option: str | None = None  # the argument changed (`--max-model-len`)
    before: str | None = None  # its value before (None: not given)
    after: str | None = None
    at: float = 0.0
    diff: tuple[str, ...] = ()  # the change as diff lines of the command (`diff_lines`)
    patched: str | None = None  # the model directory whose config the remedy patched


def diff_lines(option: str | None, before: str | None, after: str | None) -> tuple[str, ...]:
    """A change of the command as diff lines: `- --max-model-len 4096`, `+ --max-model-len 2048`."""
    if option is None:
        return ()
    lines = []  # (a value "" is a flag given without one: `+ --enforce-eager`)
    if before is not None:
        lines.append(f"- {option} {before}".rstrip())
    if after is not None:
        lines.append(f"+ {option} {after}".rstrip())
    return tuple(lines)


@dataclass(frozen=True, slots=True)
class CrashLoop:
    """The crash loop under way (`first_failure` None: none), the remedies of it, and whether
    the ladder is exhausted (remedies were tried and none is left for the failure)."""

    first_failure: FirstFailure | None = None
    remedies: tuple[RemedyStep, ...] = ()
    exhausted: bool = False

    @property
    def in_effect(self) -> RemedyStep | None:
        """The remedy the next (or current) start runs with: the last one, if applied."""
        if self.remedies and self.remedies[-1].outcome == "applied":
            return self.remedies[-1]
        return None


@dataclass(frozen=True, slots=True)
class RemedyCounts:
    """Lifetime counts of remedies by (remedy, outcome): `loadwatch_vllm_remedies_total`."""

    counts: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def add(self, remedy: str, outcome: str) -> RemedyCounts:
        out = dict(self.counts)
        out[(remedy, outcome)] = out.get((remedy, outcome), 0) + 1
        return RemedyCounts(out)


def excerpt_of(root: FailureTally) -> tuple[str, ...]:
    """A bounded excerpt of a failure: its first record's line, its exception and the distinct
    messages of its echoes, each cut to `MAX_LINE_CHARS`."""
    lines: list[str] = []
    exc = f"{root.exc_type}: {root.message}" if root.exc_type else root.message
    for text in (root.first_line, exc, *(e.message for e in root.evidence)):
        line = " ".join(text.split())[:MAX_LINE_CHARS]
        if line and line not in lines:
            lines.append(line)
    return tuple(lines[:MAX_EXCERPT_LINES])


__all__ = [
    "MAX_ARGV",
    "MAX_DIFF_LINES",
    "MAX_EXCERPT_LINES",
    "MAX_LINE_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_STEPS",
    "OUTCOMES",
    "CrashLoop",
    "FirstFailure",
    "RemedyCounts",
    "RemedyStep",
    "diff_lines",
    "excerpt_of",
]
