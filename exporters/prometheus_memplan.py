"""The memory plan's metrics: what loadwatch planned for the KV cache and what vLLM reported,
side by side (docs/metrics.md). Read from the snapshot; nothing is decided here."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from loadwatch.daemon.state.snapshot import Snapshot

VERDICTS = ("fits", "tight", "will_fail", "unknown")
COMPARISONS = ("pending", "as_planned", "below_budget", "above_budget", "differs")


def _one(name: str, doc: str, value: float | None) -> Iterator[GaugeMetricFamily]:
    if value is not None:
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], float(value))
        yield g


def _bounds(
    name: str, doc: str, low: float | None, high: float | None
) -> Iterator[GaugeMetricFamily]:
    if low is None and high is None:
        return
    g = GaugeMetricFamily(name, doc, labels=["bound"])
    for bound, value in (("low", low), ("high", high)):
        if value is not None:
            g.add_metric([bound], float(value))
    yield g


def memory_plan_metrics(snap: Snapshot) -> Iterator[GaugeMetricFamily]:
    p = snap.memory_plan
    if p is None:
        return
    verdict = GaugeMetricFamily(
        "loadwatch_memory_plan_verdict",
        "1 for the memory plan's verdict on --max-model-len, 0 for the others.",
        labels=["verdict"],
    )
    for v in VERDICTS:
        verdict.add_metric([v], 1.0 if p.verdict == v else 0.0)
    yield verdict
    yield from _one(
        "loadwatch_kv_cache_bytes_per_token",
        "Planned KV bytes per token on one GPU.",
        p.kv_bytes_per_token,
    )
    yield from _one(
        "loadwatch_weights_planned_bytes", "Planned weights per GPU.", p.weights_bytes_per_gpu
    )
    yield from _bounds(
        "loadwatch_kv_cache_planned_budget_bytes",
        "Planned KV-cache memory per GPU (range).",
        p.budget_low_bytes,
        p.budget_high_bytes,
    )
    yield from _bounds(
        "loadwatch_kv_cache_planned_tokens",
        "Planned KV-cache capacity in tokens (range).",
        p.planned_tokens_low,
        p.planned_tokens_high,
    )
    yield from _one(
        "loadwatch_kv_cache_available_bytes",
        "KV-cache memory per GPU as vLLM reported it.",
        p.actual_available_bytes,
    )
    yield from _one(
        "loadwatch_kv_cache_tokens",
        "KV-cache capacity in tokens as vLLM reported it.",
        p.actual_tokens,
    )
    yield from _one(
        "loadwatch_kv_cache_expected_tokens",
        "Tokens the plan's bytes per token give for vLLM's reported KV memory.",
        p.expected_tokens,
    )
    cmp = GaugeMetricFamily(
        "loadwatch_kv_cache_vs_plan",
        "1 for how vLLM's KV cache compares with the plan, 0 for the others.",
        labels=["comparison"],
    )
    for c in COMPARISONS:
        cmp.add_metric([c], 1.0 if p.actual_vs_plan == c else 0.0)
    yield cmp
