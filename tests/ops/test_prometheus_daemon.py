"""A real Prometheus scraping the real daemon, which supervises the simulated vLLM.

The supervised command reads its scenario from a file at every start, so one daemon plays a
load that stalls (and is restarted by the stall policy), a load that runs out of GPU memory,
and a load that succeeds. Prometheus scrapes every second and evaluates a copy of alerts.yml
whose `for:` windows are cut to 2 s. Then every dashboard query must have returned data over
the run. Every wait is bounded.

Watch mode too: the simulated vLLM runs on its own, its output going to a file, and the daemon
follows that file and probes /health. A load that never stalls still fills the dashboard's
silence-and-threshold panel while it loads, and its /health panel once vLLM serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
    VllmConfig,
)
from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
from loadwatch.daemon.tools.demo import free_port, make_model_dir
from loadwatch.exporters.prometheus import EXIT_OUTCOMES
from tests.daemon.harness import running

from .common import ALERTS, require
from .dashboard import dashboard_queries, resolve
from .promserver import PromServer, short_rules_copy
from .test_metric_names import documented

pytestmark = [pytest.mark.prometheus, pytest.mark.waits]
GIB = 1 << 30
CAPACITY = 96 * GIB


def states(prom: PromServer, alert: str) -> list[str]:
    return [a.state for a in prom.alerts() if a.name == alert]


LEARNED = {
    "loadwatch_startup_eta_seconds",
    "loadwatch_startup_overdue_seconds",
    "loadwatch_startup_phase_overdue_seconds",
}
# A counter by remedy and outcome: no series until a remedy was tried (this run's start does
# not fail; tests/exporters/test_prometheus_collector.py, tests/supervisor/test_remedies_realvllm.py)
REMEDIES = {"loadwatch_vllm_remedies_total"}


def test_alerts_and_dashboard_against_the_real_daemon(tmp_path: Path) -> None:
    require("prometheus")
    model = make_model_dir(tmp_path, fp8_kv=False, shards=24, total_bytes=24 * 10**9)
    scenario = tmp_path / "scenario"
    scenario.write_text("stall")
    port = free_port()
    argv = (
        sys.executable,
        "-m",
        "loadwatch.daemon.sim.vllm_server",
        "--model",
        str(model),
        "--scenario-file",
        str(scenario),
        "--speed",
        "40",
        "--port",
        str(port),
        "--tensor-parallel-size",
        "2",
        "--layers",
        "4",
    )
    cfg = Config(
        log=LogConfig(path=tmp_path / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.1),
        forecast=ForecastConfig(stall_factor=3.0, stall_floor_s=1.0, load_budget_s=3600),
        vllm=VllmConfig(
            argv=argv,
            backoff_initial_s=0.5,
            backoff_max_s=1.0,
            crash_loop_starts=10,
            stall_policy="restart",
            stall_restart_after_s=7.0,
            stop_grace_s=3.0,
            preflight="off",
            health_url=f"http://127.0.0.1:{port}/health",
            servable=True,  # the first completion's latency has its dashboard panel
        ),
        state_dir=tmp_path / "state",
    )
    sims: list[SimulatedGpuSource] = []

    def gpus(progress: Callable[[], float]) -> GuardedGpuSource:
        sim = SimulatedGpuSource(4, progress=progress, final_used_bytes=int(CAPACITY * 1.15))
        sims.append(sim)
        return GuardedGpuSource(sim, deadline_s=1.0)

    short = short_rules_copy(ALERTS, tmp_path, 2.0)
    started = time.time()
    with running(cfg, gpu_factory=gpus) as d:
        target = d.url.removeprefix("http://")
        (tmp_path / "prom").mkdir()
        with PromServer(tmp_path / "prom", targets=[target], rule_files=[short]) as prom:
            # 1. the load stalls at 40%: pending, then firing; the memory trend says OOM meanwhile
            prom.wait_until(
                lambda: "pending" in states(prom, "LoadwatchLoadStalled"), "stall pending", 30
            )
            prom.wait_until(
                lambda: "firing" in states(prom, "LoadwatchLoadStalled"), "stall firing", 15
            )
            # The forecast and the stall are not ordered: the stall may fire first when shards
            # come quickly, the projection needs a few memory samples and its own for: window.
            prom.wait_until(
                lambda: "firing" in states(prom, "LoadwatchOomPredicted"), "forecast firing", 15
            )
            sims[0].raise_xid(1, 79)  # a GPU falls off the bus: the Xid alert and its counter
            prom.wait_until(
                lambda: "firing" in states(prom, "LoadwatchGpuXidErrors"), "Xid firing", 15
            )
            # 2. the stall policy restarts vLLM; this run runs out of GPU memory at 75%
            scenario.write_text("oom")
            prom.wait_until(
                lambda: states(prom, "LoadwatchLoadStalled") == [], "stall resolved", 30
            )
            prom.wait_until(
                lambda: "firing" in states(prom, "LoadwatchGpuOutOfMemory"), "OOM firing", 30
            )
            # 3. the next start loads something that fits and gets ready: the OOM alerts clear
            sims[0].set_final_used_bytes(int(CAPACITY * 0.8))
            scenario.write_text("success")
            prom.wait_until(lambda: d.get("/readyz")[0] == 200, "ready", 40)
            # a client asks for a model vLLM does not serve: its name in the log is set aside
            ask = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                data=json.dumps({"model": "x vLLM API server version 9.9.9"}).encode(),
            )
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(ask, timeout=5).close()
            prom.wait_until(
                lambda: states(prom, "LoadwatchGpuOutOfMemory") == [], "OOM resolved", 15
            )
            prom.wait_until(
                lambda: states(prom, "LoadwatchOomPredicted") == [], "forecast resolved", 15
            )
            prom.wait_scraped(scrapes=3)
            # every dashboard query had data at some point of the run
            empty: list[str] = []
            failed: list[str] = []
            for query in dashboard_queries():
                expr = resolve(query.expr, rate_interval="10s")
                try:
                    data: Any = prom.api(
                        "query_range",
                        {
                            "query": expr,
                            "start": str(started),
                            "end": str(time.time()),
                            "step": "1",
                        },
                    )
                    if not data["result"]:
                        empty.append(f"{query.where}: {expr}")
                except Exception as exc:
                    failed.append(f"{query.where}: {exc}")
            assert failed == []
            assert empty == []
            # the daemon exported every documented metric during the run, and nothing else; but
            # the learned ETA, exported only once the state directory's history holds a start
            # like this one (this run's first ready start has none before it:
            # tests/exporters/test_learned_metrics.py and tests/daemon/test_learned_daemon.py)
            names = set(prom.api("label/__name__/values", {"start": str(started)}))
            exported = {n for n in names if n.startswith("loadwatch_")}
            assert exported == set(documented()) - LEARNED - REMEDIES
            m = d.metrics()
            # The supervisor restarts as soon as its backoff allows, so a scenario may run twice
            # before the test switches it: at least one stalled and one OOM session, then the
            # ready one; every session but that one ended in an exit the supervisor counted.
            ooms = m['loadwatch_failures_total{kind="cuda_oom"}']
            assert ooms >= 1.0 and m["loadwatch_load_stalls_total"] >= 1.0
            exits = sum(m[f'loadwatch_vllm_exits_total{{outcome="{o}"}}'] for o in EXIT_OUTCOMES)
            assert m["loadwatch_sessions_total"] == exits + 1 >= 3.0
            assert m["loadwatch_vllm_restarts_total"] == exits


def panel_data(prom: PromServer, title: str, started: float, end: float) -> dict[str, int]:
    """refId -> how many series the panel's query returned over [started, end]."""
    out = {}
    for query in dashboard_queries():
        if query.where.startswith(f"panel {title!r} "):
            data = prom.api(
                "query_range",
                {
                    "query": resolve(query.expr, rate_interval="10s"),
                    "start": str(started),
                    "end": str(end),
                    "step": "1",
                },
            )
            out[query.where.rsplit(" ", 1)[1]] = len(data["result"])
    return out


