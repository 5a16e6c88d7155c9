"""Failures as root causes: which failure records describe one crash.

One crash of vLLM leaves many failure records: the root traceback in the worker (`CUDA out of
memory`), then its echoes: the worker's `WorkerProc failed to start.`, the engine core's
`EngineCore failed to start.` or `Worker failed with error '<the root message>'`, the API server's
`RuntimeError: Engine core initialization failed. See root cause above.` (and even the quoted
source line `raise RuntimeError("Engine core initialization failed. "`), a re-raised copy of the
same traceback (`Process EngineCore_0:`), an `EngineDeadError` in every waiting request. These
rules, the only home of that judgement, fold them into one entry per root cause. Which record
is a consequence and what a wrapper carries are the grammar's to say (`Failure.consequence`,
`Failure.cause`: the wordings are vLLM's); what is made of them is said here:

- a *consequence* (a record that says that something failed, not why: a dead worker, a failed
  start, a traceback cut before its exception line, `Error executing method ...`) folds into the
  session's most telling fatal root cause when there is one (a request's error while serving
  explains no later crash); when there is none yet it stands as a provisional root, and a root
  cause that comes later (its traceback closes after the echoes were logged) takes it over;
- a record with the message of a root already kept (the same kind and message, or the cause a
  re-raising wrapper such as `Worker failed with error '...'` carries) is an echo of it: a
  re-raise, a copy printed raw and then logged, another worker with the same error;
- anything else is a new root cause.

Every echo is kept as evidence on its root: the count, the processes, a bounded list of the
records (offset, exception type, message) so a report can point at each line.

After a requested stop (SIGTERM, the supervisor's stop) the consequences are the shutdown itself,
never a failure (`shutdown_noise`). The same functions serve the daemon's state fold (and through
it /status and /metrics) and the analyze report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from loadwatch.parsers.events import FAILURE_RANK, Failure

MAX_EVIDENCE = 16  # records kept per root cause (the count keeps going)
KEY_CHARS = 300


@dataclass(frozen=True, slots=True)
class Evidence:
    """One record folded into a root cause."""

    offset: int
    exc_type: str | None
    message: str
    process: str | None


@dataclass(frozen=True)
class FailureTally:
    """One root cause and what echoed it."""

    kind: str
    exc_type: str | None
    message: str
    first_line: str
    count: int  # records: the root and its echoes
    fatal: bool
    first_at: float
    last_at: float
    processes: frozenset[str]
    offset: int | None = None  # where the root's first record begins (the anchor)
    echoes: int = 0  # records folded in besides the root's own first one
    evidence: tuple[Evidence, ...] = ()
    provisional: bool = False  # a consequence standing in until a root cause is seen


Key = tuple[str, str]


def root_message(ev: Failure) -> str:
    """The message a record is about: the cause a re-raising wrapper carries (the grammar
    says), else its own; its white space made single."""
    return " ".join((ev.cause or ev.message).split())


def key_of(ev: Failure) -> Key:
    return (ev.kind, root_message(ev)[:KEY_CHARS])


def is_consequence(ev: Failure) -> bool:
    """A record that says that something failed, not why (the grammar says: a dead worker or
    engine, a failed start, a traceback cut before its exception line, a worker method's error
    wrapper)."""
    return ev.consequence


def shutdown_noise(ev: Failure, stop_requested: bool) -> bool:
    """A consequence logged after a stop was asked for: the shutdown, not a failure."""
    return stop_requested and is_consequence(ev)


@dataclass(frozen=True, slots=True)
class Folded:
    failures: Mapping[Key, FailureTally]
    key: Key  # the entry the record went to
    new_root: bool  # a root cause (or provisional one) first seen with this record


def _evidence(ev: Failure) -> Evidence:
    return Evidence(ev.offset, ev.exc_type, ev.message[:300], ev.process)


def _add_procs(procs: frozenset[str], more: frozenset[str], limit: int) -> frozenset[str]:
    if more <= procs:
        return procs
    out = set(procs)
    for p in sorted(more - procs):
        if len(out) >= limit:
            break
        out.add(p)
    return frozenset(out)


def _absorb(
    root: FailureTally,
    count: int,
    at_first: float,
    at_last: float,
    procs: frozenset[str],
    evidence: tuple[Evidence, ...],
    fatal: bool,
    limit: int,
) -> FailureTally:
    return replace(
        root,
        count=root.count + count,
        echoes=root.echoes + count,
        first_at=min(root.first_at, at_first),
        last_at=max(root.last_at, at_last),
        processes=_add_procs(root.processes, procs, limit),
        evidence=(root.evidence + evidence)[:MAX_EVIDENCE],
        fatal=root.fatal or fatal,
    )


def _best_root(failures: Mapping[Key, FailureTally]) -> Key | None:
    best: Key | None = None
    for key, tally in failures.items():
        if tally.provisional or not tally.fatal:
            continue  # a request's error while serving explains no later crash
        if best is None or FAILURE_RANK.get(tally.kind, 99) < FAILURE_RANK.get(
            failures[best].kind, 99
        ):
            best = key
    return best


def fold_failure(
    failures: Mapping[Key, FailureTally],
    ev: Failure,
    t: float,
    fatal: bool,
    max_failures: int,
    max_processes: int,
) -> Folded:
    """The session's root causes with one more failure record folded in."""
    procs = frozenset({ev.process}) if ev.process else frozenset()
    ev_evidence = (_evidence(ev),)
    out = dict(failures)
    key = key_of(ev)
    if key in out:  # the same root again: a re-raise, a copy, another worker
        out[key] = _absorb(out[key], 1, t, t, procs, ev_evidence, fatal, max_processes)
        return Folded(out, key, False)
    if is_consequence(ev):
        root = _best_root(out)
        if root is None:  # no root cause yet: the first consequence stands in for it
            root = next((k for k, v in out.items() if v.provisional), None)
        if root is not None:
            out[root] = _absorb(out[root], 1, t, t, procs, ev_evidence, fatal, max_processes)
            return Folded(out, root, False)
    if len(out) >= max_failures:
        key = ("other", "more failures than kept")
        if key in out:
            out[key] = _absorb(out[key], 1, t, t, procs, ev_evidence, fatal, max_processes)
            return Folded(out, key, False)
    tally = FailureTally(
        kind=ev.kind,
        exc_type=ev.exc_type,
        message=ev.message[:2000],
        first_line=ev.first_line,
        count=1,
        fatal=fatal,
        first_at=t,
        last_at=t,
        processes=procs,
        offset=ev.offset,
        evidence=ev_evidence,
        provisional=is_consequence(ev),
    )
    if not tally.provisional:
        # A root cause whose traceback closed after its echoes were logged takes them over.
        for k in [k for k, v in out.items() if v.provisional and (fatal or not v.fatal)]:
            p = out.pop(k)
            tally = _absorb(
                tally,
                p.count,
                p.first_at,
                p.last_at,
                p.processes,
                p.evidence,
                p.fatal,
                max_processes,
            )
    out[key] = tally
    return Folded(out, key, True)


def root_cause(failures: Mapping[Key, FailureTally]) -> FailureTally | None:
    """What a session failed of: its most telling fatal root cause; a consequence only while
    no root cause is known."""
    best = _best_root(failures)
    if best is not None:
        return failures[best]
    for tally in failures.values():
        if tally.provisional and tally.fatal:
            return tally
    return None


def session_kind(failures: Mapping[Key, FailureTally]) -> str | None:
    """The kind a session failed with: its root cause's (`root_cause`)."""
    root = root_cause(failures)
    return root.kind if root is not None else None


def stop_consequences(failures: Mapping[Key, FailureTally]) -> dict[Key, FailureTally]:
    """`failures` once a stop was asked for: a consequence standing in for a root cause (a
    worker that died as the stop's signal reached it before the API server said it stops) is
    the shutdown, not a failure. A root cause stays what it was."""
    return {k: replace(v, fatal=False) if v.provisional else v for k, v in failures.items()}


__all__ = [
    "Evidence",
    "FailureTally",
    "Folded",
    "fold_failure",
    "is_consequence",
    "key_of",
    "root_cause",
    "root_message",
    "session_kind",
    "shutdown_noise",
    "stop_consequences",
]
