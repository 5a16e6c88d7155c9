"""A run of inputs folded in one call (`LoadState.apply_run`): the inputs of one type back to
back go to that type's handler together, then the checks made once a run.

Per input type, the handler of a run of that type: the log's bulk events have their own (one
tally for a load's run of k/v warnings, a bar's burst of updates: fold_log.py, fold_bars.py;
client text), and so do ticks (`_on_ticks`); every other type is folded one input at a time
(`_each`). Stalls are judged once, after the run, when it is live; a rank silent while its
peers moved on when the run holds a `Tick` (ranks.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from loadwatch.daemon.sources.inputs import Tick
from loadwatch.daemon.state.fold import Fold, settle_due
from loadwatch.daemon.state.fold_failure import on_failure
from loadwatch.daemon.state.fold_log import LOG_HANDLERS, LOG_RUNS
from loadwatch.daemon.state.fold_world import WORLD_HANDLERS
from loadwatch.daemon.state.nodefold import NODE_EVENTS, track_node, track_tick
from loadwatch.daemon.state.ranks import check_silent_rank
from loadwatch.daemon.state.session import StateData
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


def _on_ticks(f: Fold, ticks: Sequence[Tick]) -> None:
    """Time passed with no other input: the run's checks include the silent rank's (ranks.py).
    (The node is looked at once: a tick after the first finds it as the first left it.)"""
    f.ticked = True
    f.record = None
    track_tick(f, ticks[0])


# Per input type, the handler of a run of inputs of that type back to back.
RUN_HANDLERS: Final[dict[type, RunHandler]] = {
    **{
        cls: _each(h, logged=True)
        for cls, h in {**LOG_HANDLERS, Failure: on_failure, **NODE_EVENTS}.items()
    },
    **{cls: _each(h, logged=False) for cls, h in WORLD_HANDLERS.items()},
    **LOG_RUNS,  # k/v scale warnings (one tally), bar updates (fold_bars.py), client text
    Tick: _on_ticks,
}
# The log events a log holds many of, back to back, each type folded a run at a time: what the
# daemon's loop and analyze hand over in one call (a load's warnings and bars, echoed prompts).
BULK_EVENTS: Final[tuple[type, ...]] = tuple(LOG_RUNS)


def fold_run(
    state: StateData, items: Iterable[Any], now: float, replay: bool, stamp_offset_s: float
) -> Any:
    """`LoadState.apply_run`: the new state (of `state`'s type)."""
    return fold_runs(state, ((now, items),), replay, stamp_offset_s)


def fold_runs(
    state: StateData,
    runs: Iterable[tuple[float, Iterable[Any]]],
    replay: bool,
    stamp_offset_s: float,
) -> Any:
    """`LoadState.apply_runs`: each run folded at its own `now` as `fold_run` folds it, the
    checks of a run made after each, in one `Fold` (what the runs change is copied once)."""
    f: Fold | None = None
    total = 0
    for now, items in runs:
        if f is None:
            f = Fold(state, now, replay, stamp_offset_s)
        else:
            f.now = now
            f.ticked = False
            f.watch = None
        total += _fold_into(f, items if isinstance(items, (list, tuple)) else list(items))
    if f is None:
        f = Fold(state, 0.0, replay, stamp_offset_s)
    return f.finish(total)


def _fold_into(f: Fold, seq: Sequence[Any]) -> int:
    """One run into `f`, at `f.now`: its inputs, then the checks made once a run."""
    handlers = RUN_HANDLERS
    i, n = 0, len(seq)
    while i < n:  # the inputs of one type back to back: one call of that type's handler
        cls = type(seq[i])
        j = i + 1
        while j < n and type(seq[j]) is cls:
            j += 1
        handler = handlers.get(cls)
        if handler is None:
            raise TypeError(f"LoadState.apply: unsupported input {cls.__name__}")
        handler(f, seq[i:j] if j - i < n else seq)
        if issubclass(cls, Event):  # (the log's events, counted by type)
            f.count("events", cls.type, j - i)
        i = j
    if f.replay and f.sess is not None and n:
        # what was read now, however old its stamps: silence is counted from here
        f.upd(backlog_read_at=f.now)
    settle_due(f)  # a failure held for its echoes, on the daemon's clock
    if not f.replay:
        f.check_stall()
        if f.ticked:
            check_silent_rank(f)
    return n


def bulk_parts(events: Sequence[Event]) -> list[list[Event]]:
    """A run's events as the parts folded in one call each: the bulk events back to back
    together, every other one (a milestone, a failure: rare, and one may name the model whose
    shard sizes the next bar needs) a part of its own."""
    parts: list[list[Event]] = []
    bulk: list[Event] | None = None
    for ev in events:
        if isinstance(ev, BULK_EVENTS):
            if bulk is None:
                bulk = []
                parts.append(bulk)
            bulk.append(ev)
        else:
            bulk = None
            parts.append([ev])
    return parts
