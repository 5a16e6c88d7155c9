"""Paths and tool look-ups shared by the operations tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
PROMETHEUS = ROOT / "prometheus"
GRAFANA = ROOT / "grafana"
RUNBOOK = ROOT / "docs" / "runbook.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
ALERTS = PROMETHEUS / "alerts.yml"
DASHBOARD = GRAFANA / "loadwatch.json"


def require(tool: str) -> str:
    """The tool's path; a missing tool fails the test (`make test` installs them), never skips."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} not found: run scripts/ensure-tools.sh (make tools) to install it")
    return path
