from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loadwatch.parsers import event_from_dict
from tests.conftest import FIXTURES
from tests.parsers.golden import events_of, golden_path, scanned, to_jsonl

LOGS = sorted(FIXTURES.glob("*.log"))


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_golden_events(log: Path) -> None:
    got = to_jsonl(events_of(log.read_bytes()))
    golden = golden_path(log)
    if os.environ.get("LOADWATCH_REGEN_GOLDEN") == "1":
        golden.write_text(got, encoding="utf-8")
    assert golden.exists(), f"no golden file for {log.name}; regenerate and review it"
    assert got == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
@pytest.mark.parametrize("chunk", [7, 300, 65536])
def test_chunk_scanner_matches_record_by_record(log: Path, chunk: int) -> None:
    data = log.read_bytes()
    assert scanned(data, chunk) == events_of(data)


@pytest.mark.parametrize("log", LOGS, ids=[p.name for p in LOGS])
def test_golden_round_trips_through_dicts(log: Path) -> None:
    for line in golden_path(log).read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        assert event_from_dict(data).to_dict() == data
