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

from collections.abc import Iterable
from dataclasses import dataclass

from loadwatch.daemon.sources.inputs import HealthProbe, Tick
from loadwatch.daemon.state.failures import FailureTally
from loadwatch.daemon.state.fold import Fold, settle_failure
from loadwatch.daemon.state.runfold import BULK_EVENTS, fold_run, fold_runs
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
        new: LoadState = fold_run(self, items, now, replay, stamp_offset_s)
        return new

    def apply_runs(
        self,
        runs: Iterable[tuple[float, Iterable[Input]]],
        *,
        replay: bool = False,
        stamp_offset_s: float = 0.0,
    ) -> LoadState:
        """`apply_run` of each `(now, items)` in order, in one call: the state and the
        transitions (every run's, in order) that those calls one after another give, each run's
        checks made at its own `now`. What the runs change is copied once, not once a run:
        `loadwatch analyze` folds a load's events a second of the log at a time this way."""
        new: LoadState = fold_runs(self, runs, replay, stamp_offset_s)
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
