"""The log shapes the benchmarks generate (daemon/sim/kimilog.py), through the one parse and the
one fold: the 8 workers' k/v warnings interleaved, the weights bar with its process prefix in
the same record or after a lone prefix record, and vLLM 0.32's logged requests with prompts and
outputs echoed (some of them quoting vLLM's own lines). Every count is the generator's."""

from __future__ import annotations

import random

import pytest

from loadwatch.daemon.sim.kimilog import (
    Counts,
    Shape,
    SyntheticClock,
    logged_requests,
    startup,
)
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.parsers import ChunkScanner, EventStream, KvScaleWarning, ShardProgress

REF_TS = 1.8e9


def _fold(data: bytes) -> tuple[list[object], LoadState]:
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS))
    events: list[object] = []
    state = LoadState()
    pos = 0
    while pos < len(data):  # whole records per chunk, as the follower hands them over
        cut = data.rfind(b"\n", pos, pos + (1 << 16)) + 1 or len(data)
        got = scanner.feed(data[pos:cut], pos)
        events += got
        state = state.apply_run(got, REF_TS, replay=True)
        pos = cut
    return events, state


@pytest.mark.parametrize(
    ("warnings", "bar"),
    [("blocks", "lone_prefix"), ("interleaved", "same_record"), ("interleaved", "lone_prefix")],
)
def test_load_shapes_count_as_the_generator_wrote(warnings: str, bar: str) -> None:
    counts = Counts()
    rng = random.Random(2)
    clock = SyntheticClock()
    shape = Shape(shards=30, workers=8, layers=20, warnings=warnings, bar=bar)  # type: ignore[arg-type]
    data = "".join(line for _ in range(3) for line in startup(rng, clock, shape, counts)).encode()
    events, state = _fold(data)
    kv = [e for e in events if type(e) is KvScaleWarning]
    bars = [e for e in events if type(e) is ShardProgress and e.bar == "weights"]
    assert len(kv) == counts.kv_scale_warnings == 3 * 8 * 2 * 20
    assert len(bars) == counts.weight_updates
    assert {(e.process, e.done) for e in bars if e.done == 30} == {("Worker_TP0", 30)}
    assert all(e.process == "Worker_TP0" for e in bars)  # each bar update knows its process
    assert state.sessions_total == counts.sessions == 3
    s = state.session
    assert s is not None and s.warnings["kv_scale_missing"].count == 8 * 2 * 20
    assert s.warnings["kv_scale_missing"].processes == {f"Worker_TP{i}" for i in range(8)}
    assert state.lifetime.warnings["kv_scale_missing"] == 2 * 8 * 2 * 20


def test_logged_requests_with_echoes_count_for_nothing_but_client_text() -> None:
    counts = Counts()
    rng = random.Random(3)
    clock = SyntheticClock()
    shape = Shape(shards=12, workers=2, layers=4)
    lines = [*startup(rng, clock, shape, counts), *logged_requests(rng, clock, 20_000)]
    data = "".join(lines).encode()
    assert data.count(b"Found k_scale in the checkpoint") > counts.kv_scale_warnings // 2
    events, state = _fold(data)
    assert sum(type(e) is KvScaleWarning for e in events) == counts.kv_scale_warnings
    assert sum(type(e) is ShardProgress for e in events) == counts.weight_updates
    s = state.session
    assert s is not None and s.phase == "ready" and not s.failures
    assert sum(state.client_text.values()) > 0  # the echoes that quote vLLM's lines: counted
