"""The memory plan's metrics, from a snapshot of a real vLLM 0.32 CPU log folded with the
model's geometry (tests/state/test_plan_actual.py)."""

from __future__ import annotations

from loadwatch.exporters.prometheus_memplan import memory_plan_metrics
from tests.state.test_plan_actual import ARGV, _fold, _model


def _samples(snap: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in memory_plan_metrics(snap):  # type: ignore[arg-type]
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_plan_and_vllm_side_by_side() -> None:
    snap = _fold("real-v0.32-llama.log", _model("llama"), ARGV).snapshot(0.0)
    got = _samples(snap)
    assert got[("loadwatch_kv_cache_tokens", ())] == 524_288
    assert got[("loadwatch_kv_cache_expected_tokens", ())] == 524_288
    assert got[("loadwatch_kv_cache_available_bytes", ())] == 2**30
    assert got[("loadwatch_kv_cache_bytes_per_token", ())] == 2048
    assert got[("loadwatch_kv_cache_vs_plan", (("comparison", "as_planned"),))] == 1
    assert got[("loadwatch_kv_cache_vs_plan", (("comparison", "differs"),))] == 0
    assert got[("loadwatch_memory_plan_verdict", (("verdict", "unknown"),))] == 1
    # No GPU capacity known: no planned budget, no planned tokens (not known is no sample).
    assert not any(name == "loadwatch_kv_cache_planned_tokens" for name, _ in got)


def test_no_model_no_plan_metrics() -> None:
    from loadwatch.daemon.state.loadstate import LoadState

    assert _samples(LoadState().snapshot(0.0)) == {}


def test_status_screen_shows_the_plan_beside_vllm() -> None:
    from rich.console import Console

    from loadwatch.exporters.terminal.screen import render_status

    snap = _fold("real-v0.32-llama.log", _model("llama"), ARGV).snapshot(0.0)
    console = Console(width=160, record=True)
    console.print(render_status(snap.to_dict()))
    text = console.export_text()
    assert "KV plan" in text
    assert "2,048 B/token · vLLM 524,288 tokens in 1.00 GiB (as planned)" in text
