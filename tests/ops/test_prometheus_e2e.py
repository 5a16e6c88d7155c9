"""The Prometheus harness itself and the short-`for:` copy of the rules, in a real Prometheus.

The alerts and the dashboard against the real daemon are in test_prometheus_daemon.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from .common import ALERTS, require
from .promserver import PromServer, parse_duration, short_rules_copy

pytestmark = pytest.mark.prometheus

WINDOW_S = 2.0


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
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        assert short_rule["duration"] == min(rule["duration"], WINDOW_S), name
    assert any(rule["duration"] > WINDOW_S for rule in original.values())


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
