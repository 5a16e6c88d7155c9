"""Shared test set-up: deterministic local time (vLLM timestamps are local and yearless)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

os.environ["TZ"] = "UTC"
time.tzset()

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
