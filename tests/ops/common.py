"""Paths and tool look-ups shared by the operations tests."""

from __future__ import annotations

import shutil
import subprocess
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


def promtool_says(exposition: str | bytes) -> str:
    """What `promtool check metrics` says of an exposition (nothing: it passes)."""
    result = subprocess.run(
        [require("promtool"), "check", "metrics"],
        input=exposition if isinstance(exposition, bytes) else exposition.encode(),
        capture_output=True,
        check=False,
        timeout=60,
    )
    said = (result.stdout + result.stderr).decode(errors="replace").strip()
    return said or ("" if result.returncode == 0 else f"exit {result.returncode}")
