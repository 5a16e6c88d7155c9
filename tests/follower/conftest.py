"""Fixtures of the follower's tests: a log path in a directory of its own, a state directory.
A module that needs another `log` (not created yet, or an empty file) defines its own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def log(tmp_path: Path) -> Path:
    p = tmp_path / "logs" / "vllm.log"
    p.parent.mkdir()
    return p


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"
