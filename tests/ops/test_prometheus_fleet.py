"""A real Prometheus scraping three real daemons of one multi-node deployment.

The head supervises the simulated vLLM, which prints the weights bar; two headless nodes each
follow their own node's log: the real log of a headless node of a two-node PP deployment
(tests/fixtures/real-v0.32-pp2-node1.log), its `Loading weights took` written once the node has
read its share. Behind them: simulated GPUs and a simulated /proc I/O source (the interface the
real ProcIoReader has) whose bytes follow the head's bar, one node's at half the pace. The
shipped alerts run with their `for:` cut to 2 s (`short_rules_copy`). The slowed node's
straggler alert fires; a run where every node keeps pace fires none of the node alerts.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
    ModelConfig,
    VllmConfig,
)
from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.sim.procio import SimulatedProcIo
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
from loadwatch.daemon.tools.demo import free_port, make_model_dir
from tests.daemon.harness import Running, running

from .common import ALERTS, require
from .promserver import PromServer, short_rules_copy

pytestmark = [pytest.mark.prometheus, pytest.mark.waits]
GIB = 1 << 30
TOTAL = 24 * 10**9
GPUS = 2
NODE_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "real-v0.32-pp2-node1.log"
NODE_ALERTS = ("LoadwatchNodeStraggler", "LoadwatchNodeNotReady", "LoadwatchNodeDown")


class DeploymentProm(PromServer):
    """Every target labelled with the deployment, as prometheus/fleet.yml.example does."""

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        for sc in cfg["scrape_configs"]:
            for group in sc["static_configs"]:
                group["labels"] = {"deployment": "d1"}
        return cfg


def head_progress(head: Running) -> float:
    node = head.daemon.snapshot().node if head.daemon is not None else None
    ratio = node.progress.ratio if node is not None else None
    return ratio or 0.0


class HeadlessLog:
    """A headless node's log: its real lines up to the weights, the rest once it read them."""

    def __init__(self, path: Path) -> None:
        lines = NODE_LOG.read_text().splitlines(keepends=True)
        cut = next(i for i, x in enumerate(lines) if "Loading weights took" in x)
        self.path = path
        self.rest = lines[cut : cut + 3]  # the weights line, the KV cache, the serving threads
        path.write_text("".join(lines[:cut]))
        self.done = False

    def finish(self) -> None:
        if not self.done:
            self.done = True
            with self.path.open("a") as f:
                f.write("".join(self.rest))


def head_config(tmp: Path, model: Path) -> Config:
    port = free_port()
    argv = (
        sys.executable, "-m", "loadwatch.daemon.sim.vllm_server", "--model", str(model),
        "--scenario", "success", "--speed", "10", "--port", str(port),
        "--tensor-parallel-size", str(GPUS), "--layers", "4",
    )  # fmt: skip
    return Config(
        log=LogConfig(path=tmp / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.2),
        forecast=ForecastConfig(stall_floor_s=30.0, load_budget_s=3600),
        vllm=VllmConfig(
            argv=argv,
            preflight="off",
            health_url=f"http://127.0.0.1:{port}/health",
            stop_grace_s=3.0,
        ),
        model=ModelConfig(dir=model),
        state_dir=tmp / "state",
    )


def node_config(tmp: Path, model: Path) -> Config:
    return Config(
        log=LogConfig(path=tmp / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.2),
        forecast=ForecastConfig(stall_floor_s=30.0),
        model=ModelConfig(dir=model),
        state_dir=tmp / "state",
    )


def gpus_following(progress: Callable[[], float], node_bytes: int) -> Callable[..., Any]:
    def make(_own: Callable[[], float]) -> GuardedGpuSource:
        per_gpu = node_bytes // GPUS
        sim = SimulatedGpuSource(GPUS, progress=progress, final_used_bytes=per_gpu + GIB)
        return GuardedGpuSource(sim, deadline_s=1.0)

    return make


