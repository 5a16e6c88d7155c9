"""The shipped inhibit rules in a real Alertmanager: one cause pages once.

The alerts a cause raises together are posted to Alertmanager's API as Prometheus would send
them; Alertmanager itself decides which are inhibited. Another instance's crash loop, with no
cause firing there, must still page. The failing starts of prometheus/tests/pages.yml are taken
moment by moment from that promtool test (what the shipped rules fire then, every critical alert
listed), so the rules and the inhibit rules are checked together."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import wait_for

from .common import ALERTS, PROMETHEUS, require
from .promserver import free_port

EXAMPLE = PROMETHEUS / "alertmanager.yml.example"
PAGES = PROMETHEUS / "tests" / "pages.yml"
pytestmark = pytest.mark.prometheus


def test_the_example_passes_amtool() -> None:
    r = subprocess.run(
        [require("amtool"), "check-config", str(EXAMPLE)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and "5 inhibit rules" in r.stdout, r.stdout + r.stderr


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            require("prometheus-alertmanager"),
            f"--config.file={EXAMPLE}",
            f"--storage.path={tmp_path}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip: one instance, loopback only
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def ready_or_ended() -> bool:
        if proc.poll() is not None:
            return True  # (said below)
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
            return r.status == 200

    try:
        wait_for(ready_or_ended, "alertmanager ready", 30, every_s=0.1)
        assert proc.poll() is None
    except AssertionError:
        proc.kill()
        err = proc.stderr.read().decode() if proc.stderr else ""
        pytest.fail(f"alertmanager did not start: {err[-2000:]}")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def post(url: str, alerts: list[dict[str, Any]]) -> None:
    req = urllib.request.Request(
        url + "/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


def states(url: str) -> dict[tuple[str, str], str]:
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as r:
        got = json.loads(r.read())
    return {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"]["state"] for a in got}


def alert(name: str, instance: str, severity: str = "critical") -> dict[str, Any]:
    labels = {"alertname": name, "job": "loadwatch", "instance": instance, "severity": severity}
    return {"labels": labels, "annotations": {"summary": name}}


def test_an_oom_crash_loop_pages_once(alertmanager: str) -> None:
    post(
        alertmanager,
        [
            alert("LoadwatchGpuOutOfMemory", "node1:9321"),
            alert("LoadwatchVllmCrashLooping", "node1:9321"),
            alert("LoadwatchVllmFatal", "node1:9321"),
            alert("LoadwatchVllmNotReady", "node1:9321"),
            alert("LoadwatchOomPredicted", "node1:9321", "warning"),
            alert("LoadwatchVllmCrashLooping", "node2:9321"),  # no cause firing on node2
            alert("LoadwatchVllmFatal", "node3:9321"),
            alert("LoadwatchVllmCrashLooping", "node3:9321"),
        ],
    )
    want = {
        ("LoadwatchGpuOutOfMemory", "node1:9321"): "active",
        ("LoadwatchVllmCrashLooping", "node1:9321"): "suppressed",
        ("LoadwatchVllmFatal", "node1:9321"): "suppressed",
        ("LoadwatchVllmNotReady", "node1:9321"): "suppressed",
        ("LoadwatchOomPredicted", "node1:9321"): "suppressed",
        ("LoadwatchVllmCrashLooping", "node2:9321"): "active",
        ("LoadwatchVllmFatal", "node3:9321"): "active",
        ("LoadwatchVllmCrashLooping", "node3:9321"): "suppressed",
    }

    def as_wanted() -> bool:
        assert states(alertmanager) == want
        return True

    # inhibition is evaluated as the alerts arrive
    wait_for(as_wanted, "the alerts' states as wanted", 15, every_s=0.2)
    got = states(alertmanager)
    paging = [k for k, v in got.items() if v == "active" and k[1] == "node1:9321"]
    assert paging == [("LoadwatchGpuOutOfMemory", "node1:9321")]


def critical_alerts() -> set[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {
        r["alert"]
        for g in groups
        for r in g["rules"]
        if "alert" in r and r["labels"]["severity"] == "critical"
    }


def moments() -> dict[str, dict[str, list[dict[str, str]]]]:
    """pages.yml's scenarios: test name -> eval_time -> the labels of each alert firing then."""
    out: dict[str, dict[str, list[dict[str, str]]]] = {}
    for test in yaml.safe_load(PAGES.read_text())["tests"]:
        at = out.setdefault(test["name"], {})
        checked: dict[str, set[str]] = {}
        for check in test["alert_rule_test"]:
            name, when = check["alertname"], check["eval_time"]
            checked.setdefault(when, set()).add(name)
            firing = at.setdefault(when, [])
            firing += [{"alertname": name, **a["exp_labels"]} for a in check["exp_alerts"]]
        for when, names in checked.items():  # each moment lists every critical alert
            missing = critical_alerts() - names
            assert not missing, f"{test['name']} at {when}: {sorted(missing)} not checked"
    return out


# What each failing start of pages.yml pages with, once, from its first moment to its last.
PAGED_BY = {
    "a failing start on one host, restarted until the supervisor gives up": "LoadwatchLoadFailed",
    "a headless node's start fails while the head serves": "LoadwatchLoadFailed",
    "a node's loadwatch down during the deployment's load": "LoadwatchDown",
}


def test_a_failing_start_pages_once(alertmanager: str) -> None:
    """Each moment's alerts are posted under an instance of their own (`host1:9321 @2m`), so
    every moment is judged alone in one Alertmanager; over all moments of a scenario, one critical
    alert is active (pages) and every other critical one is suppressed."""
    scenarios = moments()
    assert set(scenarios) == set(PAGED_BY)
    posted = []
    for at in scenarios.values():
        for when, firing in at.items():
            posted += [{**labels, "instance": f"{labels['instance']} @{when}"} for labels in firing]
    assert len(posted) >= 10
    post(
        alertmanager,
        [{"labels": labels, "annotations": {"summary": labels["alertname"]}} for labels in posted],
    )

    def pages() -> dict[str, set[str]]:
        """scenario -> the critical alerts active (not inhibited) at any of its moments"""
        with urllib.request.urlopen(alertmanager + "/api/v2/alerts", timeout=5) as r:
            got = json.loads(r.read())
        active = {
            (a["labels"]["alertname"], a["labels"]["instance"])
            for a in got
            if a["status"]["state"] == "active" and a["labels"]["severity"] == "critical"
        }
        assert len(got) == len(posted)
        out: dict[str, set[str]] = {}
        for name, at in scenarios.items():
            out[name] = set()
            for when, firing in at.items():
                out[name] |= {
                    a["alertname"]
                    for a in firing
                    if (a["alertname"], f"{a['instance']} @{when}") in active
                }
        return out

    want = {name: {alert} for name, alert in PAGED_BY.items()}

    def as_wanted() -> bool:
        assert pages() == want
        return True

    # the inhibitor learns the posted alerts as they arrive
    wait_for(as_wanted, "one page per cause", 15, every_s=0.2)
