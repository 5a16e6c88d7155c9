"""Logs written by real vLLM 0.32.0 (CPU build, a 4-shard random Llama made by tiny_model.py),
through the real parser into the fold, as the daemon would follow them live."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from loadwatch.daemon.sources.inputs import HealthProbe, ProcessEvent
from loadwatch.daemon.state.loadstate import Input, LoadState, run
from loadwatch.parsers import EventStream, split_records

from .helpers import model

FIXTURES = Path(__file__).parent / "fixtures"
# The shard files vLLM loaded in these runs, in its load order.
SIZES = [101193112, 100679152, 98577384, 99102464]
ARGV = (
    "python",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/tmp/scratch/tiny",
    "--enforce-eager",
    "--max-model-len",
    "512",
)


def _follow(name: str, exit_code: int | None, health_ok_after_api: bool = False) -> LoadState:
    ref = datetime(2026, 12, 1).timestamp()
    events = EventStream(ref_ts=ref).feed_all(split_records((FIXTURES / name).read_bytes()))
    first = next(e.ts for e in events if e.ts is not None)
    items: list[tuple[float, Input]] = [
        (first - 1, ProcessEvent(kind="started", ts=first - 1, pid=30131, argv=ARGV)),
        (first - 1, model(SIZES)),
    ]
    now = first
    for ev in events:
        now = max(now, (ev.ts or now) + 0.1)  # seen a moment after it was written
        items.append((now, ev))
    if health_ok_after_api:
        items.append((now + 1, HealthProbe(ok=True, ts=now + 1, status=200)))
    if exit_code is not None:
        items.append(
            (now + 2, ProcessEvent(kind="exited", ts=now + 2, pid=30131, exit_code=exit_code))
        )
    state, _ = run(items)
    return state


def test_ready() -> None:
    st = _follow("vllm-0.32-cpu-ready.log", None)
    snap = st.snapshot(st.session.last_event_at if st.session else 0)
    s = snap.session
    # the capture ends with a SIGTERM: vLLM logs its shutdown, so the session ends stopped
    assert s is not None and snap.phase == "stopped" and s.failure_kind is None
    assert s.version == "0.32.0"
    assert s.time_to_ready_s is not None and 60 < s.time_to_ready_s < 120
    (b,) = s.bars
    assert (b.kind, b.done, b.total) == ("weights", 4, 4)
    assert s.progress.bytes_done == sum(SIZES) and s.progress.ratio == 1.0
    assert s.weights_load_s == pytest.approx(0.41)
    ms = {m.key: m for m in s.milestones}
    assert ms["checkpoint_info"].gib == pytest.approx(0.37)
    assert ms["kv_cache.size"].tokens == 32768
    assert ms["engine_init"].seconds == pytest.approx(1.84)
    assert [h.phase for h in s.history] == [
        "starting",
        "loading_weights",
        "post_load",
        "ready",
        "stopped",
    ]
    assert s.failures == () and all(w.verdict == "unrated" for w in s.warnings)
    assert snap.kv_cache.quantized is False  # auto on 0.32, checkpoint declares nothing


def test_kv_cache_too_small() -> None:
    st = _follow("vllm-0.32-cpu-kv-too-small.log", 1)
    snap = st.snapshot(st.session.last_event_at if st.session else 0)
    s = snap.session
    assert s is not None and snap.phase == "failed"
    assert s.failure_kind == "kv_cache_too_small"
    assert s.exit_code == 1
    # one root cause; "EngineCore failed to start", "Engine core initialization failed" and the
    # dead worker are its echoes
    (root,) = s.failures
    assert root.kind == "kv_cache_too_small" and root.echoes >= 2
    messages = [e.message for e in root.evidence]
    assert "EngineCore failed to start." in messages
    assert any(m.startswith("Engine core initialization failed") for m in messages)
    assert root.offset == root.evidence[0].offset  # the anchor is the root's own record
    assert s.progress.shards_done == 4  # the weights were in before the KV cache failed


def test_checkpoint_with_an_unexpected_tensor() -> None:
    st = _follow("vllm-0.32-cpu-unknown-tensor.log", 1)
    snap = st.snapshot(st.session.last_event_at if st.session else 0)
    s = snap.session
    assert s is not None and snap.phase == "failed"
    # The root cause is a ValueError the catalog classes as "other": the kind is the root
    # message's, and the engine_init_failed wrappers are its echoes.
    assert s.failure_kind == "other"
    assert any("no module or parameter named" in f.message for f in s.failures)
    assert s.progress.shards_done == 0 and s.progress.shards_total == 4