@contextmanager
def deployment(tmp: Path, paces: tuple[float, float]) -> Iterator[tuple[Running, list[Running]]]:
    """The head and two headless nodes; node i reads at `paces[i]` x the head's bar."""
    model = make_model_dir(tmp, fp8_kv=False, shards=24, total_bytes=TOTAL)
    with ExitStack() as stack:
        (tmp / "head").mkdir()
        head = stack.enter_context(
            running(
                head_config(tmp / "head", model),
                gpu_factory=lambda progress: GuardedGpuSource(
                    SimulatedGpuSource(GPUS, progress=progress, final_used_bytes=40 * GIB),
                    deadline_s=1.0,
                ),
            )
        )
        nodes: list[Running] = []
        logs: list[HeadlessLog] = []
        share = TOTAL // 2  # world_size=2, this node hosts rank 1: half the checkpoint
        for i, pace in enumerate(paces):
            d = tmp / f"node{i + 1}"
            d.mkdir()
            log = HeadlessLog(d / "vllm.log")
            logs.append(log)

            def frac(pace: float = pace, log: HeadlessLog = log) -> float:
                f = min(head_progress(head) * pace, 1.0)
                if f >= 1.0:
                    log.finish()
                return f

            nodes.append(
                stack.enter_context(
                    running(
                        node_config(d, model),
                        gpu_factory=gpus_following(frac, share),
                        io_reader=SimulatedProcIo(frac, share),
                    )
                )
            )
        yield head, nodes


def targets(head: Running, nodes: list[Running]) -> list[str]:
    return [r.url.removeprefix("http://") for r in (head, *nodes)]


class AlertLog:
    """Every node alert Prometheus reported, polled in the background."""

    def __init__(self, prom: PromServer) -> None:
        self.prom = prom
        self.seen: list[tuple[str, str, str]] = []  # (alert, state, instance)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for a in self.prom.alerts():
                    if a.name in NODE_ALERTS:
                        self.seen.append((a.name, a.state, a.labels.get("instance", "")))
            except Exception:
                pass
            self._stop.wait(0.5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_slowed_node_is_a_straggler(tmp_path: Path) -> None:
    require("prometheus")
    short = short_rules_copy(ALERTS, tmp_path, 2.0)
    with deployment(tmp_path, (1.0, 0.5)) as (head, nodes):
        (tmp_path / "prom").mkdir()
        addrs = targets(head, nodes)
        with DeploymentProm(tmp_path / "prom", targets=addrs, rule_files=[short]) as prom:
            log = AlertLog(prom)
            started = time.monotonic()
            try:
                prom.wait_until(
                    lambda: ("LoadwatchNodeStraggler", "firing", addrs[2]) in log.seen,
                    "the slowed node's straggler alert firing",
                    60,
                )
            finally:
                log.close()
            took = time.monotonic() - started
            assert {inst for name, _, inst in log.seen if name == "LoadwatchNodeStraggler"} == {
                addrs[2]
            }, log.seen
            role = prom.query('loadwatch_node_info{role="headless_tp_pp"}')
            assert {s.labels["instance"] for s in role} == set(addrs[1:])
            slowest = prom.query("min by (deployment) (loadwatch_node_progress_ratio)")
            assert slowest and slowest[0].labels["deployment"] == "d1"
            print(f"straggler alert firing {took:.1f} s after Prometheus started")


def test_nodes_that_keep_pace_fire_nothing(tmp_path: Path) -> None:
    require("prometheus")
    short = short_rules_copy(ALERTS, tmp_path, 2.0)
    with deployment(tmp_path, (1.0, 1.0)) as (head, nodes):
        (tmp_path / "prom").mkdir()
        addrs = targets(head, nodes)
        with DeploymentProm(tmp_path / "prom", targets=addrs, rule_files=[short]) as prom:
            log = AlertLog(prom)
            try:
                prom.wait_until(lambda: head.get("/readyz")[0] == 200, "the head ready", 90)
                prom.wait_until(
                    lambda: (
                        all(s.value == 1.0 for s in prom.query("loadwatch_node_ready"))
                        and len(prom.query("loadwatch_node_ready")) == 3
                    ),
                    "every node ready",
                    30,
                )
                prom.wait_evaluated(rounds=4)  # past the alerts' shortened for:
            finally:
                log.close()
            assert [x for x in log.seen if x[1] == "firing"] == [], log.seen
            progressed = prom.api(
                "query", {"query": "max_over_time(loadwatch_node_progress_ratio[5m])"}
            )["result"]
            assert len(progressed) == 3 and all(float(r["value"][1]) == 1.0 for r in progressed)
