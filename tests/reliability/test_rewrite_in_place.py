"""A log rewritten in place, longer than before, with the same first bytes.

Real vLLM starts begin with the same bytes: tests/fixtures/real-v0.32-llama.log and
real-v0.32-deepseek-kvscales.log (two real vLLM 0.32 runs) share their first 697 bytes, the
import-time warnings. The daemon reads the first run's log; then the second run's log is
written over it from byte 0 (what `> vllm.log` by a restart script leaves once vLLM has written
more than before, when the daemon did not see the file empty). Before, the daemon went on at
its old offset: the second run's first 20 KB, its start among them, were never read, and no
truncation was counted. Now the bytes just before the resume point are part of the file's
identity: live, the rewrite is counted as a truncation, said in one line, and the file read from
where it differs; across a restart, the checkpoint's tail does not match, one `daemon.problem`
line says the file was rewritten in place, and it is read from its start, its events new.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from loadwatch.daemon.tools.analyze import LogReader
from tests.helpers import records
from tests.reliability.proc import REPO, DaemonProc, wait_for

FIXTURES = REPO / "tests" / "fixtures"
FIRST = (FIXTURES / "real-v0.32-llama.log").read_bytes()
SECOND = (FIXTURES / "real-v0.32-deepseek-kvscales.log").read_bytes()


def _metric(d: DaemonProc, name: str) -> float:
    for line in d.get("/metrics")[1].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0


def _daemon(tmp_path: Path, log: Path, name: str) -> DaemonProc:
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0", "--events-file", str(tmp_path / f"{name}.events.jsonl")],
        tmp_path / f"{name}.jsonl",
    )  # fmt: skip
    d.wait_listening()
    return d


def _kv_warnings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "log.kv_scale_warning"]


def _expected_kv(tmp_path: Path) -> int:
    alone = tmp_path / "second-alone.log"
    alone.write_bytes(SECOND)
    reader = LogReader(alone)
    try:
        return sum(1 for e in reader.events() if e.type == "kv_scale_warning")
    finally:
        reader.close()


def _events(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (tmp_path / f"{name}.events.jsonl").read_text().splitlines()]


def _overwrite(log: Path) -> None:
    fd = os.open(log, os.O_WRONLY)
    try:
        os.pwrite(fd, SECOND, 0)  # longer than FIRST: never smaller than the daemon's place
    finally:
        os.close(fd)


def test_rewritten_while_followed(tmp_path: Path) -> None:
    assert SECOND[:697] == FIRST[:697] and len(SECOND) > len(FIRST)
    log = tmp_path / "vllm.log"
    log.write_bytes(FIRST)
    d = _daemon(tmp_path, log, "live")
    try:
        wait_for(lambda: _metric(d, "loadwatch_log_read_bytes_total") == len(FIRST), "read")
        assert d.status()["sessions_total"] == 1
        _overwrite(log)
        wait_for(lambda: d.status()["sessions_total"] == 2, "the second run's start read", 10)
        assert _metric(d, "loadwatch_log_truncations_total") == 1
    finally:
        assert d.stop() == 0
    events = _events(tmp_path, "live")
    assert len(_kv_warnings(records(events))) == _expected_kv(tmp_path)
    said = [e for e in events if e.get("event") == "daemon.warning"]
    assert len(said) == 1 and "rewritten in place" in said[0]["warning"]


def test_rewritten_while_the_daemon_was_down(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(FIRST)
    first = _daemon(tmp_path, log, "first")
    try:
        wait_for(lambda: _metric(first, "loadwatch_log_read_bytes_total") == len(FIRST), "read")
    finally:
        assert first.stop() == 0
    _overwrite(log)
    second = _daemon(tmp_path, log, "second")
    try:
        wait_for(lambda: _metric(second, "loadwatch_log_read_bytes_total") == len(SECOND), "read")
    finally:
        assert second.stop() == 0
    events = _events(tmp_path, "second")
    problems = [e["error"] for e in events if e.get("event") == "daemon.problem"]
    assert len(problems) == 1 and "rewritten in place" in problems[0], problems
    kv = _kv_warnings(records(events))
    assert len(kv) == _expected_kv(tmp_path) and not any(e.get("replay") for e in kv)
