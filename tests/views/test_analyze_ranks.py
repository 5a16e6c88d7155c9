"""`loadwatch analyze` names the rank that went silent while its peers moved on: in the text
report and in `--json`'s `processes` list, with each process's first and last line. The logs
are the simulated vLLM's 8-worker Kimi-K2.5-shaped loads (daemon/sim/kimilog.py)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main
from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup

LOG_T0 = 1_795_000_000.0


def kimi_log(tmp_path: Path, silent: tuple[int, int] | None) -> Path:
    text = "".join(startup(random.Random(3), SyntheticClock(LOG_T0), Shape(), silent_worker=silent))
    path = tmp_path / "kimi.log"
    path.write_text(text)
    return path


def analyze(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    main(["analyze", *args])
    return capsys.readouterr().out


def test_the_silent_worker_is_in_the_json_and_the_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = kimi_log(tmp_path, silent=(5, 60))
    lines = log.read_bytes().decode().split("\n")  # (not read_text: a `\r` ends no line)
    doc = json.loads(analyze([str(log), "--json"], capsys))
    procs = doc["sessions"][-1]["processes"]
    assert [p["name"] for p in procs[:2]] == ["APIServer", "EngineCore_DP0"]
    assert sorted(p["name"] for p in procs[2:]) == [f"Worker_TP{i}" for i in range(8)]
    assert [p["name"] for p in procs if p["silent_while_peers_moved_on"]] == ["Worker_TP5"]
    five = next(p for p in procs if p["name"] == "Worker_TP5")
    # its first and last lines the parser read an event from (its k/v scale warnings: its
    # `rank 5 in world size 8 is assigned as ...` line gives none), by number
    prefix = f"(Worker_TP5 pid={five['pid']}) WARNING"
    own = [i + 1 for i, x in enumerate(lines) if x.startswith(prefix)]
    assert (five["first_line"], five["last_line"]) == (own[0], own[-1])
    assert five["shard"] < 60 and five["phase"] == "loading_weights"
    w0 = next(p for p in procs if p["name"] == "Worker_TP0")
    assert (w0["bar_done"], w0["bar_total"]) == (119, 119)
    assert doc["sessions"][-1]["stalls_total"] == 1
    text = analyze([str(log)], capsys)
    assert "silent rank" in text and f"Worker_TP5 pid={five['pid']}: its last line" in text


def test_a_normal_load_flags_nobody(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = kimi_log(tmp_path, silent=None)
    doc = json.loads(analyze([str(log), "--json"], capsys))
    s = doc["sessions"][-1]
    assert s["verdict"]["status"] == "ready" and s["stalls_total"] == 0
    assert len(s["processes"]) == 10
    assert not [p for p in s["processes"] if p["silent_while_peers_moved_on"]]
    assert "silent rank" not in analyze([str(log)], capsys)
