"""The fold's handler of failures, and when one fails the session.

Before vLLM serves, every failure the log shows fails the session. Once it serves, vLLM logs
text its clients choose and a request's errors like any other, so an error alone is held as a
warning, and the session fails only on corroboration: the engine's own word that it died, the
process's exit, or /health failing within `corroboration_window_s` (`corroborate`).

A fatal failure fails the session once `failure_hold_s` is over (fold.py `hold_failure`): one
crash logs its echoes first (`EngineCore failed to start.`, then the traceback that says why), and
the session fails once, of the root cause. The end of the process, a shutdown line or a new
session decide it sooner.
"""

from __future__ import annotations

from dataclasses import replace

from loadwatch.daemon.state.failures import (
    FailureTally,
    fold_failure,
    session_kind,
    shutdown_noise,
)
from loadwatch.daemon.state.fold import Fold, hold_failure, settle_failure
from loadwatch.daemon.state.session import TERMINAL, Session, failure_rank
from loadwatch.daemon.state.snapshot import SessionSummary
from loadwatch.parsers.events import Failure


def fatal_now(s: Session, ev: Failure) -> bool:
    """Before vLLM serves, every failure the log shows is fatal. Once it serves, clients choose
    text vLLM logs (a model name, a request id) and a request's error is logged like any other:
    an error alone is a warning, and the session fails only on corroboration: the engine's own
    word that it died (`engine_fatal`), or, through `corroborate`, the process's exit or
    /health failing. What follows that word (held for its echoes, or failed) is that crash's."""
    if s.stop_requested:
        return False
    if ev.kind == "completion_failed":
        return True  # loadwatch's own check, not the log's
    return s.ready_at is None or ev.engine_fatal or s.phase == "failed" or s.failing is not None


def corroborate(f: Fold, t: float, why: str) -> bool:
    """The server is gone or failing (`why`): the failures the log showed shortly before, held
    as warnings while it served, were fatal after all. The session fails with the most telling
    of them; False when there were none (then the caller decides what the end was)."""
    s = f.s
    if s.failing is not None:
        return settle_failure(f, why)  # held for its echoes: the end decides it now
    if s.stop_requested or s.phase in TERMINAL:
        return False
    held = _held_failures(f, t)
    if not held:
        return False
    kind = session_kind(f.s.failures) or "other"
    if f.s.stall is not None:
        f.clear_stall(t, "failed")
    f.clear_forecasts(t, "session failed")
    best = min(held, key=lambda v: failure_rank(v.kind))
    f.set_phase("failed", t, f"{kind}: {best.message[:200]} ({why})", failure_kind=kind)
    return True


def _held_failures(f: Fold, t: float) -> list[FailureTally]:
    """The failures held as warnings within the corroboration window before `t` that say why
    an engine dies (an `other` error is a request's), now made fatal (in the session's draft)."""
    s = f.s
    since = t - f.cfg.corroboration_window_s
    held = [
        v for v in s.failures.values() if not v.fatal and v.kind != "other" and v.last_at >= since
    ]
    if held:
        failures = {k: replace(v, fatal=True) if v in held else v for k, v in s.failures.items()}
        f.upd(failures=failures)
    return held


def on_failure(f: Fold, ev: Failure) -> None:
    t = f.at(ev.ts)
    s = f.sess
    past = f.get("past")
    # A failure the previous process logged, read after the next one started: the new
    # process has logged nothing yet (live, the record's stamp says nothing about the clock),
    # or, replayed, its time is before the start.
    if (
        s is not None
        and s.reason == "process_start"
        and past
        and not s.log_seen
        and (not f.replay or t < s.started_at - 1.0)
    ):
        _late_failure(f, ev, t, past)
        return
    s = f.ensure_session(t)
    f.activity(t)
    s = f.s
    if shutdown_noise(ev, s.stop_requested):
        return  # the shutdown that was asked for, not a failure
    fatal = fatal_now(s, ev)
    if fatal and s.ready_at is not None and s.phase != "failed":
        _held_failures(f, t)  # the engine died: the errors just before it say why
        s = f.s
    folded = fold_failure(s.failures, ev, t, fatal, f.cfg.max_failures, f.cfg.max_processes)
    f.upd(failures=folded.failures, failures_total=s.failures_total + 1)
    failed = s.phase == "failed"
    # A fatal one before the session failed is said once, of the root cause, when it fails.
    if folded.new_root and (failed or not fatal):
        f.emit(
            "failure",
            t,
            failure_kind=ev.kind,
            message=(ev.exc_type + ": " if ev.exc_type else "") + ev.message[:300],
            fatal=fatal,
        )
    if not fatal:
        return
    if failed:
        kind = session_kind(folded.failures) or ev.kind
        if kind != s.failure_kind:
            f.upd(failure_kind=kind)
        return
    hold_failure(f, t)


def _late_failure(f: Fold, ev: Failure, t: float, past: tuple[SessionSummary, ...]) -> None:
    """A failure logged by the previous process, read after the next one started."""
    last = past[-1]
    kind = last.failure_kind
    phase = last.phase
    if not last.stop_requested:
        if failure_rank(ev.kind) < failure_rank(kind):
            kind = ev.kind
        if phase == "stopped":
            phase = "failed"
    f.changes["past"] = (
        *past[:-1],
        replace(last, failure_kind=kind, phase=phase, failures_total=last.failures_total + 1),
    )
    f.emit(
        "failure",
        t,
        session=last.id,
        failure_kind=ev.kind,
        message=ev.message[:300],
        fatal=not last.stop_requested,
    )
