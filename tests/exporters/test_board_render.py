"""What a publish renders, rendered cheaply: the same bytes as the general way, every time.

- the /status JSON encoded straight from the snapshot equals `json.dumps(snapshot.to_dict())`,
  for the real fixture logs folded (with simulated GPUs), and takes the dict route to redact;
- the exposition with unchanged families reused equals prometheus_client's, publish after
  publish;
- the HTTP process keeps its board on a heartbeat, and serves the daemon's process_* itself."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import Published, Totals
from loadwatch.exporters.http.board import Board
from loadwatch.exporters.http.process import HttpProcess
from loadwatch.exporters.http.routes import status_json
from loadwatch.exporters.http.settings import HttpConfig
from loadwatch.exporters.prometheus import LoadwatchCollector, Renderer, registry_for
from loadwatch.parsers.vllm.argv_secrets import Redactor
from tests.exporters.test_httpd import get
from tests.helpers import wait_for
from tests.views.helpers import FIXTURES, fold_log

LOGS = sorted(p.name for p in FIXTURES.glob("real-v0.32-*.log"))  # real vLLM: every shape


def _published(state: LoadState, now: float) -> Published:
    return Published(
        state=state,
        at=now,
        started_at=now - 60,
        version="0.1.0",
        totals=Totals(warnings={}, failures={}, stalls=0, events={"log_warning": 3}, xids={}),
        log=None,
        gpu=None,
        supervisor=None,
        load_budget_s=None,
        _cache=[None, now],
    )


def _folded(name: str) -> tuple[LoadState, float]:
    clock = [0.0]
    gpus = SimulatedGpuSource(2, clock=lambda: clock[0])
    return fold_log((FIXTURES / name).read_bytes(), gpus=gpus, clock=clock)


@pytest.mark.parametrize("name", LOGS)
def test_the_status_json_is_the_snapshots_to_dict(name: str) -> None:
    state, now = _folded(name)
    snap = state.snapshot(now)
    slow = json.dumps(snap.to_dict(), sort_keys=False).encode() + b"\n"
    assert status_json(snap, Redactor()) == slow
    secret = Redactor()
    secret.learn(("--api-key", "s3cr3t-t0ken-value"), {})
    assert status_json(snap, secret) == json.dumps(secret.value(snap.to_dict())).encode() + b"\n"


def test_a_reused_family_renders_as_prometheus_client_does() -> None:
    state, now = _folded("real-v0.32-llama.log")
    current: list[Published] = []
    registry = registry_for(LoadwatchCollector(lambda: current[-1], lambda: now))
    render = Renderer(registry)
    for step in range(4):  # the same state, then time moving on (a counter, a gauge change)
        current.append(_published(state, now + 7 * step))
        assert render() == generate_latest(registry)


def test_a_heartbeat_keeps_the_board_and_process_metrics_are_the_daemons(tmp_path: Path) -> None:
    server = HttpProcess(HttpConfig(port=0))
    url = server.start()
    try:
        server.send(Board(b"loadwatch_up 1\n", b"{}\n", True, ""))
        wait_for(lambda: get(url, "/readyz")[0] == 200, "the board")
        server.alive()
        # (real: nothing tells when the server has read the heartbeat; it has by then)
        time.sleep(0.2)
        code, body = get(url, "/metrics")
        assert code == 200 and body.startswith(b"loadwatch_up 1\n")
        assert get(url, "/status") == (200, b"{}\n")
        # the daemon (here: this process, the server's parent) as the plain process_*
        start = next(
            float(line.split()[1])
            for line in body.decode().splitlines()
            if line.startswith("process_start_time_seconds ")
        )
        with open(f"/proc/{os.getpid()}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(x.split()[1]) for x in f if x.startswith("btime"))
        assert abs(start - (boot + ticks / os.sysconf("SC_CLK_TCK"))) < 1.0
    finally:
        server.stop()
