"""The emit mark, exactly: which re-read records are replayed, written again marked, or live.

A first daemon reads part of a load and stops cleanly (its checkpoint and mark at R). More lines
are appended, and the mark is set as a daemon killed mid-write would leave it: events written up
to D, a run [D, P) being written. A second daemon must rebuild the session from its start
without writing anything before D, write the events in [D, P) marked as replays, and those
after P as usual; everything it read in one chunk, so the chunk is split where replaying ends.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from loadwatch.daemon.checkpoint import checkpoint_name
from loadwatch.daemon.config import Config, ForecastConfig, GpuConfig, HttpConfig, LogConfig
from loadwatch.daemon.kimilog import Shape, SyntheticClock, startup
from tests.daemon.harness import running


def _lines() -> list[str]:
    shape = Shape(model="/models/m", shards=10, workers=2, layers=4)
    return list(startup(random.Random(4), SyntheticClock(time.time() - 600), shape))


def _offsets(lines: list[str]) -> list[int]:
    out, pos = [], 0
    for line in lines:
        out.append(pos)
        pos += len(line.encode())
    return out


def test_replay_again_and_live_split_at_the_mark(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    cfg = Config(
        log=LogConfig(path=log, poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        forecast=ForecastConfig(stall_floor_s=86400),
        state_dir=tmp_path / "state",
    )
    lines = _lines()
    starts = _offsets(lines)
    bars = [i for i, line in enumerate(lines) if "checkpoint shards:" in line]
    first, done, pending = bars[3], bars[6], bars[8]  # line indexes: R, D and P fall after these
    log.write_text("".join(lines[: first + 1]))
    with running(cfg) as d:
        d.wait(lambda: d.status()["session"]["progress"]["shards_done"] == 3, "three shards")
    log.write_text("".join(lines))
    end = len(log.read_bytes())
    r, dd, p = (starts[i + 1] for i in (first, done, pending))
    state = tmp_path / "state" / "follower"
    cp = json.loads((state / checkpoint_name(log)).read_text())
    assert cp["offset"] == r
    mark = state / checkpoint_name(log).replace("follower-", "events-")
    mark.write_text(json.dumps({"file_id": cp["file_id"], "done": dd, "pending": p}))

    with running(cfg) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        events = d.events()
        status = d.status()
    logged = [e for e in events if e["event"].startswith("log.")]
    assert logged and all(e["offset"] >= dd for e in logged), "nothing before D written again"
    again = {e["offset"] for e in logged if e.get("replay")}
    live = {e["offset"] for e in logged if not e.get("replay")}
    assert again and all(dd <= o < p for o in again)
    assert live and all(p <= o < end for o in live)
    at = [starts[i] + lines[i].index("\r") + 1 for i in bars]  # a bar's record follows its `\r`
    assert {o for o in at if dd <= o < p} <= again and len([o for o in at if dd <= o < p]) == 2
    assert {o for o in at if o >= p} <= live
    # the session was rebuilt from its start: every shard counted once
    assert status["session"]["progress"]["shards_done"] == 10
    assert status["sessions_total"] == 1
    phases = [e for e in events if e["event"] == "transition.phase"]
    assert all(e.get("replay") for e in phases if e["phase_to"] == "loading_weights")
