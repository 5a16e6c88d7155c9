"""bench/load_breakdown.py runs and its figures add up: the k/v warning records its regex floor
finds, and those mtail counts (when installed), equal what the generator wrote (it exits 1
otherwise), and its last line holds every figure the closing notes quote."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "load_breakdown.py"


@pytest.mark.slow
def test_load_breakdown_runs_and_its_counts_equal_the_truth() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--lines", "20000"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = dict(kv.split("=") for kv in proc.stdout.strip().splitlines()[-1].split())
    keys = {"records_per_s", "parse_s", "fold_s", "build_events_s", "kv_least_fold_s", "bar_eta_s"}
    if shutil.which("mtail") is not None:
        keys |= {"floors_s", "mtail_s", "budget_3x_s", "ratio_vs_mtail"}
    assert keys <= figures.keys(), proc.stdout
    assert all(float(figures[k]) >= 0 for k in keys)
    assert float(figures["records_per_s"]) > 0
