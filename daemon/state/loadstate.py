"""The load state: a pure fold over everything the daemon observes.

    state = LoadState()                      # or LoadState(config=StateConfig(...))
    state = state.apply(item, now)           # item: parser Event, GpuReading, ProcessEvent,
    for t in state.transitions: log(t)       #   IoSample, ModelInfo, HealthProbe or Tick
    snap = state.snapshot(now)               # immutable view for exporters; snap.to_dict()

`apply` never mutates: it returns a new `LoadState` that shares every part it did not change
(copy on apply), and whose `transitions` are the ones this call produced. There is no I/O and no
clock here: `now` is the observation time. A log event's own timestamp (second resolution) is
never compared with `now`: vLLM stamps in its own local time, of no known zone. Live, a log event
happens at `now`; replayed (`replay=True`: re-read after a restart, as the log source says), at its
stamp plus `stamp_offset_s`, in order and never after `now`. Stall checks run only on live inputs.

Sessions. Each vLLM start opens a session: the supervisor's `ProcessEvent(kind="started")`, or in
the log a `version` milestone (unless the session is still starting and has none yet), or
`model_load_start` once the session is past loading. The session before is summarised into
`past` (the last `max_sessions`).

Phases: starting -> loading_weights -> post_load -> ready, moving forward only; failed and
stopped end a session; stalled is entered from a live phase and left when progress resumes. A
fatal `Failure` fails the session whatever the exit code (vLLM exits 0 after its engine died); a
failure after the supervisor asked the process to stop is kept but not fatal (a clean SIGTERM
still logs `EngineDeadError`), and once the server was ready a failure of kind "other" (a
request's traceback) is not fatal. Failures that describe one crash are kept as one entry per
(kind, message) with a count; the session's failure kind is the most telling (`KIND_RANK`).

Cost: per input O(1) amortised. Every per-session collection is capped (bars, warning codes,
processes per code, failures, phase history), layer numbers are bits of an int, and the
estimators keep fixed-size windows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loadwatch.daemon.sources.inputs import HealthProbe, Tick
from loadwatch.daemon.state.failures import FailureTally
from loadwatch.daemon.state.fold import FAST, HANDLERS, Fold
from loadwatch.daemon.state.records import evolve
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
from loadwatch.parsers.events import Event


@dataclass(frozen=True)
class LoadState(StateData):
    """The daemon's judgement of the load; see the module doc. Fields: `StateData`."""

    def apply(
        self, item: Input, now: float, *, replay: bool = False, stamp_offset_s: float = 0.0
    ) -> LoadState:
        """Fold one input observed at `now`; the result's `transitions` are this call's.
        `replay`: the input is a log event re-read after a restart, whose effects are out
        already; it happens at its own stamp plus `stamp_offset_s` (see `Fold.at`)."""
        fast = FAST.get(type(item))
        if fast is not None:
            session = fast(self, item, now, replay, stamp_offset_s)
            if session is not None:  # `evolve` inlined: this runs for most log lines of a load
                new = _new(LoadState)
                d = new.__dict__
                d.update(self.__dict__)
                d["session"] = session
                d["transitions"] = ()
                d["inputs_total"] = self.inputs_total + 1
                return new
        return apply_general(self, item, now, replay=replay, stamp_offset_s=stamp_offset_s)

    def apply_run(
        self,
        items: Iterable[Input],
        now: float,
        *,
        replay: bool = False,
        stamp_offset_s: float = 0.0,
    ) -> LoadState:
        """Fold a run of inputs observed at `now`, in order; the result's `transitions` are
        every transition of the run."""
        st = self
        out: list[Transition] = []
        n = 0
        for item in items:
            st = st.apply(item, now, replay=replay, stamp_offset_s=stamp_offset_s)
            n += 1
            if st.transitions:
                out.extend(st.transitions)
        if n == 0:
            return self
        return evolve(st, transitions=tuple(out))

    def snapshot(self, now: float) -> Snapshot:
        """An immutable view at `now` (ETA and stall ages are computed for that time)."""
        return build_snapshot(self, now)


def apply_general(
    state: LoadState, item: Input, now: float, *, replay: bool = False, stamp_offset_s: float = 0.0
) -> LoadState:
    """`LoadState.apply` without its shortcut for common inputs: the reference the shortcut
    must equal (the tests fold logs both ways)."""
    handler = HANDLERS.get(type(item))
    if handler is None:
        raise TypeError(f"LoadState.apply: unsupported input {type(item).__name__}")
    f = Fold(state, now, replay, stamp_offset_s)
    if isinstance(item, Event):
        f.record = item.offset
    handler(f, item)
    if not replay:
        f.check_stall()
    return evolve(state, **f.changes_out())


_new = object.__new__


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
    "apply_general",
    "run",
]
