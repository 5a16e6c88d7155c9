"""Durations learned from earlier starts (daemon/state/learned.py): the ETA to ready of a repeat
start, and the stall test of a step without a bar, on the simulated vLLM's real-shaped logs
(daemon/sim/kimilog.py, whose lines follow a 2026 vLLM build), folded live: every line at the
time the script wrote it, a tick every 5 s between."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

import pytest

from loadwatch.daemon.history import StartHistory
from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.inputs import ModelInfo, PageCache, ShardInfo, Tick
from loadwatch.daemon.state.learned import PastStart, entry_of
from loadwatch.daemon.state.loadstate import Input, LoadState, StateConfig
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.parsers import EventStream, split_records

SHAPE = Shape(model="/models/small", shards=24, workers=2, layers=8, shard_s=(5.0, 11.0))
TICK_S = 5.0


def timed_lines(seed: int, clock: SyntheticClock, **kw: object) -> Iterator[tuple[float, str]]:
    """The script's lines, each with the time it was written."""
    for line in startup(random.Random(seed), clock, SHAPE, **kw):  # type: ignore[arg-type]
        yield clock.t, line


def fold(
    state: LoadState, lines: Iterator[tuple[float, str]], until: float | None = None
) -> tuple[LoadState, list[Transition], list[float]]:
    """Fold the lines live, with ticks; (state, transitions, the time of each line)."""
    stream = EventStream(ref_ts=1_795_000_000.0)
    out: list[Transition] = []
    times: list[float] = []
    now: float | None = None
    offset = 0

    def apply(item: Input, at: float) -> None:
        nonlocal state
        state = state.apply(item, at)
        out.extend(state.transitions)

    for at, line in lines:
        while now is not None and now + TICK_S < at:
            now += TICK_S
            apply(Tick(), now)
        now = at
        data = line.encode()
        for rec in split_records(data, base=offset):
            for ev in stream.feed(rec):
                apply(ev, at)
        offset += len(data)
        times.append(at)
    while until is not None and now is not None and now + TICK_S <= until:
        now += TICK_S
        apply(Tick(), now)
    return state, out, times


def first_start() -> tuple[LoadState, PastStart]:
    clock = SyntheticClock(1_795_000_000.0)
    state, _, _ = fold(LoadState(), timed_lines(1, clock))
    s = state.session
    assert s is not None and s.phase == "ready"
    entry = entry_of(state.model, state.gpus, s)
    assert entry is not None
    return state, entry


def with_history(state: LoadState, *entries: PastStart) -> LoadState:
    return replace(state, config=replace(state.config, history=tuple(entries)))


def test_a_repeat_start_knows_its_time_to_ready_from_its_first_line() -> None:
    state, entry = first_start()
    assert [p for p, _ in entry.steps][:2] == ["config", "weights"]
    assert sum(s for _, s in entry.steps) == pytest.approx(entry.ready_s)
    assert entry.key.version == SHAPE.version
    # the second start, a new seed (other shard times), an hour later
    clock = SyntheticClock(1_795_003_600.0)
    lines = timed_lines(2, clock)
    first_at, first = next(lines)
    second, _, _ = fold(with_history(state, entry), iter([(first_at, first)]))
    view = second.snapshot(first_at).session
    assert view is not None and view.startup_eta is not None, view and view.startup_eta_reason
    eta = view.startup_eta
    assert eta.past_starts == 1 and eta.step == "config"
    done, _, _ = fold(second, lines)
    s = done.session
    assert s is not None and s.ready_at is not None
    took = s.ready_at - first_at
    assert eta.remaining_s == pytest.approx(took, rel=0.15)
    assert eta.remaining_low_s <= eta.remaining_s <= eta.remaining_high_s


def test_the_eta_narrows_as_steps_finish_and_follows_the_weights_bar() -> None:
    state, entry = first_start()
    clock = SyntheticClock(1_795_003_600.0)
    lines = list(timed_lines(2, clock))
    end = lines[-1][0]
    mid_weights = next(at for at, line in lines if "12/24" in line)
    part, _, _ = fold(with_history(state, entry), iter([x for x in lines if x[0] <= mid_weights]))
    view = part.snapshot(mid_weights).session
    assert view is not None and view.startup_eta is not None
    assert view.startup_eta.step == "weights"
    assert "weights bar" in view.startup_eta.basis
    assert view.startup_eta.remaining_s == pytest.approx(end - mid_weights, rel=0.15)


def test_no_history_says_so() -> None:
    clock = SyntheticClock(1_795_000_000.0)
    lines = timed_lines(2, clock)
    at, line = next(lines)
    state, _, _ = fold(LoadState(), iter([(at, line)]))
    doc = state.snapshot(at).to_dict()["session"]
    assert doc["startup_eta"] is None
    assert "no earlier start" in doc["startup_eta_reason"]


def test_a_step_after_the_weights_silent_past_its_learned_time_is_a_stall() -> None:
    state, entry = first_start()
    took = entry.seconds()["torch_compile"]
    clock = SyntheticClock(1_795_003_600.0)
    lines = list(timed_lines(2, clock))
    # held after `Model loading took`: torch.compile never reports
    cut = next(i for i, (_, line) in enumerate(lines) if "Model loading took" in line)
    held_at = lines[cut][0]
    learned = with_history(state, entry)
    _, out, _ = fold(learned, iter(lines[: cut + 1]), until=held_at + 120)
    raised = [t for t in out if t.kind == "stall_raised"]
    assert len(raised) == 1, out
    reason = raised[0].reason or ""
    assert reason.startswith("torch_compile has run 1m0") and "the last start took" in reason
    # the threshold is the learned one (the floor: the last start took 20 s), not the 30 min rule
    assert raised[0].at - held_at == pytest.approx(StateConfig().stall_floor_s, abs=TICK_S + 0.1)
    assert took < 60
    # without a history the quiet rule (30 min) applies: nothing yet
    _, quiet, _ = fold(LoadState(), iter(lines[: cut + 1]), until=held_at + 120)
    assert not [t for t in quiet if t.kind == "stall_raised"]


