"""A restart whose checkpoint, or checkpoint and emit mark, are corrupt.

The real daemon reads tests/fixtures/real-v0.32-llama.log (a real vLLM 0.32 run) to its end and
stops; its state files are then overwritten with garbage and it starts again.
- Both corrupt: nothing tells what of the log had its events written. One `daemon.problem` line
  names both files and the choice: the log is read from its start and every event of it is
  written again, marked `"replay": true` (none lost, the repeats told apart); a line vLLM
  writes afterwards is written as new. Before, all of it was written again as new, without a word.
- The checkpoint alone corrupt: one line too; the emit mark says what was written, so nothing is
  written twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from tests.reliability.proc import REPO, DaemonProc, wait_for

FIXTURE = REPO / "tests" / "fixtures" / "real-v0.32-llama.log"
# a later line of a real vLLM 0.32 run (real-v0.32-deepseek-kvscales.log, line 50)
LATER = (
    (REPO / "tests" / "fixtures" / "real-v0.32-deepseek-kvscales.log").read_bytes().split(b"\n")[49]
)


def _read_bytes(d: DaemonProc) -> float:
    for line in d.get("/metrics")[1].decode().splitlines():
        if line.startswith("loadwatch_log_read_bytes_total "):
            return float(line.split()[1])
    return -1.0


def _run(tmp_path: Path, log: Path, name: str) -> DaemonProc:
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0", "--events-file", str(tmp_path / f"{name}.events.jsonl")],
        tmp_path / f"{name}.jsonl",
    )  # fmt: skip
    d.wait_listening()
    size = log.stat().st_size
    wait_for(lambda: _read_bytes(d) == size, f"{name}: the log read", 15)
    return d


def _events(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    path = tmp_path / f"{name}.events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _logged(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if str(e.get("event", "")).startswith("log.")]


@pytest.mark.parametrize("corrupt", ["both", "checkpoint"])
def test_restart_with_corrupt_state(tmp_path: Path, corrupt: str) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(FIXTURE.read_bytes())
    first = _run(tmp_path, log, "first")
    assert first.stop() == 0
    before = _logged(_events(tmp_path, "first"))
    assert len(before) > 20
    state = tmp_path / "st" / "follower"
    cp = state / checkpoint_name(log)
    mark = state / checkpoint_name(log).replace("follower-", "events-", 1)
    assert cp.exists() and mark.exists()
    cp.write_bytes(b'{"version": 1, "file_id": \x00garbage')
    if corrupt == "both":
        mark.write_bytes(b"\xff\xfe not json")
    second = _run(tmp_path, log, "second")
    try:
        wait_for(lambda: second.status()["session"] is not None, "the session rebuilt")
        with log.open("ab") as f:
            f.write(LATER + b"\n")
        size = log.stat().st_size
        wait_for(lambda: _read_bytes(second) == size, "the later line read")
    finally:
        assert second.stop() == 0
    events = _events(tmp_path, "second")
    problems = [e["error"] for e in events if e.get("event") == "daemon.problem"]
    assert len(problems) == 1, problems
    assert cp.name in problems[0]
    logged = _logged(events)
    later = [e for e in logged if "k_scale" in str(e)]
    assert len(later) == 1 and "replay" not in later[0]  # what vLLM writes afterwards: new
    again = [e for e in logged if e not in later]
    if corrupt == "both":
        assert mark.name in problems[0] and "replay" in problems[0]
        assert len(again) == len(before) and all(e.get("replay") is True for e in again)
        assert [e["offset"] for e in again] == [e["offset"] for e in before]
    else:
        assert again == []  # the mark said all of it was written
