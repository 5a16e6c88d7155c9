"""The weights ETA with vLLM's 2026 loader lines (../shared/vllm-log-formats.md section 9): the
log's checkpoint size as the bytes total (PR #39422), InstantTensor's bar in bytes (PR #46868),
the EP weight filter (PR #37136) named in the ETA's inputs, uvicorn's startup lines."""

from __future__ import annotations

import json

import pytest

from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import EpWeightFilter, ShardProgress
from tests.state.helpers import DESC, GIB, T0, bar, fold, model, ms, started

CKPT_GIB = 432.90  # `Checkpoint size: 432.90 GiB` (PR #39422, as section 9 quotes it)


def test_the_logs_checkpoint_size_weighs_the_eta_when_no_model_directory_is_known() -> None:
    t = T0
    items = [
        (t, started(t)),
        (t, ms("checkpoint_info", gib=CKPT_GIB, value="AUTOFS")),
        (t + 1, bar(0, 4)),
        (t + 11, bar(1, 4)),
        (t + 21, bar(2, 4)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 21).session
    assert s is not None
    total = round(CKPT_GIB * GIB)
    assert s.progress.bytes_total == total
    assert s.progress.bytes_done == round(total * 2 / 4)
    eta = s.progress.eta
    assert eta is not None and eta.units == "bytes"
    assert eta.remaining_s == pytest.approx(20.0, rel=0.25)
    assert any("divided evenly over 4 files" in i for i in eta.inputs), eta.inputs
    (b,) = s.bars
    assert (b.unit, b.sizes_from) == ("items", "checkpoint_size")


def test_a_model_directory_known_before_the_bar_wins_over_the_logs_checkpoint_size() -> None:
    t = T0
    items = [
        (t, started(t)),
        (t, model([8 * GIB, GIB, GIB, GIB])),
        (t, ms("checkpoint_info", gib=CKPT_GIB)),
        (t + 1, bar(0, 4)),
        (t + 9, bar(1, 4)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 9).session
    assert s is not None and s.progress.bytes_total == 11 * GIB
    assert s.bars[0].sizes_from == "model_dir"


def _real_bar_events() -> list[ShardProgress]:
    """InstantTensor's two bar lines as section 9 quotes them (PR #46868)."""
    data = (
        b"Loading safetensors using InstantTensor loader:   0% Completed | 0.00/155G [00:00<?, ?B/s]\n"
        b"Loading safetensors using InstantTensor loader:   9% Completed | 13.3G/155G "
        b"[00:01<00:10, 14.3GB/s]\n"
    )
    evs = EventStream(ref_ts=T0).feed_all(split_records(data))
    assert all(isinstance(e, ShardProgress) for e in evs)
    return evs  # type: ignore[return-value]


def test_instanttensor_bytes_bar_gives_progress_and_eta_in_bytes_not_shards() -> None:
    first, second = _real_bar_events()
    t = T0
    items = [
        (t, started(t)),
        (t, ms("checkpoint_info", gib=144.4)),  # a bytes bar is not divided again
        (t + 1, first),
        (t + 2, second),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 2).session
    assert s is not None
    assert (s.progress.bytes_done, s.progress.bytes_total) == (13_300_000_000, 155 * 10**9)
    assert s.progress.ratio == pytest.approx(13.3 / 155, rel=0.01)
    eta = s.progress.eta
    assert eta is not None and eta.units == "bytes"
    # 13.3 GB in 1 s: the 141.7 GB left take about 10.7 s, as tqdm says (00:10)
    assert eta.remaining_s == pytest.approx(141.7 / 13.3, rel=0.2)
    assert eta.inputs == ("Loading safetensors using InstantTensor loader: the bar counts bytes",)
    (b,) = s.bars
    assert (b.unit, b.sizes_from, b.total) == ("bytes", None, 155 * 10**9)
    d = st.snapshot(t + 2).to_dict()
    assert d["session"]["bars"][0]["unit"] == "bytes"
    json.dumps(d)


def test_the_ep_weight_filter_is_shown_and_named_in_the_etas_inputs() -> None:
    t = T0
    ep = EpWeightFilter(ep_size=8, ep_rank=0, experts_loaded=32, experts_total=256)
    items = [
        (t, started(t)),
        (t, ep),
        (t + 1, bar(0, 4)),
        (t + 5, bar(1, 4)),
        (t + 9, bar(2, 4)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(t + 9)
    s = snap.session
    assert s is not None and s.ep_weight_filter is not None
    assert (s.ep_weight_filter.ep_size, s.ep_weight_filter.experts_loaded) == (8, 32)
    assert s.ep_weight_filter.experts_total == 256
    assert s.phase == "loading_weights"
    eta = s.progress.eta
    assert eta is not None
    assert eta.inputs[0] == f"{DESC}: the bar counts items, each weighed the same"
    assert eta.inputs[1].startswith("EP weight filter on (ep_size=8, ep_rank=0, loading 32/256")
    d = snap.to_dict()["session"]
    assert d["ep_weight_filter"]["experts_loaded"] == 32


def test_uvicorn_startup_lines_are_milestones_and_complete_is_ready() -> None:
    t = T0
    items = [
        (t, started(t)),
        (t + 1, ms("engine_init", seconds=10.0)),
        (t + 2, ms("api_server_start", detail="server_process", value="21820")),
        (t + 2, ms("api_server_start", detail="waiting_startup")),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 2).session
    assert s is not None and s.phase == "post_load" and s.ready_at is None
    keys = {m.key for m in s.milestones}
    assert {"api_server_start.server_process", "api_server_start.waiting_startup"} <= keys
    st, _ = fold([(t + 3, ms("app_startup_complete"))], st)
    s = st.snapshot(t + 3).session
    assert s is not None and s.phase == "ready"
