"""The node's metrics: its place in a multi-node deployment and the load as its own signals
(bytes read, GPU memory placed) tell it, on every node whether it prints the weights bar or not.
Prometheus compares the nodes (prometheus/alerts.yml's `loadwatch-deployment` group); nothing
here knows about the other nodes."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from loadwatch.daemon.state.snapshot import Snapshot

NODE_INFO_LABELS = ("role", "node_rank", "nnodes", "head_address", "ranks", "world_size", "backend")


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _one(name: str, doc: str, value: float | None) -> Iterator[GaugeMetricFamily]:
    if value is not None:
        g = GaugeMetricFamily(name, doc)
        g.add_metric([], float(value))
        yield g


def node_metrics(snap: Snapshot) -> Iterator[GaugeMetricFamily]:
    node = snap.node
    if node is None:
        return
    r, p = node.role, node.progress
    info = GaugeMetricFamily(
        "loadwatch_node_info",
        "Always 1: this node's role in the deployment, its node rank, the ranks it hosts, "
        "the head's address.",
        labels=list(NODE_INFO_LABELS),
    )
    info.add_metric(
        [
            r.role,
            _text(r.node_rank),
            _text(r.nnodes),
            _text(r.head_address),
            _text(r.ranks),
            _text(r.world_size),
            _text(r.backend),
        ],
        1.0,
    )
    yield info
    yield from _one("loadwatch_node_ready", "1 when this node has done its part.", node.ready)
    yield from _one("loadwatch_node_loading", "1 while this node loads weights.", p.loading)
    yield from _one("loadwatch_node_stalled", "1 while neither signal moves in a load.", p.stalled)
    yield from _one(
        "loadwatch_node_bar_unbacked",
        "1 while the weights bar runs far ahead of the bytes read and placed.",
        p.bar_unbacked,
    )
    yield from _one("loadwatch_node_progress_ratio", "This node's load progress, 0..1.", p.ratio)
    sig = GaugeMetricFamily(
        "loadwatch_node_signal_progress_ratio",
        "Progress by one signal: bytes read (io) or GPU memory placed (gpu), 0..1.",
        labels=["signal"],
    )
    for name, value in (("io", p.io_ratio), ("gpu", p.gpu_ratio)):
        if value is not None:
            sig.add_metric([name], value)
    yield sig
    yield from _one(
        "loadwatch_node_read_bytes", "Bytes this node's vLLM read in the load.", p.read_bytes
    )
    yield from _one(
        "loadwatch_node_expected_read_bytes",
        "Bytes this node must read: the checkpoint times its share.",
        p.expected_bytes,
    )
    yield from _one(
        "loadwatch_node_gpu_gained_bytes",
        "GPU memory this node's GPUs gained in the load.",
        p.gpu_gained_bytes,
    )
    yield from _one(
        "loadwatch_node_read_share_ratio", "The part of the checkpoint this node reads.", r.share
    )
    eta = GaugeMetricFamily(
        "loadwatch_node_eta_seconds",
        "Seconds until this node's load ends, by its own signals: expected, low, high.",
        labels=["bound"],
    )
    for bound, value in (("expected", p.eta_s), ("low", p.eta_low_s), ("high", p.eta_high_s)):
        if value is not None:
            eta.add_metric([bound], value)
    yield eta


__all__ = ["NODE_INFO_LABELS", "node_metrics"]