def test_dashboard_in_watch_mode(tmp_path: Path) -> None:
    require("prometheus")
    model = make_model_dir(tmp_path, fp8_kv=False, shards=24, total_bytes=24 * 10**9)
    port = free_port()
    log = tmp_path / "vllm.log"
    cfg = Config(
        log=LogConfig(path=log, poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.2),
        forecast=ForecastConfig(stall_floor_s=300.0),  # this load never stalls
        vllm=VllmConfig(health_url=f"http://127.0.0.1:{port}/health", health_interval_s=0.5),
        state_dir=tmp_path / "state",
    )
    assert not cfg.supervise
    argv = [
        sys.executable, "-m", "loadwatch.daemon.sim.vllm_server", "--model", str(model),
        "--speed", "60", "--port", str(port), "--tensor-parallel-size", "2", "--layers", "4",
    ]  # fmt: skip
    started = time.time()
    with running(cfg) as d:
        target = d.url.removeprefix("http://")
        (tmp_path / "prom").mkdir()
        with PromServer(tmp_path / "prom", targets=[target]) as prom:
            prom.wait_scraped(scrapes=2)  # the daemon waits for a log that is not there yet
            with log.open("wb") as out:
                vllm = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                )  # fmt: skip
            try:
                prom.wait_until(
                    lambda: prom.query('loadwatch_load_phase{phase="loading_weights"} == 1'),
                    "a scrape of the load",
                    30,
                )
                prom.wait_until(lambda: d.get("/readyz")[0] == 200, "vLLM ready", 60)
                prom.wait_until(
                    lambda: prom.query("loadwatch_vllm_health_up == 1"), "a /health scrape", 15
                )
                prom.wait_scraped(scrapes=2)  # the range queries' 1 s steps land on it
            finally:
                vllm.terminate()
                vllm.wait(timeout=20)
            end = time.time()
            assert panel_data(prom, "Silence vs stall threshold", started, end) == {
                "A": 1,
                "B": 1,
                "C": 1,  # 0 all through: stalled times the threshold
            }
            assert panel_data(prom, "vLLM /health", started, end) == {"A": 1}
            # The threshold was there while the weights loaded, with no stall raised.
            during = prom.api(
                "query_range",
                {
                    "query": "loadwatch_load_stall_threshold_seconds"
                    " and on(job, instance) loadwatch_load_silence_seconds"
                    ' and on(job, instance) loadwatch_load_phase{phase="loading_weights"} == 1',
                    "start": str(started),
                    "end": str(end),
                    "step": "1",
                },
            )["result"]
            assert during and len(during[0]["values"]) >= 2
            assert prom.query("max_over_time(loadwatch_load_stalled[10m])")[0].value == 0.0
            assert "loadwatch_vllm_state" not in {
                n for n in prom.api("label/__name__/values", {"start": str(started)})
            }  # watch mode: no supervisor
