"""The alert rules and the dashboard's queries in a real Prometheus, scraping a scripted load.

The exposition server plays loadwatch: a load that progresses, then stalls, then recovers, then
runs out of GPU memory, then comes back ready. Prometheus scrapes it every second and evaluates a
copy of alerts.yml whose `for:` windows are cut to 2 s. Every wait is bounded.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from .common import ALERTS, require
from .dashboard import dashboard_queries, resolve
from .exposition import ExpositionServer, Scene, render
from .promserver import PromServer, parse_duration, short_rules_copy
from .test_metric_names import rich_scene

pytestmark = pytest.mark.prometheus

WINDOW_S = 2.0


class ScriptedLoad:
    """The scene the exposition server serves; a ticker moves a progressing load along."""

    def __init__(self, server: ExpositionServer, scene: Scene) -> None:
        self.server = server
        self.scene = scene
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, daemon=True)
        self.publish()

    def publish(self) -> None:
        with self._lock:
            self.scene = dataclasses.replace(self.scene, now_s=time.time())
            self.server.set(render(self.scene))

    def change(self, **fields: Any) -> None:
        with self._lock:
            self.scene = dataclasses.replace(self.scene, **fields)
        self.publish()

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                s = self.scene
                moving = s.phase == "loading_weights" and s.shards_done < s.shards_total
                if moving:
                    now = time.time()
                    self.scene = dataclasses.replace(
                        s,
                        shards_done=s.shards_done + 1,
                        last_progress_s=now,
                        log_lines=s.log_lines + 7,
                    )
            self.publish()

    def __enter__(self) -> ScriptedLoad:
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._ticker.join(timeout=5)


@pytest.fixture
def exposition() -> Iterator[ExpositionServer]:
    with ExpositionServer() as server:
        yield server


def test_short_copy_differs_only_in_for(tmp_path: Path) -> None:
    """Prometheus loads the original and the test copy: same rules, `for:` cut, all healthy."""
    require("prometheus")
    short = short_rules_copy(ALERTS, tmp_path, WINDOW_S)
    with PromServer(tmp_path, targets=[], rule_files=[ALERTS, short]) as prom:
        prom.wait_evaluated(rounds=2)
        groups = prom.rules()
    by_file: dict[str, dict[str, Mapping[str, Any]]] = {}
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
            by_file.setdefault(Path(group["file"]).name, {})[rule["name"]] = rule
    original, copy = by_file[ALERTS.name], by_file[short.name]
    assert list(original) == list(copy) and len(original) >= 14
    for name, rule in original.items():
        short_rule = copy[name]
        assert rule["type"] == short_rule["type"] == "alerting"
        for key in ("query", "labels", "annotations"):
            assert rule[key] == short_rule[key], (name, key)
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        assert short_rule["duration"] == min(rule["duration"], WINDOW_S), name
    assert any(rule["duration"] > WINDOW_S for rule in original.values())


def states(prom: PromServer, alert: str) -> list[str]:
    return [a.state for a in prom.alerts() if a.name == alert]


def test_alerts_follow_a_scripted_load(tmp_path: Path, exposition: ExpositionServer) -> None:
    require("prometheus")
    now = time.time()
    scene = Scene(
        now_s=now,
        started_s=now - 400,
        session_start_s=now - 300,
        shards_done=5,
        shards_total=119,
        last_progress_s=now,
        eta_s=900.0,
        budget_s=1800.0,
        gpus=2,
        warnings={("kv_scale_not_loaded", "benign"): 61},
    )
    short = short_rules_copy(ALERTS, tmp_path, WINDOW_S)
    with (
        ScriptedLoad(exposition, scene) as load,
        PromServer(tmp_path, targets=[exposition.target], rule_files=[short]) as prom,
    ):
        # 1. A load that progresses: nothing pending, nothing firing.
        prom.wait_scraped(scrapes=2)
        prom.wait_evaluated(rounds=3)
        assert prom.alerts() == []
        seen = prom.query("loadwatch_load_shards_done")
        assert len(seen) == 1 and seen[0].labels["instance"] == exposition.target

        # 2. The load stalls: the stall alert goes pending, then fires once for: has passed.
        load.change(phase="stalled", stalled=True, eta_s=None, stalls=1)
        stalled_at = time.monotonic()
        prom.wait_until(lambda: "pending" in states(prom, "LoadwatchLoadStalled"), "pending")
        pending_at = time.monotonic()
        prom.wait_until(lambda: "firing" in states(prom, "LoadwatchLoadStalled"), "firing")
        firing_at = time.monotonic()
        assert firing_at - pending_at >= WINDOW_S - 1.0  # it waited (about) its for: window
        assert firing_at - stalled_at < 15
        (alert,) = [a for a in prom.alerts() if a.name == "LoadwatchLoadStalled"]
        assert alert.labels["severity"] == "critical"
        assert alert.labels["instance"] == exposition.target
        shards = f"(shards {load.scene.shards_done}/{load.scene.shards_total})"
        assert "has made no progress for" in alert.annotations["description"]
        assert shards in alert.annotations["description"]
        assert alert.annotations["runbook_url"].endswith("#loadwatchloadstalled")
        assert {a.name for a in prom.alerts()} == {"LoadwatchLoadStalled"}

        # 3. Progress resumes: the alert resolves.
        load.change(phase="loading_weights", stalled=False, eta_s=600.0)
        prom.wait_until(lambda: states(prom, "LoadwatchLoadStalled") == [], "the stall to resolve")

        # 4. vLLM runs out of GPU memory: the OOM alert fires at once (for: 0).
        load.change(
            phase="failed",
            failure="cuda_oom",
            failures={"cuda_oom": 1},
            vllm_state="backoff",
            vllm_exits={"failed": 1},
        )
        first = prom.wait_until(lambda: states(prom, "LoadwatchGpuOutOfMemory"), "the OOM alert")
        assert first == ["firing"]
        (oom,) = [a for a in prom.alerts() if a.name == "LoadwatchGpuOutOfMemory"]
        assert oom.labels["kind"] == "cuda_oom" and oom.labels["severity"] == "critical"
        assert "LoadwatchLoadFailed" not in {a.name for a in prom.alerts()}

        # 5. A new session comes up ready: the cause is gone, so is the alert.
        now = time.time()
        load.change(
            phase="ready",
            failure=None,
            sessions=2,
            vllm_starts=2,
            vllm_state="running",
            session_start_s=now,
            shards_done=load.scene.shards_total,
            time_to_ready_s=40.0,
        )
        prom.wait_until(lambda: states(prom, "LoadwatchGpuOutOfMemory") == [], "the OOM to clear")
        prom.wait_evaluated(rounds=2)
        assert prom.alerts() == []  # one restart is not a crash loop


def test_every_dashboard_query_returns_data(tmp_path: Path, exposition: ExpositionServer) -> None:
    """Each panel, annotation and variable query runs in Prometheus and returns samples."""
    require("prometheus")
    now = time.time()
    scene = dataclasses.replace(
        rich_scene(), now_s=now, started_s=now - 1000, session_start_s=now - 500
    )
    scene = dataclasses.replace(scene, last_progress_s=now - 10)
    queries = dashboard_queries()
    with (
        ScriptedLoad(exposition, scene) as load,
        PromServer(tmp_path, targets=[exposition.target]) as prom,
    ):
        prom.wait_scraped(scrapes=2)
        load.change(sessions=2, vllm_starts=2)  # a restart, for the session-start annotation
        prom.wait_scraped(scrapes=3)  # rate() and increase() need two samples in their window
        empty, failed = [], []
        for query in queries:
            expr = resolve(query.expr, rate_interval="10s")
            try:
                if not prom.query(expr):
                    empty.append(query.where)
            except Exception as exc:  # collect every failure, then report them all
                failed.append(f"{query.where}: {exc}")
    assert failed == []
    assert empty == []
    assert len(queries) >= 40


def test_harness_reports_a_bad_query_and_stops_cleanly(tmp_path: Path) -> None:
    require("prometheus")
    prom = PromServer(tmp_path, targets=[])
    prom.start()
    try:
        assert prom.query("1 + 1")[0].value == 2.0
        with pytest.raises(Exception, match="bad_data"):
            prom.query("sum(")
        with pytest.raises(TimeoutError, match="never"):
            prom.wait_until(lambda: False, "never", timeout_s=0.3)
    finally:
        prom.stop()
    assert prom.returncode == 0  # SIGTERM: a clean shutdown
    prom.stop()  # twice is fine
    assert prom.returncode == 0
    assert parse_duration("1m") == 60.0
