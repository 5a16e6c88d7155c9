"""The kubelet's probes, as k8s/vllm-loadwatch.yaml sets them, against the real daemon.

A small kubelet plays the manifest's startupProbe, livenessProbe and readinessProbe (period,
failure threshold, timeout) against `loadwatch run` supervising the simulated vLLM
(daemon/sim/vllm_server.py), which prints a Kimi-K2.5-NVFP4 load of 119 shards that takes about
15 minutes, sped up SPEED times. The probe periods and the config's durations (the stall floor,
backoff) are divided by SPEED too, so the run is the manifest's, faster. What it proves:

- the load that progresses is never killed, though it takes longer than the fixed budgets
  (60 x 10 s) that kill such loads today, and the pod is ready only once vLLM is;
- a load that stops is killed within the stall policy: the stall threshold, then
  failureThreshold x periodSeconds of 503s (plus loadwatch's 1 s tick, a probe period, and 2 s
  for a busy machine; measured here: 5.8 s after the last progress, 4 s of it the stall floor);
- a vLLM that crash-loops is killed, once loadwatch's own restarts stopped helping.
"""

from __future__ import annotations

import http.client
import sys
import time
import tomllib
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadwatch.daemon.tools.demo import free_port, make_model_dir
from tests.e2e.realdaemon import DaemonProc, write_config
from tests.helpers import wait_for

from .common import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.waits]
SPEED = 30.0
TICK_S = 1.0  # loadwatch's loop checks for stalls and publishes at least this often
BUSY_S = 2.0  # what a loaded 2-core CI machine may add to the daemon's tick and the probes
BUDGET_S = 60 * 10  # the fixed startup budget (failureThreshold x periodSeconds) of today


def manifest() -> tuple[dict[str, Any], dict[str, Any]]:
    objs = {
        d["kind"]: d
        for d in yaml.safe_load_all((ROOT / "k8s" / "vllm-loadwatch.yaml").read_text())
        if d
    }
    (container,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container, tomllib.loads(objs["ConfigMap"]["data"]["loadwatch.toml"])


@dataclass
class Probe:
    name: str
    path: str
    period_s: float  # scaled
    failure_threshold: int
    timeout_s: float
    failures: int = 0
    due: float = 0.0

    @classmethod
    def of(cls, container: dict[str, Any], key: str) -> Probe:
        p = container[key]
        return cls(
            key,
            p["httpGet"]["path"],
            p.get("periodSeconds", 10) / SPEED,
            p.get("failureThreshold", 3),
            p.get("timeoutSeconds", 1),
        )


@dataclass
class Kubelet:
    """Runs the startup probe until it passes, then liveness and readiness, each on its own
    period; kills (records the time) when liveness or startup fails failureThreshold times."""

    url: str
    startup: Probe
    liveness: Probe
    readiness: Probe
    started: bool = False
    ready: bool = False
    killed_at: float | None = None
    killed_why: str = ""
    ready_at: float | None = None
    log: list[tuple[float, str, int]] = field(default_factory=list)

    def get(self, probe: Probe) -> tuple[int, str]:
        u = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=probe.timeout_s)
        try:
            conn.request("GET", probe.path)
            r = conn.getresponse()
            return int(r.status), r.read().decode(errors="replace").strip()
        except OSError as exc:
            return 0, str(exc)  # refused or timed out: a failure, as for the kubelet
        finally:
            conn.close()

    def step(self, now: float) -> None:
        probes = [self.startup] if not self.started else [self.liveness, self.readiness]
        for probe in probes:
            if now < probe.due:
                continue
            # on a fixed period from its first probe, as the kubelet's prober ticks (Go's
            # time.Ticker): a late or slow probe does not move the ones after it; of the ticks
            # missed while it was behind, one is taken at once and the rest dropped
            probe.due = (
                now + probe.period_s if not probe.due else max(probe.due + probe.period_s, now)
            )
            code, body = self.get(probe)
            self.log.append((now, probe.name, code))
            ok = 200 <= code < 400
            if probe is self.readiness:
                self.ready = ok
                if ok and self.ready_at is None:
                    self.ready_at = now
                continue
            probe.failures = 0 if ok else probe.failures + 1
            if ok and probe is self.startup:
                self.started = True
            if probe.failures >= probe.failure_threshold:
                self.killed_at, self.killed_why = now, body

    def run(self, until: Callable[[Kubelet], bool], timeout_s: float) -> None:
        """Probe on schedule until the container is killed or `until` holds."""

        def done() -> bool:
            self.step(time.time())
            return self.killed_at is not None or until(self)

        wait_for(done, "a kill (or the test's condition)", timeout_s)


