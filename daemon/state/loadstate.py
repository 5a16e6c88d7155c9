"""The load state: a pure fold over everything the daemon observes.

    state = LoadState()                      # or LoadState(config=StateConfig(...))
    state = state.apply(item, now)           # item: parser Event, GpuReading, ProcessEvent,
    for t in state.transitions: log(t)       #   IoSample, ModelInfo, HealthProbe, OrphanCheck
    snap = state.snapshot(now)               #   or Tick; snap: immutable view for exporters

`apply` and `apply_run` (a run of inputs in one call: the fast way) never change the state they
are called on: they return a new `LoadState` that shares every part the run did not change, and
whose `transitions` are the ones this call produced. Within the call the fold changes its own
copies in place (fold.py), so a run copies each part it touches once, and inputs of one type
back to back go to that type's handler in one call (one tally for a load's run of k/v
warnings, one update of a bar for a burst of its updates read at one instant, fold_bars.py);
stalls are judged once per run (a rank silent while its peers moved on, ranks.py, in a run
that holds a Tick). Folding a run in one call or one input at a time gives the same state
(tests/state/test_apply_run.py). There is no I/O and no clock here: `now` is the observation time. A log event's own timestamp (second resolution) is
never compared with `now`: vLLM stamps in its own local time, of no known zone. Live, a log event
happens at `now`; replayed (`replay=True`: re-read after a restart, as the log source says), at its
stamp plus `stamp_offset_s`, in order and never after `now`. Stall checks run only on live inputs.

Sessions. Each vLLM start opens a session: the supervisor's `ProcessEvent(kind="started")`, or in
the log a `version` milestone (unless the session is still starting and has none yet), or
`model_load_start` once the session is past loading. The session before is summarised into
`past` (the last `max_sessions`).

Phases: starting -> loading_weights -> post_load -> ready, moving forward only; failed and
stopped end a session; stalled is entered from a live phase and left when progress resumes. A
fatal `Failure` fails the session whatever the exit code (vLLM exits 0 after its engine died),
once `failure_hold_s` of the daemon's clock let the crash's echoes in (its root cause is the
kind), or when the process ends first; a
failure after the supervisor asked the process to stop is kept but not fatal (a clean SIGTERM
still logs `EngineDeadError`), and once the server was ready a failure of kind "other" (a
request's traceback) is not fatal. Failures that describe one crash are kept as one entry per
(kind, message) with a count; the session's failure kind is the most telling (`FAILURE_RANK`).

Counts. The state keeps every count /metrics exports (`StateData`: log events by type, Xid
errors, vLLM's exits, the sessions' warnings, failures and stalls in `lifetime`), one home each.
A daemon restart rebuilds the log's counts with the state, from the current session's records;
the GPUs' and the processes' begin again with the daemon.

Cost: per input O(1) amortised. Every per-session collection is capped (bars, warning codes,
processes per code, failures, phase history), layer numbers are bits of an int, and the
estimators keep fixed-size windows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loadwatch.daemon.sources.inputs import HealthProbe, Tick
from loadwatch.daemon.state.failures import FailureTally
from loadwatch.daemon.state.fold import Fold, settle_due, settle_failure
from loadwatch.daemon.state.fold_failure import on_failure
from loadwatch.daemon.state.fold_log import LOG_HANDLERS, LOG_RUNS
from loadwatch.daemon.state.fold_world import WORLD_HANDLERS
from loadwatch.daemon.state.nodefold import NODE_EVENTS, track_node
from loadwatch.daemon.state.ranks import check_silent_rank
from loadwatch.daemon.state.session import (
    BarTrack,
    GpuTrack,
    Input,
    IoTrack,
    MilestoneSeen,
    Phase,
    PhaseSpan,
    Session,
    Stall,
    StateConfig,
    StateData,
    WarningTally,
)
from loadwatch.daemon.state.snapshot import Snapshot, Transition
from loadwatch.daemon.state.snapshot_builder import build_snapshot
from loadwatch.parsers.events import Event, Failure

RunHandler = Callable[[Fold, Sequence[Any]], None]


def _each(handler: Callable[[Fold, Any], None], logged: bool) -> RunHandler:
    """The run handler of a type folded one input at a time (a log event's transitions carry
    its record's offset)."""

    def run(f: Fold, items: Sequence[Any]) -> None:
        for item in items:
            f.record = item.offset if logged else None
            handler(f, item)
            track_node(f, item)

    return run


# Per input type, the handler of a run of inputs of that type back to back.
RUN_HANDLERS: dict[type, RunHandler] = {
    **{
        cls: _each(h, logged=True)
        for cls, h in {**LOG_HANDLERS, Failure: on_failure, **NODE_EVENTS}.items()
    },
    **{cls: _each(h, logged=False) for cls, h in WORLD_HANDLERS.items()},
    **LOG_RUNS,  # k/v scale warnings (one tally), bar updates (fold_bars.py), client text
}
# The log events a log holds many of, back to back, each type folded a run at a time: what the
# daemon's loop and analyze hand over in one call (a load's warnings and bars, echoed prompts).
BULK_EVENTS: tuple[type, ...] = tuple(LOG_RUNS)


@dataclass(frozen=True)
class LoadState(StateData):
    """The daemon's judgement of the load; see the module doc. Fields: `StateData`."""

    def apply(
        self,
        item: Input,
        now: float,
        *,
        replay: bool = False,
        stamp_offset_s: float = 0.0,
    ) -> LoadState:
        """`apply_run` of one input."""
        return self.apply_run((item,), now, replay=replay, stamp_offset_s=stamp_offset_s)

    def apply_run(
        self,
        items: Iterable[Input],
        now: float,
        *,
        replay: bool = False,
        stamp_offset_s: float = 0.0,
    ) -> LoadState:
        """Fold a run of inputs observed at `now`, in order, in one call; the result's
        `transitions` are every transition of the run. `replay`: the inputs are log events
        re-read after a restart (the log source says so), placed at their own stamps plus
        `stamp_offset_s` (`Fold.at`), and no stall is judged; live, the run arrived at `now`
        and stalls are judged once, after it."""
        f = Fold(self, now, replay, stamp_offset_s)
        seq = items if isinstance(items, (list, tuple)) else list(items)
        handlers = RUN_HANDLERS
        i, n = 0, len(seq)
        while i < n:  # the inputs of one type back to back: one call of that type's handler
            cls = type(seq[i])
            j = i + 1
            while j < n and type(seq[j]) is cls:
                j += 1
            if cls is Tick:
                f.ticked = True
            handler = handlers.get(cls)
            if handler is None:
                raise TypeError(f"LoadState.apply: unsupported input {cls.__name__}")
            handler(f, seq[i:j] if j - i < n else seq)
            if issubclass(cls, Event):  # (the log's events, counted by type)
                f.count("events", cls.type, j - i)
            i = j
        if replay and f.sess is not None and n:
            # what was read now, however old its stamps: silence is counted from here
            f.upd(backlog_read_at=now)
        settle_due(f)  # a failure held for its echoes, on the daemon's clock
        if not replay:
            f.check_stall()
            if f.ticked:
                check_silent_rank(f)
        new: LoadState = f.finish(n)
        return new

    def settle(self, now: float) -> LoadState:
        """The input ended (`loadwatch analyze` at the end of a log, or before it keeps a
        session that the next one replaces): a failure held for its echoes is decided now."""
        s = self.session
        if s is None or s.failing is None:
            return self
        f = Fold(self, now)
        settle_failure(f)
        new: LoadState = f.finish(0)
        return new

    def snapshot(self, now: float) -> Snapshot:
        """An immutable view at `now` (ETA and stall ages are computed for that time)."""
        return build_snapshot(self, now)


def run(
    items: Iterable[tuple[float, Input]],
    state: LoadState | None = None,
    *,
    replay: bool = False,
    stamp_offset_s: float = 0.0,
) -> tuple[LoadState, list[Transition]]:
    """Fold `(now, input)` pairs in order; the final state and every transition on the way."""
    st = state if state is not None else LoadState()
    out: list[Transition] = []
    for now, item in items:
        st = st.apply(item, now, replay=replay, stamp_offset_s=stamp_offset_s)
        out.extend(st.transitions)
    return st, out


__all__ = [
    "BULK_EVENTS",
    "BarTrack",
    "FailureTally",
    "GpuTrack",
    "HealthProbe",
    "Input",
    "IoTrack",
    "LoadState",
    "MilestoneSeen",
    "Phase",
    "PhaseSpan",
    "Session",
    "Snapshot",
    "Stall",
    "StateConfig",
    "Tick",
    "Transition",
    "WarningTally",
    "run",
]
