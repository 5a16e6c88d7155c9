"""analyze's fold: each event folded into `LoadState` at the log's own time, every session kept
whole (analyze.py tells how). Compiled, as the daemon's record path is: a log's every event
passes through `SessionFolder.add`, handed over a chunk's events at a time (`add_all`)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Final

from loadwatch.daemon.sources.inputs import ModelInfo, Tick
from loadwatch.daemon.state.loadstate import BULK_EVENTS, LoadState, StateConfig
from loadwatch.daemon.state.session import FAILURE_HOLD_S
from loadwatch.daemon.state.snapshot import Snapshot
from loadwatch.exporters.report import SessionCapture
from loadwatch.parsers import Event, Failure

MAX_SESSIONS_KEPT: Final = 100
# Untimed events before the first timed one wait for its time (a log that starts with a bar);
# past this many they take the file's mtime instead.
MAX_UNTIMED_HELD: Final = 10_000
MAX_FAILURE_OFFSETS: Final = 256  # per session; the state keeps 32 distinct failures anyway
# the load's events held back before they are folded (memory stays bounded)
MAX_RUN_INPUTS: Final = 4096
# the daemon's tick, once a second of the log's time (no fields: one serves all)
TICK: Final = Tick()


class SessionFolder:
    """Folds events into `LoadState` at the log's own times and keeps every session whole."""

    def __init__(self, fallback_ts: float, model: ModelInfo | None = None) -> None:
        # The daemon's hold for a crash's echoes, on the log's own time here.
        self.state = LoadState(config=StateConfig(failure_hold_s=FAILURE_HOLD_S))
        self.fallback_ts = fallback_ts
        self.now: float | None = None
        self.kept: deque[SessionCapture] = deque(maxlen=MAX_SESSIONS_KEPT)
        self.omitted = 0
        self._held: list[Event] = []
        self._start_offset: int | None = None
        self._failures: dict[tuple[str, str], int] = {}
        self._bulk: list[Event | Tick] = []  # a load's events at `self._bulk_at`, not folded yet
        self._bulk_at = 0.0
        # the load's events of the seconds before, each second a run, folded in one call (while
        # runs are held, `self.state` lags them; it has a session all the same: once, always)
        self._runs: list[tuple[float, list[Event | Tick]]] = []
        self._runs_inputs = 0
        self._tick_at = -math.inf
        self._in_session = False  # the state has a session (once it has, it always has)
        if model is not None:
            self.state = self.state.apply(model, fallback_ts)

    def add_all(self, events: Sequence[Event]) -> None:
        for ev in events:
            self.add(ev)

    def add(self, ev: Event) -> None:
        ts = ev.ts  # (read once: every event of a log comes here)
        if self.now is None:
            if ts is None and len(self._held) < MAX_UNTIMED_HELD:
                self._held.append(ev)
                return
            self._release(ts if ts is not None else self.fallback_ts)
        if not self._in_session:
            self._in_session = self.state.session is not None
        prev = self.now
        at = ts if ts is not None else prev
        if (
            at is not None
            and prev is not None
            and at > prev
            and prev - self._tick_at >= 1.0
            and self._in_session
        ):
            # the daemon's tick, once a second of the log's time, when the second before is
            # over: a rank silent while its peers moved on is judged on ticks (state/ranks.py).
            # The load's events held back are at `prev` too: they and the tick are one run.
            if self._bulk_at != prev:
                self._close_bulk()
            self._tick_at = prev
            self._bulk.append(TICK)
            self._bulk_at = prev
            self._close_bulk()
        if isinstance(ev, BULK_EVENTS) and self._in_session:
            t = at if at is not None else self.fallback_ts  # (as `_apply` takes it)
            if self._bulk and t != self._bulk_at:
                self._close_bulk()
            self._bulk.append(ev)
            self._bulk_at = t
            if ts is not None:
                self.now = ts
            return
        self._fold_held_runs()
        self._apply(ev, at)

    def _close_bulk(self) -> None:
        """The load's events held back at their one time are a run, folded with the others."""
        if self._bulk:
            self._runs.append((self._bulk_at, self._bulk))
            self._runs_inputs += len(self._bulk)
            self._bulk = []
            if self._runs_inputs >= MAX_RUN_INPUTS:
                self._fold_held_runs()

    def _fold_held_runs(self) -> None:
        """The runs held back, each at its own time, in one call (no session starts)."""
        self._close_bulk()
        if self._runs:
            self.state = self.state.apply_runs(self._runs)
            self._runs = []
            self._runs_inputs = 0

    def _release(self, at: float) -> None:
        """The events that came before the first time: folded at that time, in order."""
        self.now = at
        held, self._held = self._held, []
        for h in held:
            self._apply(h, at)

    def _apply(self, ev: Event, at: float | None) -> None:
        t = at if at is not None else self.fallback_ts
        if ev.ts is not None:
            self.now = ev.ts
        prev = self.state
        nxt = prev.apply(ev, t)
        if any(tr.kind == "session_started" for tr in nxt.transitions):
            if prev.session is not None:
                self._capture(prev)
            self._start_offset = ev.offset
            self._failures = {}
        if isinstance(ev, Failure) and len(self._failures) < MAX_FAILURE_OFFSETS:
            self._failures.setdefault((ev.kind, ev.message[:300]), ev.offset)
        self.state = nxt

    def _capture(self, st: LoadState) -> None:
        s = st.session
        assert s is not None
        at = max(s.last_event_at, s.phase_entered_at)
        st = st.settle(at)  # the session ends here: a failure held for its echoes is decided
        s = st.session
        assert s is not None
        at = max(s.last_event_at, s.phase_entered_at)
        if len(self.kept) == self.kept.maxlen:
            self.omitted += 1
        self.kept.append(SessionCapture(st.snapshot(at), self._start_offset, self._failures))

    def finish(self) -> None:
        self._fold_held_runs()
        if self.now is None:  # no event had a time of its own
            self._release(self.fallback_ts)
        if self.state.session is not None:
            self._capture(self.state)

    def final_snapshot(self) -> Snapshot:
        """The state at the end, for the log-wide parts (model, KV cache) with no session."""
        return self.state.snapshot(self.now if self.now is not None else self.fallback_ts)