def _start(tmp_path: Path, scenario: str) -> tuple[DaemonProc, Kubelet, dict[str, Any]]:
    container, pod_config = manifest()
    model = make_model_dir(tmp_path, fp8_kv=False)
    port = free_port()
    forecast = dict(pod_config["forecast"])
    forecast["stall_floor_s"] = forecast["stall_floor_s"] / SPEED
    vllm = pod_config["vllm"]
    cfg = write_config(
        tmp_path / "loadwatch.toml",
        {"state_dir": tmp_path / "state", "events_file": tmp_path / "events.jsonl"},
        log={"path": tmp_path / "vllm.log", "poll_interval_s": 0.05},
        http={"listen": "127.0.0.1:0"},
        gpu={"source": "simulated"},
        forecast=forecast,
        vllm={
            "argv": [
                sys.executable,
                "-m",
                "loadwatch.daemon.sim.vllm_server",
                "--model",
                str(model),
                "--tensor-parallel-size",
                "8",
                "--port",
                str(port),
                "--scenario",
                scenario,
                "--speed",
                str(SPEED),
            ],
            "env": {"PYTHONUNBUFFERED": "1"},
            "restart": vllm["restart"],
            "crash_loop_starts": vllm["crash_loop_starts"],
            "crash_loop_window_s": 900 / SPEED,
            "backoff_initial_s": 5 / SPEED,
            "backoff_max_s": 300 / SPEED,
            "stop_grace_s": vllm["stop_grace_s"] / SPEED,
            "output": vllm["output"],
            "health_url": f"http://127.0.0.1:{port}/health",
        },
    )
    daemon = DaemonProc(cfg, tmp_path)
    daemon.start()
    kubelet = Kubelet(
        daemon.url,
        Probe.of(container, "startupProbe"),
        Probe.of(container, "livenessProbe"),
        Probe.of(container, "readinessProbe"),
    )
    return daemon, kubelet, forecast


def test_a_15_minute_load_is_never_killed_and_is_ready_once_vllm_is(tmp_path: Path) -> None:
    daemon, kubelet, _ = _start(tmp_path, "success")
    t0 = time.time()
    try:
        kubelet.run(lambda k: k.ready_at is not None and time.time() > k.ready_at + 1, 120)
        assert kubelet.killed_at is None, (kubelet.killed_why, kubelet.log[-5:])
        assert kubelet.ready_at is not None, "never ready"
        load_s = (kubelet.ready_at - t0) * SPEED  # as long as the real load would take
        assert load_s > BUDGET_S and load_s > 14 * 60, load_s
        # not ready a single time before vLLM was (the readiness probe never sent traffic early)
        status = daemon.status()
        assert status["phase"] == "ready" and status["session"]["progress"]["shards_done"] == 119
        first_ready = min(
            t for t, name, code in kubelet.log if name == "readinessProbe" and code == 200
        )
        assert first_ready >= status["session"]["ready_at"] - 0.5
        # liveness probed all along the load once startup passed, and never anything but 200
        live = [(at, c) for at, name, c in kubelet.log if name == "livenessProbe"]
        spanned = (live[-1][0] - live[0][0]) / kubelet.liveness.period_s if live else 0.0
        assert len(live) >= 0.8 * spanned and spanned * kubelet.liveness.period_s * SPEED > 600
        assert {c for _, c in live} == {200}
    finally:
        daemon.kill()


def test_a_stalled_load_is_killed_within_the_stall_policy(tmp_path: Path) -> None:
    daemon, kubelet, forecast = _start(tmp_path, "stall")
    try:
        kubelet.run(lambda k: False, 90)
        assert kubelet.killed_at is not None, "a stalled load was never killed"
        status = daemon.status()
        assert status["phase"] == "stalled" and kubelet.ready_at is None
        last = status["session"]["progress"]["last_progress_at"]
        live = kubelet.liveness
        bound = (
            forecast["stall_floor_s"]
            + live.failure_threshold * live.period_s
            + live.period_s
            + TICK_S
            + BUSY_S
        )
        waited = kubelet.killed_at - last
        assert forecast["stall_floor_s"] <= waited <= bound, (waited, bound)
        assert kubelet.killed_why.startswith("not live: stalled for")
        # progress had come in for minutes (scaled) before: the load was not killed then
        assert (last - (kubelet.log[0][0])) * SPEED > 5 * 60
    finally:
        daemon.kill()


def test_a_crash_loop_is_killed(tmp_path: Path) -> None:
    daemon, kubelet, _ = _start(tmp_path, "crash-loop")
    try:
        kubelet.run(lambda k: False, 90)
        assert kubelet.killed_at is not None, "a crash loop was never killed"
        status = daemon.status()
        failed = [s for s in status["sessions"] if s["phase"] == "failed"]
        assert len(failed) + (status["phase"] == "failed") >= 3
        assert "crash looping" in kubelet.killed_why or "gave up" in kubelet.killed_why
    finally:
        daemon.kill()