def test_a_normal_repeat_start_raises_nothing() -> None:
    state, entry = first_start()
    clock = SyntheticClock(1_795_003_600.0)
    done, out, _ = fold(with_history(state, entry), timed_lines(3, clock))
    assert done.session is not None and done.session.phase == "ready"
    assert not [t for t in out if t.kind == "stall_raised"]


def test_the_history_file_round_trips_what_a_start_learned(tmp_path: object) -> None:
    from pathlib import Path

    _, entry = first_start()
    problems: list[str] = []
    h = StartHistory(Path(str(tmp_path)), problems.append)
    h.save((entry,))
    assert h.load() == (entry,) and problems == []


def test_a_start_of_another_layout_does_not_compare() -> None:
    state, entry = first_start()
    assert entry.key.layout == "tp2 pp1 dp1"  # from the arguments vLLM logged
    other = replace(entry, key=replace(entry.key, layout="tp8 pp1 dp1"))
    lines = list(timed_lines(2, SyntheticClock(1_795_003_600.0)))
    # the first line (the version) says no layout: both compare; the arguments (next) do
    one, _, _ = fold(with_history(state, other), iter(lines[:1]))
    assert one.snapshot(lines[0][0]).session.startup_eta is not None  # type: ignore[union-attr]
    two, _, _ = fold(with_history(state, other), iter(lines[:2]))
    view = two.snapshot(lines[1][0]).session
    assert view is not None and view.startup_eta is None
    assert view.startup_eta_reason is not None and "no earlier start" in view.startup_eta_reason


def _looked_at(state: LoadState, at: float, cache: str) -> LoadState:
    """The daemon's look at the model's page cache (aftercare.py), folded at `at`."""
    state = state.apply(ModelInfo(path=SHAPE.model, shards=(ShardInfo("a.safetensors", 1),)), at)
    assert state.session is not None
    looked = PageCache(at, state.session.id, SHAPE.model, cache, 1.0 if cache == "warm" else 0.0)
    return state.apply(looked, at)


def test_a_warm_start_compares_only_with_warm_ones() -> None:
    state, entry = first_start()
    assert entry.key.cache is None  # (nothing looked at the page cache of that start)
    cold = replace(entry, key=replace(entry.key, cache="cold"))
    quarter = tuple((phase, took / 4) for phase, took in entry.steps)  # a warm start: faster
    warm = replace(
        entry, key=replace(entry.key, cache="warm"), steps=quarter, ready_s=entry.ready_s / 4
    )
    lines = list(timed_lines(2, SyntheticClock(1_795_003_600.0)))
    at = lines[0][0]
    begun, _, _ = fold(with_history(state, cold, warm), iter(lines[:1]))
    # not looked at yet: every start compares
    eta = begun.snapshot(at).session.startup_eta  # type: ignore[union-attr]
    assert eta is not None and eta.past_starts == 2
    looked = _looked_at(begun, at, "warm")
    s = looked.session
    assert s is not None and s.page_cache == "warm"
    entry_now = entry_of(looked.model, looked.gpus, s)
    assert entry_now is None  # (not ready: nothing to learn yet)
    eta = looked.snapshot(at).session.startup_eta  # type: ignore[union-attr]
    assert eta is not None and eta.past_starts == 1  # the warm one only
    assert eta.basis == "the median of 1 earlier start on a warm page cache"
    assert eta.remaining_s == pytest.approx(warm.ready_s, rel=0.05)
    only_cold, _, _ = fold(with_history(state, cold), iter(lines[:1]))
    view = _looked_at(only_cold, at, "warm").snapshot(at).session
    assert view is not None and view.startup_eta is None
    assert "no earlier start" in (view.startup_eta_reason or "")


def test_the_page_cache_is_kept_once_for_its_own_start_and_model() -> None:
    state, _ = first_start()
    lines = list(timed_lines(2, SyntheticClock(1_795_003_600.0)))
    begun, _, _ = fold(state, iter(lines[:1]))
    at = lines[0][0]
    s = begun.session
    assert s is not None and s.page_cache is None
    known = begun.apply(ModelInfo(path=SHAPE.model, shards=(ShardInfo("a.safetensors", 1),)), at)
    other = known.apply(PageCache(at, s.id, "/models/other", "cold", 0.0), at)  # another model's
    assert other.session is not None and other.session.page_cache is None
    earlier = known.apply(PageCache(at, s.id - 1, SHAPE.model, "cold", 0.0), at)  # another start's
    assert earlier.session is not None and earlier.session.page_cache is None
    looked = _looked_at(begun, at, "cold")
    assert looked.session is not None and looked.session.page_cache == "cold"
    again = looked.apply(PageCache(at, s.id, SHAPE.model, "warm", 1.0), at)  # kept once
    assert again.session is not None and again.session.page_cache == "cold"


def test_the_page_cache_key_round_trips_and_a_bad_one_is_refused(tmp_path: object) -> None:
    from pathlib import Path

    from loadwatch.daemon.history import BadHistory, from_json, to_json

    _, entry = first_start()
    warm = replace(entry, key=replace(entry.key, cache="warm"))
    assert from_json(to_json((warm,))) == (warm,)
    bad = to_json((warm,)).replace(b'"warm"', b'"tepid"')
    with pytest.raises(BadHistory, match="cache"):
        from_json(bad)
    h = StartHistory(Path(str(tmp_path)), [].append)
    h.save((warm,))
    assert h.load() == (warm,)
