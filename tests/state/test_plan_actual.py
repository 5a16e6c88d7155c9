"""Plan against actual in the state: logs real vLLM 0.32 wrote on the CPU (tests/fixtures/
real-v0.32-*.log, the tiny Llama- and DeepSeek-style models of tests/realvllm/tinymodel.py),
through the real parser into the fold, with the model directory's geometry."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from loadwatch.daemon.sources.inputs import ModelInfo, ProcessEvent, ShardInfo
from loadwatch.daemon.sources.model.geometry import read_geometry
from loadwatch.daemon.state.loadstate import Input, LoadState, run
from loadwatch.daemon.state.memplan_inputs import layout_from_argv
from loadwatch.daemon.tools.preflight import preflight
from loadwatch.parsers import EventStream, split_records
from tests.realvllm.tinymodel import BuildOptions, plan

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _model(arch: str, layers: int | None = None) -> ModelInfo:
    config, _ = plan(BuildOptions(arch=arch, layers=layers))  # type: ignore[arg-type]
    return ModelInfo(
        path="/m",
        shards=(ShardInfo("model-00001.safetensors", 400_000_000),),
        total_bytes=400_000_000,
        geometry=read_geometry(config),
    )


def _fold(name: str, info: ModelInfo, argv: tuple[str, ...], upto: str | None = None) -> LoadState:
    data = (FIXTURES / name).read_bytes()
    if upto is not None:
        data = data[: data.index(upto.encode())]
    events = EventStream(ref_ts=datetime(2026, 12, 1).timestamp()).feed_all(split_records(data))
    first = next(e.ts for e in events if e.ts is not None)
    items: list[tuple[float, Input]] = [
        (first - 1, ProcessEvent(kind="started", ts=first - 1, pid=1, argv=argv)),
        (first - 1, info),
    ]
    items += [(e.ts or first, e) for e in events]
    state, _ = run(items, LoadState())
    return state


ARGV = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m")


def test_llama_cpu_tokens_as_planned() -> None:
    snap = _fold("real-v0.32-llama.log", _model("llama"), ARGV).snapshot(0.0)
    p = snap.memory_plan
    assert p is not None
    assert p.kv_bytes_per_token == 4 * 2 * 2 * 64 * 2  # 4 layers, K and V, 2 KV heads, bf16
    assert p.actual_tokens == 524_288 and p.actual_available_bytes == 2**30
    assert p.expected_tokens == 524_288
    assert p.actual_vs_plan == "as_planned"


def test_deepseek_fp8_cpu_tokens_as_planned() -> None:
    argv = (*ARGV, "--kv-cache-dtype", "fp8")
    snap = _fold("real-v0.32-deepseek-fp8kv.log", _model("deepseek"), argv).snapshot(0.0)
    p = snap.memory_plan
    assert p is not None and p.kv_dtype == "fp8"
    assert p.kv_bytes_per_token == 12 * 576  # MLA latent, one byte
    assert p.actual_tokens == 155_344 and p.expected_tokens == 155_344
    assert p.actual_vs_plan == "as_planned"


def test_a_plan_that_does_not_match_is_said_to_differ() -> None:
    # The same log with a checkpoint that claims twice the layers: half the tokens expected.
    snap = _fold("real-v0.32-llama.log", _model("llama", layers=8), ARGV).snapshot(0.0)
    p = snap.memory_plan
    assert p is not None and p.actual_vs_plan == "differs"
    assert p.expected_tokens == 262_144 and "+100.0%" in p.explain


def test_pending_until_vllm_sizes_its_cache() -> None:
    state = _fold("real-v0.32-llama.log", _model("llama"), ARGV, upto="CPU KV cache size")
    p = state.snapshot(0.0).memory_plan
    assert p is not None and p.actual_vs_plan == "pending" and p.actual_tokens is None
    assert p.kv_bytes_per_token == 2048 and p.verdict == "unknown"  # no GPU capacity known


def _watched(name: str, info: ModelInfo) -> LoadState:
    """The log folded as watch mode folds it when vLLM's own argv is not known (no process
    seen): the model directory given, the rest from the log."""
    data = (FIXTURES / name).read_bytes()
    events = EventStream(ref_ts=datetime(2026, 12, 1).timestamp()).feed_all(split_records(data))
    first = next(e.ts for e in events if e.ts is not None)
    items: list[tuple[float, Input]] = [(first, events[0]), (first, info)]
    items += [(e.ts or first, e) for e in events[1:]]
    state, _ = run(items, LoadState())
    return state


def test_the_plan_takes_the_launch_arguments_vllm_logged() -> None:
    """Watch mode with no argv: the plan's layout is what vLLM's `non-default args` line says,
    not TP 1. The Kimi-K2.5 start on eight RTX PRO 6000s (tests/fixtures/v1-2026-sm120.log)
    logged `'tensor_parallel_size': 8`: the weights are split eight ways."""
    info = _model("llama")
    snap = _watched("v1-2026-sm120.log", info).snapshot(0.0)
    s, p = snap.session, snap.memory_plan
    assert s is not None and p is not None
    assert p.weights_bytes_per_gpu == 400_000_000 // 8
    assert "as vLLM logged them at start" in p.explain
    llama = _watched("real-v0.32-llama.log", info).snapshot(0.0).memory_plan
    assert llama is not None and llama.max_model_len == 512  # `'max_model_len': 512`


def test_preflight_and_the_live_view_plan_one_start_alike() -> None:
    """One planner: for the start that real vLLM 0.32 could not fit (`--kv-cache-memory-bytes
    1000000`, tests/fixtures/real-v0.32-kv-too-small.log), the plan supervise mode's preflight
    makes before the start and the plan the live view shows during it are the same plan (they
    once said `fits` 77,664 tokens and `will fail` 64 tokens of the same start)."""
    info = _model("deepseek")  # (the start's model: tests/realvllm/capture.py)
    for extra in (("--kv-cache-memory-bytes", "1000000"), ("--max-model-len", "256")):
        argv = (*ARGV, *extra)
        live = _fold("real-v0.32-kv-too-small.log", info, argv).snapshot(0.0).memory_plan
        before = preflight(info, "auto", None, layout=layout_from_argv(argv)).memory
        assert live is not None and before is not None
        assert live.verdict == before.verdict
        assert live.max_model_len == before.max_model_len
        assert live.kv_bytes_per_token == (before.kv.bytes if before.kv else None)
        assert (live.budget_low_bytes, live.budget_high_bytes) == (
            before.available_low,
            before.available_high,
        )
        assert (live.planned_tokens_low, live.planned_tokens_high) == (
            before.low.tokens if before.low else None,
            before.high.tokens if before.high else None,
        )
    assert live.verdict == "unknown"  # no flag, no GPU: no budget, said so by both
    flagged = _fold(
        "real-v0.32-kv-too-small.log", info, (*ARGV, "--kv-cache-memory-bytes", "1000000")
    )
    p = flagged.snapshot(0.0).memory_plan
    assert p is not None and p.verdict == "will_fail"
