"""The start-up timeline on /metrics and /status, from real vLLM 0.32 CPU logs: two starts read
one after the other (tests/fixtures/real-v0.32-llama.log, which got ready, then
real-v0.32-kv-too-small.log, which failed sizing its KV cache), as the daemon folds them live."""

from __future__ import annotations

from datetime import datetime

import pytest

from loadwatch.daemon.state.loadstate import Input, LoadState, run
from loadwatch.exporters.prometheus import LoadwatchCollector, registry_for, render
from loadwatch.parsers import EventStream, split_records
from tests.conftest import FIXTURES
from tests.exporters.test_prometheus_collector import published
from tests.ops.common import promtool_says

PHASE = "loadwatch_startup_phase"
SECONDS = "loadwatch_startup_phase_seconds"


def follow(*names: str) -> tuple[LoadState, float]:
    """The logs as the daemon follows them live: every event at the daemon's clock, a moment
    after it was written."""
    ref = datetime(2026, 12, 1).timestamp()
    items: list[tuple[float, Input]] = []
    now = 0.0
    for name in names:
        events = EventStream(ref_ts=ref).feed_all(split_records((FIXTURES / name).read_bytes()))
        for ev in events:
            now = max(now, (ev.ts or now) + 0.1)
            items.append((now, ev))
    state, _ = run(items, LoadState())
    return state, now


def exposition(state: LoadState, now: float) -> str:
    pub = published(state, now)
    return render(registry_for(LoadwatchCollector(lambda: pub, lambda: now))).decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            pairs = tuple(
                (k, v.strip('"')) for k, v in (p.split("=", 1) for p in labels.split(","))
            )
            out[pairs] = float(value)
    return out


def test_phase_seconds_of_this_start_and_the_last_that_got_ready() -> None:
    state, now = follow("real-v0.32-llama.log", "real-v0.32-kv-too-small.log")
    past = state.snapshot(now).sessions[-1]
    assert past.time_to_ready_s is not None
    got = samples(exposition(state, now), SECONDS)
    last = {dict(k)["phase"]: v for k, v in got.items() if dict(k)["start"] == "last"}
    current = {dict(k)["phase"]: v for k, v in got.items() if dict(k)["start"] == "current"}
    assert list(last) == ["config", "weights", "kv_cache", "engine_ready", "api_server"]
    assert sum(last.values()) == pytest.approx(past.time_to_ready_s)  # they add up to ready
    assert last["config"] == pytest.approx(43.0)  # 06:37:28 to `Starting to load model` 06:38:11
    assert list(current) == ["config", "weights", "kv_cache"]  # it failed sizing the KV cache
    assert "graph_capture" not in current  # a phase the start did not show: no sample


def test_the_step_under_way_then_none_once_over() -> None:
    state, now = follow("real-v0.32-llama.log")
    # mid-load: replay only up to `Starting to load model`
    items = EventStream(ref_ts=datetime(2026, 12, 1).timestamp()).feed_all(
        split_records((FIXTURES / "real-v0.32-llama.log").read_bytes())
    )
    cut = next(i for i, e in enumerate(items) if getattr(e, "kind", None) == "model_load_start")
    partial, _ = run([((e.ts or 0.0) + 0.1, e) for e in items[: cut + 1] if e.ts is not None])
    at = partial.session.last_event_at + 5  # type: ignore[union-attr]
    under_way = samples(exposition(partial, at), PHASE)
    assert {dict(k)["phase"]: v for k, v in under_way.items() if v == 1} == {"weights": 1.0}
    assert len(under_way) == 11  # every phase and `unknown`, from 0
    seconds = samples(exposition(partial, at), SECONDS)
    assert seconds[(("phase", "weights"), ("start", "current"))] == pytest.approx(5.0)
    over = samples(exposition(state, now), PHASE)
    assert set(over.values()) == {0.0}  # ready: no step under way


def test_status_lists_the_timeline() -> None:
    state, now = follow("real-v0.32-llama.log", "real-v0.32-kv-too-small.log")
    doc = state.snapshot(now).to_dict()
    steps = doc["session"]["timeline"]
    assert [(s["phase"], s["ended_at"] is not None) for s in steps] == [
        ("config", True),
        ("weights", True),
        ("kv_cache", True),
    ]
    assert all(set(s) >= {"phase", "started_at", "ended_at", "duration_s"} for s in steps)
    assert [s["phase"] for s in doc["sessions"][-1]["timeline"]][-1] == "api_server"


def test_promtool_has_nothing_to_say() -> None:
    state, now = follow("real-v0.32-llama.log", "real-v0.32-kv-too-small.log")
    text = exposition(state, now)
    assert SECONDS + "{" in text and PHASE + "{" in text
    assert promtool_says(text) == ""
