"""vLLM's 2026 loader lines, read field by field.

Each body is quoted verbatim from ../shared/vllm-log-formats.md section 9 (2026), which names the
vLLM PR or issue it comes from; a vLLM header (`(Worker_TP0 pid=N) INFO MM-DD HH:MM:SS [f.py:N] `)
is put around the bodies that vLLM logs through its logger, as bench/adversarial.py does. Bar
lines are bare (tqdm writes them itself) and are quoted whole.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.entries import (
    scaled,
)
from loadwatch.parsers.events import EpWeightFilter, Event, Milestone, ShardProgress
from loadwatch.parsers.vllm.catalog import (
    bar_unit,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
HEAD = "(Worker_TP0 pid=400) INFO 06-14 04:57:13 [{}] "


def events(*lines: str) -> list[Event]:
    data = ("\n".join(lines) + "\n").encode()
    return EventStream(ref_ts=1796083200.0).feed_all(split_records(data))


def test_checkpoint_size_line_of_pr_39422_gives_the_size_and_the_filesystem() -> None:
    """PR #39422: `Filesystem type for checkpoints: AUTOFS. Checkpoint size: 432.90 GiB.
    Available RAM: 748.13 GiB.`"""
    body = (
        "Filesystem type for checkpoints: AUTOFS. Checkpoint size: 432.90 GiB. "
        "Available RAM: 748.13 GiB."
    )
    (ev,) = events(HEAD.format("weight_utils.py:922") + body)
    assert isinstance(ev, Milestone)
    assert (ev.kind, ev.gib, ev.value) == ("checkpoint_info", 432.90, "AUTOFS")


def test_instanttensor_bar_of_pr_46868_counts_bytes() -> None:
    """InstantTensor's bar since PR #46868 (2026-06): `0.00/155G [00:00<?, ?B/s]` ...
    `13.3G/155G ... 14.3GB/s`: tqdm's unit-scaled numbers read as bytes."""
    first, second = events(
        "Loading safetensors using InstantTensor loader:   0% Completed | 0.00/155G [00:00<?, ?B/s]",
        "Loading safetensors using InstantTensor loader:   9% Completed | 13.3G/155G "
        "[00:01<00:10, 14.3GB/s]",
    )
    assert isinstance(first, ShardProgress) and isinstance(second, ShardProgress)
    assert (first.bar, first.unit, first.done, first.total) == ("weights", "bytes", 0, 155 * 10**9)
    assert first.rate_per_s is None and first.remaining_s is None
    assert (second.done, second.total) == (13_300_000_000, 155 * 10**9)
    assert second.rate_per_s == pytest.approx(14.3e9)
    assert (second.elapsed_s, second.remaining_s) == (1.0, 10.0)


@pytest.mark.parametrize(
    ("text", "value"),
    [("0.00", 0.0), ("13.3G", 13.3e9), ("155G", 155e9), ("1.20T", 1.2e12), ("512", 512.0)],
)
def test_tqdm_unit_scaled_numbers(text: str, value: float) -> None:
    assert scaled(text) == pytest.approx(value)


def test_what_each_loaders_bar_counts() -> None:
    """Section 9's table: safetensors, multi-thread and fastsafetensors bars count files, the
    Run:ai streamer's and InstantTensor's (before PR #46868) count tensors."""
    assert bar_unit("Loading safetensors checkpoint shards", "weights") == "files"
    assert bar_unit("Multi-thread loading shards", "weights") == "files"
    assert bar_unit("Loading safetensors using Fastsafetensor loader", "weights") == "files"
    assert bar_unit("Loading safetensors using InstantTensor loader", "weights") == "tensors"
    assert bar_unit("Loading safetensors using Runai Model Streamer", "weights") == "tensors"
    assert bar_unit("Capturing CUDA graphs (PIECEWISE)", "graph_capture") == "items"
    # run-ai/runai-model-streamer#67 (tests/fixtures/gh-runai-67-compact-bar.log)
    data = (FIXTURES / "gh-runai-67-compact-bar.log").read_bytes()
    bars = [e for e in EventStream(ref_ts=0.0).feed_all(split_records(data))]
    units = {e.unit for e in bars if isinstance(e, ShardProgress)}
    assert units == {"tensors"}


def test_ep_weight_filter_of_pr_37136_is_an_event_with_its_numbers() -> None:
    """PR #37136: vLLM's `EP weight filter: ep_size=%d, ep_rank=%d, loading %d/%d experts`
    (section 9), filled as on a rank of 8 over 256 experts."""
    body = "EP weight filter: ep_size=8, ep_rank=3, loading 32/256 experts"
    (ev,) = events(HEAD.format("default_loader.py:411") + body)
    assert isinstance(ev, EpWeightFilter)
    assert (ev.ep_size, ev.ep_rank, ev.experts_loaded, ev.experts_total) == (8, 3, 32, 256)
    assert ev.process == "Worker_TP0"


@pytest.mark.parametrize(
    ("body", "gib", "seconds"),
    [
        ("Model loading took 106.69 GiB memory and 2278.911946 seconds", 106.69, 2278.911946),
        # Model Runner V2 drops "memory" (vllm#44106)
        ("Model loading took 7.64 GiB and 32.969258 seconds", 7.64, 32.969258),
    ],
)
def test_both_forms_of_model_loading_took(body: str, gib: float, seconds: float) -> None:
    (ev,) = events(HEAD.format("gpu_model_runner.py:3000") + body)
    assert isinstance(ev, Milestone)
    assert (ev.kind, ev.gib, ev.seconds) == ("model_memory", gib, seconds)


def test_uvicorn_startup_lines_are_milestones() -> None:
    """uvicorn's lines as real vLLM 0.32 prints them (tests/fixtures/real-v0.32-llama.log, a
    run here); `Application startup complete.` stays the ready line."""
    log = (FIXTURES / "real-v0.32-llama.log").read_text().split("\n")
    at = log.index("INFO:     Started server process [21820]")
    lines = log[at : at + 3]
    started, waiting, complete = events(*lines)
    assert isinstance(started, Milestone) and isinstance(waiting, Milestone)
    assert (started.kind, started.detail, started.value) == (
        "api_server_start",
        "server_process",
        "21820",
    )
    assert (waiting.kind, waiting.detail) == ("api_server_start", "waiting_startup")
    assert isinstance(complete, Milestone) and complete.kind == "app_startup_complete"
