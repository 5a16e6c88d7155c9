"""What simulated GPUs read as the load's progress: the daemon's live state, not its published
board. Counters go out when a reader asks for them, so the board's progress can be behind; simulated memory that follows it lags the fraction the OOM forecast
fits it against, and a load that will run out of memory showed a projection that fits."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from loadwatch.daemon.app import load_progress
from loadwatch.daemon.config import Config, HttpConfig, LogConfig
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.exporters.eventlog import EventLog
from tests.state.helpers import GIB, T0, bar, model, started


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def test_progress_is_the_live_load_while_the_board_waits_to_be_asked_for(
    tmp_path: Path,
) -> None:
    clock = Clock()
    cfg = Config(
        log=LogConfig(path=None),
        http=HttpConfig(port=0, publish_interval_s=1.0),
        state_dir=tmp_path / "state",
    )
    d = Daemon(
        cfg,
        eventlog=EventLog(io.StringIO(), None, console=False),
        gpu=NullGpuSource(),
        clock=clock,
    )
    assert load_progress(d) == 0.0  # no session yet
    d.apply(started(T0))
    d.apply(model([GIB] * 10))
    d.apply(bar(0, 10))  # (loading: a transition, published at once)
    clock.t += 1.0
    d.apply(bar(1, 10))
    d.publisher.now()
    clock.t += 0.5
    d.apply(bar(5, 10))  # a shard line: no transition, a counter that waits to be asked for
    d.publisher.changed()
    assert d.published is not None
    published = d.published.snapshot(clock()).session
    assert published is not None and published.progress.ratio is not None
    assert published.progress.ratio < 0.25  # the board is behind (the premise)
    assert load_progress(d) == pytest.approx(0.5, abs=0.02)
