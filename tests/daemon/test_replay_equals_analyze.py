"""One verdict: the live daemon, fed every golden fixture at full speed in watch mode, ends with
the verdict, phase, warning verdicts and failures that `loadwatch analyze --json` gives."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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
)
from tests.conftest import FIXTURES
from tests.daemon.harness import running

LOGS = sorted(FIXTURES.glob("*.log"))


def _facts(session: dict[str, Any]) -> dict[str, Any]:
    return {
        "verdict": session.get("verdict"),
        "phase": session.get("phase"),
        "warnings": [
            (w["code"], w["count"], w["verdict"], w["reason"]) for w in session.get("warnings", ())
        ],
        "failures": [
            (f["kind"], f["count"], f["fatal"], f["message"]) for f in session.get("failures", ())
        ],
    }


def _analyzed(log: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "analyze", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode in (0, 1, 2), out.stderr
    doc = json.loads(out.stdout)
    if not doc["sessions"]:
        return None, {}
    last = doc["sessions"][-1]
    facts = _facts(last)
    facts["verdict"] = last["verdict"]["status"]
    return facts, last["kv_cache"]


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_live_daemon_ends_with_analyzes_verdicts(log: Path, tmp_path: Path) -> None:
    copy = tmp_path / log.name  # (the name may tell the format)
    shutil.copyfile(log, copy)
    want, want_kv = _analyzed(copy)
    cfg = Config(
        log=LogConfig(path=copy, poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        model=ModelConfig(dir=None),
        # the whole log is read in well under a second, echoes and all: a fatal failure's hold
        # for its echoes (5 s by default, tests/daemon/test_held_failure.py) need not be waited
        forecast=ForecastConfig(failure_hold_s=1.0),
        state_dir=tmp_path / "state",
    )
    size = copy.stat().st_size
    with running(cfg) as d:
        d.wait(lambda: _read_all(d, size), "the whole log read", 60)
        d.daemon.loop_call(d.daemon.publish)  # type: ignore[union-attr]
        if want is None:  # no vLLM start found: none live either
            d.wait(
                lambda: d.metrics()["loadwatch_log_read_bytes_total"] >= size,
                "a board of the whole log served",
                20,
            )
            assert d.status()["session"] is None
            return
        d.wait(lambda: _facts(d.status()["session"] or {}) == want, "analyze's verdicts", 20)
        assert d.status()["kv_cache"] == want_kv


def _read_all(d: Any, size: int) -> bool:
    d.daemon.loop_call(d.daemon.publisher.want)  # (counters are published when asked for)
    log = d.daemon.published.log if d.daemon.published is not None else None
    return log is not None and log.bytes_total >= size
