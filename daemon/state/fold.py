"""The work of one `LoadState.apply_run`: the `Fold` and its verbs.

A `Fold` holds the state the run started from, the session as it stands and the transitions
produced; the handlers (fold_log.py for log events, fold_world.py for the rest) read an input and
call its small verbs (`open_session`, `set_phase`, `advance`, `clear_stall`, `emit`, ...). What a
run made it changes in place; anything older it copies first, once per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NamedTuple, TypeVar

from loadwatch.daemon.state.durations import duration
from loadwatch.daemon.state.failures import root_cause, stop_consequences
from loadwatch.daemon.state.forecast import EtaState, next_item_seconds, stall_threshold_s
from loadwatch.daemon.state.learned import (
    LearnedStep,
    PastStart,
    comparable,
    learned_step,
    start_key,
)
from loadwatch.daemon.state.records import evolve, new_tuple
from loadwatch.daemon.state.session import (
    ORDER,
    TERMINAL,
    BarTrack,
    Failing,
    PhaseSpan,
    Session,
    Stall,
    StateConfig,
    StateData,
    retire,
    summarise,
)
from loadwatch.daemon.state.snapshot import Transition, TransitionKind
from loadwatch.daemon.state.timeline import begin, finish

_R = TypeVar("_R")
_new = object.__new__

# -- the fold -----------------------------------------------------------------------------------


class Fold:
    """The work of one `apply_run`: the state it started from, the root fields it changed, the
    session as it stands, the transitions so far. What this run made (`draft`, `mine`,
    `mine_record`) it changes in place; anything older it copies first, once per run. So a
    run of a thousand warnings copies the session and its tally once, and what the run hands
    out is never changed again."""

    __slots__ = (
        "cfg",
        "changes",
        "node_seen",
        "now",
        "offset",
        "old",
        "out",
        "owned",
        "record",
        "replay",
        "sess",
        "sess_owned",
        "ticked",
        "watch",
    )

    def __init__(
        self, state: StateData, now: float, replay: bool = False, offset: float = 0.0
    ) -> None:
        self.old = state
        self.now = now
        self.cfg = state.config
        self.sess = state.session
        self.sess_owned = False
        self.owned: set[int] = set()  # ids of the collections and records this run made
        self.changes: dict[str, Any] = {}
        self.out: list[Transition] = []
        self.replay = replay
        self.offset = offset
        self.record: int | None = None  # the offset of the log record being folded
        self.node_seen: set[tuple[Any, ...]] = set()  # (nodefold.py's `track_node`)
        self.ticked = False  # the run holds a Tick: the silent-rank check runs (ranks.py)
        self.watch: StallWatch | None = None  # what `check_stall` measured

    # -- plumbing ----------------------------------------------------------------------------

    def get(self, name: str) -> Any:
        return self.changes[name] if name in self.changes else getattr(self.old, name)

    def finish(self, inputs: int) -> Any:
        """The new state: the old one with this run's changes, session and transitions."""
        old = self.old
        new = _new(type(old))
        d = new.__dict__
        d.update(old.__dict__)
        d.update(self.changes)
        d["session"] = self.sess
        d["transitions"] = tuple(self.out)
        d["inputs_total"] = old.inputs_total + inputs
        return new

    @property
    def s(self) -> Session:
        assert self.sess is not None
        return self.sess

    def draft(self) -> Session:
        """The session, as this run's own copy."""
        s = self.sess
        assert s is not None
        if not self.sess_owned:
            copy = _new(Session)
            copy.__dict__.update(s.__dict__)
            self.sess = s = copy
            self.sess_owned = True
        return s

    def upd(self, **kw: Any) -> None:
        """Change session fields."""
        self.draft().__dict__.update(kw)

    def mine(self, name: str) -> dict[Any, Any]:
        """The session's collection `name` (bars, warnings, ...) as this run's own dict."""
        d = self.draft().__dict__
        coll = d[name]
        if id(coll) not in self.owned:
            coll = d[name] = dict(coll)
            self.owned.add(id(coll))
        return coll  # type: ignore[no-any-return]

    def mine_record(self, rec: _R) -> _R:
        """`rec` (a tally, a bar, ...) as this run's own copy, to change in place."""
        if id(rec) in self.owned:
            return rec
        copy = _new(type(rec))
        copy.__dict__.update(rec.__dict__)
        self.owned.add(id(copy))
        return copy

    def made(self, rec: _R) -> _R:
        """A record this run just built: its own to change."""
        self.owned.add(id(rec))
        return rec

    def count(self, name: str, key: Any, n: int = 1) -> None:
        """Add `n` to the state's count `name` (a mapping: `events`, `xids`, ...) at `key`; the
        run copies the mapping once."""
        counts = self.changes.get(name)
        if counts is None or id(counts) not in self.owned:
            counts = self.changes[name] = dict(self.get(name))
            self.owned.add(id(counts))
        counts[key] = counts.get(key, 0) + n

    def emit(self, kind: TransitionKind, at: float, **kw: Any) -> None:
        sid = kw.pop("session", self.sess.id if self.sess is not None else None)
        self.out.append(Transition(kind=kind, at=at, session=sid, offset=self.record, **kw))

    def at(self, ts: float | None) -> float:
        """A log event's time. Live, every event happens `now` (the daemon's clock): its own
        stamp is in vLLM's local time, of no known zone, and is never compared with the clock.
        Replayed (re-read after a restart), an event happens at its stamp moved by the offset
        the log source gives, kept in order and never after `now`; one without a stamp, at the
        time of the event before it."""
        if not self.replay:
            return self.now
        s = self.sess
        prev = s.last_event_at if s is not None else None
        if ts is None:
            return prev if prev is not None else self.now
        t = ts + self.offset
        if prev is not None and t < prev:
            t = prev
        return t if t < self.now else self.now

    # -- sessions ----------------------------------------------------------------------------

    def open_session(
        self,
        at: float,
        reason: str,
        pid: int | None = None,
        argv: tuple[str, ...] | None = None,
    ) -> None:
        old = self.sess
        if old is not None:
            settle_failure(self, "then vLLM started again")
            if self.s.stall is not None:
                self.clear_stall(at, "a new session started")
            self.clear_forecasts(at, "a new session started")
            past = (*self.get("past"), summarise(self.s, at))
            self.changes["past"] = past[-self.cfg.max_sessions :]
            self.changes["lifetime"] = retire(self.get("lifetime"), self.s)
        total = self.get("sessions_total") + 1
        self.changes["sessions_total"] = total
        self.changes["health_failures"] = 0  # the last server's failed probes are not this one's
        self.sess = Session(
            id=total,
            reason=reason,
            started_at=at,
            pid=pid,
            argv=argv,
            phase_entered_at=at,
            last_event_at=at,
            timeline=begin(at, reason),
        )
        self.sess_owned = True
        gpus = self.get("gpus")
        if any(g.fit is not None for g in gpus.values()):
            self.changes["gpus"] = {
                i: evolve(g, fit=None, projection=None) for i, g in gpus.items()
            }
        self.emit("session_started", at, reason=reason, phase_to="starting")

    def ensure_session(self, at: float) -> Session:
        if self.sess is None:
            self.open_session(at, "first_event")
        return self.s

    # -- phases ------------------------------------------------------------------------------

    def set_phase(
        self,
        to: str,
        at: float,
        reason: str,
        failure_kind: str | None = None,
        replay: bool = False,
    ) -> None:
        """`replay`: decided on records read back (see `settle_failure`)."""
        s = self.s
        was = s.phase  # (read before `upd`: the draft it changes may be `s` itself)
        if was == to:
            return
        span = PhaseSpan(was, s.phase_entered_at, at, s.failure_kind if was == "failed" else None)
        history = (*s.history, span)[-self.cfg.max_phase_history :]
        kind = failure_kind if to == "failed" else s.failure_kind
        self.upd(phase=to, phase_entered_at=at, history=history, failure_kind=kind)
        if to in TERMINAL:
            self.upd(timeline=finish(s.timeline, at))
        self.emit(
            "phase",
            at,
            phase_from=was,
            phase_to=to,
            reason=reason,
            failure_kind=kind if to == "failed" else None,
            replay=True if replay else None,
        )

    def live_phase(self) -> str:
        s = self.s
        return s.stall.resume_phase if s.stall is not None else s.phase

    def advance(self, to: str, at: float, reason: str) -> None:
        """Move forward to `to` if it is later than the live phase; reaching a later phase is
        progress, so it also ends a stall."""
        s = self.s
        if s.phase in TERMINAL or ORDER[to] <= ORDER.get(self.live_phase(), 0):
            return
        if s.failing is not None:
            return  # failing: what the echoes of the crash say is no progress
        if s.stall is not None:
            self.clear_stall(at, reason)
        self.set_phase(to, at, reason)
        if to in ("post_load", "ready"):
            self.clear_forecasts(at, "weights loaded")

    def activity(self, t: float) -> None:
        """vLLM logged something of its own at `t`: it is alive, which ends a quiet stall."""
        self.upd(last_event_at=t, log_seen=True)
        st = self.s.stall
        if st is not None and st.kind == "quiet":
            self.clear_stall(t, "log activity")

    def progressed(self, at: float, reason: str) -> None:
        """Weights progress: clears a stall and keeps the session in a live phase (not a silent
        rank's: its peers' progress is what named it; its own line clears it, ranks.py)."""
        st = self.s.stall
        if st is not None and st.kind != "rank":
            self.clear_stall(at, reason)

    # -- stalls ------------------------------------------------------------------------------

    def clear_stall(self, at: float, reason: str) -> None:
        s = self.s
        st = s.stall
        if st is None:
            return
        self.upd(stall=None)
        self.emit("stall_cleared", at, reason=reason, since=st.since, duration_s=at - st.since)
        if s.phase == "stalled":
            self.set_phase(st.resume_phase, at, reason)

    def check_stall(self) -> None:
        s = self.sess
        if s is None:
            return
        past: tuple[PastStart, ...] = ()
        if self.cfg.history:
            key = start_key(self.get("model"), self.get("gpus"), s)
            past = comparable(self.cfg.history, key)
        watch = self.watch = stall_watch(s, self.cfg, past)
        now = self.now
        if watch is None or now - watch.since <= watch.threshold_s:
            return
        kind, last, threshold, expected, step = watch
        if step is not None:
            reason = step.reason(now)
        elif kind == "progress":
            reason = f"no shard finished and no bytes read for {duration(now - last)}"
        else:
            reason = f"nothing logged and no bytes read for {duration(now - last)}"
        self.raise_stall(Stall(kind, last, now, threshold, expected, reason, s.phase))

    def raise_stall(self, st: Stall) -> None:
        self.upd(stall=st, stalls_total=self.s.stalls_total + 1)
        at = st.raised_at
        self.emit("stall_raised", at, reason=st.reason, since=st.since, threshold_s=st.threshold_s)
        self.set_phase("stalled", at, st.reason)

    # -- forecasts ---------------------------------------------------------------------------

    def clear_forecasts(self, at: float, reason: str) -> None:
        gpus = self.get("gpus")
        if not any(g.oom_since is not None for g in gpus.values()):
            return
        new = dict(gpus)
        for i, g in gpus.items():
            if g.oom_since is not None:
                new[i] = evolve(g, oom_since=None)
                self.emit(
                    "forecast_cleared", at, gpu_index=i, forecast="oom_predicted", reason=reason
                )
        self.changes["gpus"] = new


