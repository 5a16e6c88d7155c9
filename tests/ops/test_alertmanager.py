"""The shipped inhibit rules in a real Alertmanager: one out-of-memory crash loop pages once.

The alerts an OOM crash loop raises together are posted to Alertmanager's API as Prometheus would
send them; Alertmanager itself decides which are inhibited. Another instance's crash loop, with no
cause firing there, must still page."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .common import PROMETHEUS, require
from .promserver import free_port

EXAMPLE = PROMETHEUS / "alertmanager.yml.example"
pytestmark = pytest.mark.prometheus


def test_the_example_passes_amtool() -> None:
    r = subprocess.run(
        [require("amtool"), "check-config", str(EXAMPLE)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and "4 inhibit rules" in r.stdout, r.stdout + r.stderr


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
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            err = proc.stderr.read().decode() if proc.stderr else ""
            pytest.fail(f"alertmanager did not start: {err[-2000:]}")
        time.sleep(0.1)
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
    deadline = time.monotonic() + 15  # inhibition is evaluated as the alerts arrive
    while (got := states(alertmanager)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == want
    paging = [k for k, v in got.items() if v == "active" and k[1] == "node1:9321"]
    assert paging == [("LoadwatchGpuOutOfMemory", "node1:9321")]
