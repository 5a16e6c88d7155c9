"""The emit mark beside a serving log: each read is a run with events, noted once (its begin;
`done` at its end at most once a second, not twice a run as before); once reading catches up
the note is exact again. (What a kill between notes leaves is the model-based test's:
test_source_model.py, and the kill/restart tests': every effect exactly once.)"""

from __future__ import annotations

import io
import json
import random
import time
from pathlib import Path

from loadwatch.daemon.config import Config, EventsConfig, GpuConfig, LogConfig
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.exporters.eventlog import EventLog
from tests.helpers import append

# A warning vLLM 0.32 printed while serving (tests/fixtures/real-v0.32-deepseek-kvscales.log).
WARNING = (
    "(APIServer pid=20348) WARNING 11-30 06:35:54 [model.py:1893] Default vLLM sampling "
    "parameters have been overridden by the model's `generation_config.json`: `{'temperature': "
    "0.6, 'top_p': 0.95}`. If this is not intended, please relaunch vLLM instance with "
    "`--generation-config vllm`.\n"
)


def test_reads_of_a_serving_log_note_the_mark_once_a_run(tmp_path: Path) -> None:
    log, events = tmp_path / "vllm.log", tmp_path / "events.jsonl"
    shape = Shape(model="/models/m", shards=4, workers=1, layers=2)
    log.write_text("".join(startup(random.Random(1), SyntheticClock(time.time() - 600), shape)))
    cfg = Config(
        log=LogConfig(path=log, poll_interval_s=0.05),
        gpu=GpuConfig(source="none"),
        events=EventsConfig(stdout="none"),
        state_dir=tmp_path / "state",
        events_file=events,
    )
    eventlog = EventLog(io.StringIO(), events, console=False)
    daemon = Daemon(cfg, eventlog=eventlog, gpu=NullGpuSource())
    source = daemon.open_log()
    assert source is not None
    daemon.take_log(source.read())
    before = source.marks.writes_total
    start = log.stat().st_size
    for _ in range(40):  # a warning a read, each read a run whose events are written
        append(log, WARNING)
        daemon.take_log(source.read())
    logged = [json.loads(x) for x in events.read_text().splitlines()]
    warned = [e for e in logged if e["event"] == "log.log_warning" and e["offset"] >= start]
    assert len(warned) == 40
    assert source.marks.writes_total - before <= 40 + 3  # (a note a run; twice a run: 80)
    daemon.take_log(source.read())  # nothing new: caught up, the note says exactly so
    name = checkpoint_name(log).replace("follower-", "events-", 1)
    note = json.loads((tmp_path / "state" / "follower" / name).read_text())
    size = log.stat().st_size
    st = events.stat()
    assert (note["done"], note["pending"]) == (size, size)
    assert (note["events_file"], note["events_at"]) == (f"{st.st_dev}:{st.st_ino}", st.st_size)
    source.close()
    eventlog.close()