# -- a fatal failure held for its echoes ---------------------------------------------------------


def hold_failure(f: Fold, at: float) -> None:
    """A fatal failure at `at`: the session fails once `failure_hold_s` (the daemon's clock) is
    over, or sooner when the session ends (`settle_failure`), with the root cause the records
    of that crash name by then."""
    if f.s.failing is None:
        f.upd(failing=Failing(f.now, at, f.replay))
    if f.cfg.failure_hold_s <= 0:
        settle_failure(f)


def settle_due(f: Fold) -> None:
    """After a run: the held failure whose hold is over is decided."""
    s = f.sess
    if s is not None and s.failing is not None and f.now - s.failing.since >= f.cfg.failure_hold_s:
        settle_failure(f)


def settle_failure(f: Fold, why: str | None = None) -> bool:
    """Decide the failure held for its echoes, now (`why`: what ended the hold early). The
    session fails with its root cause, said once: one `failure` transition, then the phase, at
    the time the failure happened. A stop asked for meanwhile makes a consequence standing in
    for a root cause (a worker dead of the stop's signal) the shutdown. True when the session
    failed."""
    s = f.s
    failing = s.failing
    if failing is None:
        return False
    f.upd(failing=None)
    if s.phase == "failed":
        return True
    failures = s.failures
    if s.stop_requested:
        failures = stop_consequences(failures)
        f.upd(failures=failures)
    root = root_cause(failures)
    if root is None:
        return False
    at = max(failing.at, s.phase_entered_at)
    if f.s.stall is not None:
        f.clear_stall(at, "failed")
    f.clear_forecasts(at, "session failed")
    f.emit(
        "failure",
        at,
        failure_kind=root.kind,
        message=(root.exc_type + ": " if root.exc_type else "") + root.message[:300],
        fatal=True,
        replay=True if failing.replayed else None,
    )
    reason = f"{root.kind}: {root.message[:200]}" + (f" ({why})" if why else "")
    f.set_phase("failed", at, reason, failure_kind=root.kind, replay=failing.replayed)
    return True


# The bar estimator the stall check asked last, and its answer: asked after every run of input
# (each second of a log analyze reads), an estimator changes only with its bar's updates, and
# it is an immutable value (the same object, the same answer).
_asked: tuple[EtaState | None, float | None] = (None, None)


def _next_item_seconds(eta: EtaState) -> float | None:
    global _asked
    last, answer = _asked
    if last is not eta:
        answer = next_item_seconds(eta)
        _asked = (eta, answer)
    return answer


def active_weights_bar(s: Session) -> BarTrack | None:
    """The unfinished weights bar updated last, if any. (Beside the stall check, its one user,
    which looks at it after every run of input.)"""
    best: BarTrack | None = None
    for b in s.bars.values():
        if (
            b.kind == "weights"
            and b.finished_at is None
            and (best is None or b.last_update_at > best.last_update_at)
        ):
            best = b
    return best


class StallWatch(NamedTuple):
    """What the stall check measures now: the silence since `since` against `threshold_s`."""

    kind: Literal["progress", "quiet"]
    since: float  # the last sign of life: a shard or bytes read; for "quiet", a step in the log too
    threshold_s: float
    expected_shard_s: float | None
    step: LearnedStep | None = None  # a step without a bar judged by the past starts' times


def stall_watch(s: Session, cfg: StateConfig, past: Sequence[PastStart] = ()) -> StallWatch | None:
    """The watch a session not (yet) stalled is under: while it loads (starting, loading the
    weights, after them), none once it serves, ended or is stalled already. Outside the
    weights bar, a step the comparable past starts (`past`, learned.py) show may stay silent as
    long as they allow; any other, `quiet_stall_s`."""
    if s.stall is not None or s.phase in TERMINAL or s.phase == "ready" or s.failing is not None:
        return None
    io_mark = s.io.mark_at if s.io is not None and s.io.mark_at is not None else 0.0
    step: LearnedStep | None = None
    bar = active_weights_bar(s) if s.phase == "loading_weights" else None
    if bar is not None:
        eta = bar.eta
        expected = _next_item_seconds(eta) if eta is not None and eta.regime else None
        if expected is None:
            # Files the daemon read too close together to time (a burst, a busy moment): the
            # bar's own rate says what a file takes.
            expected = bar.tqdm_item_s
        if expected is None:
            threshold = max(cfg.stall_first_shard_s, cfg.stall_floor_s)
        else:
            threshold = stall_threshold_s(expected, cfg.stall_k, cfg.stall_floor_s)
        last = max(bar.last_progress_at or bar.started_at, io_mark)
        kind: Literal["progress", "quiet"] = "progress"
    elif past and (learned := learned_step(past, s, cfg.stall_k, cfg.stall_floor_s)) is not None:
        step, threshold, expected = learned, learned.threshold_s, None
        last = max(s.last_event_at, io_mark)
        kind = "quiet"
    elif cfg.quiet_stall_s is not None:
        threshold, expected = cfg.quiet_stall_s, None
        last = max(s.last_event_at, io_mark)
        kind = "quiet"
    else:
        return None
    # "How long since" is the daemon's clock: a backlog (a log read late, or re-read after a
    # restart) is silent only from when it was read, whatever its stamps say.
    if s.backlog_read_at is not None and s.backlog_read_at > last:
        last = s.backlog_read_at
    return new_tuple(StallWatch, (kind, last, threshold, expected, step))
