"""vLLM's stamps in another zone, or off by 90 s, against the daemon: nothing changes.

vLLM stamps its lines in its own local time with no zone (in a container on UTC, on a host on
UTC+3 or UTC-5, or with its clock 90 s off). The daemon here is the real one (its log source on
real files, its state, its event log) on an injected clock; vLLM's log is the simulated
Kimi-K2.5 start-up (daemon/sim/kimilog.py), one shard every 2 s, stamped `skew` seconds away
from the daemon's clock, and read as it is written, with the daemon's 1 s ticks in between.
Every skew must give the phases, stalls and durations that stamps in the daemon's own zone give:
never stalled while a shard comes every 2 s, a stall within its threshold when the load stops,
and a restart in the middle of the load (a clean stop, or a kill) that resumes without a stall.
"""

from __future__ import annotations

import io
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import Config, ForecastConfig, GpuConfig, HttpConfig, LogConfig
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.sim.kimilog import Shape, startup
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.sources.inputs import Tick
from loadwatch.exporters.eventlog import EventLog
from tests.helpers import append

SKEWS = (3 * 3600.0, -5 * 3600.0, 90.0, -90.0)  # vLLM on UTC+3 / UTC-5 against a UTC daemon
SHAPE = Shape(model="/models/m", shards=20, workers=2, layers=4, shard_s=(2.0, 2.0))
STALL_FLOOR_S = 30.0
T0 = float(int(time.time())) + 0.25  # the daemon's clock starts here (mid-second)


class VllmClock:
    """The script's clock: the daemon's time, stamped `skew` seconds away as vLLM would."""

    def __init__(self, t: float, skew: float) -> None:
        self.t, self.skew = t, skew

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def shown(self, seconds: float) -> float:
        return seconds

    def stamp(self) -> str:
        return time.strftime("%m-%d %H:%M:%S", time.localtime(self.t + self.skew))


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Run:
    """One daemon after another on the same state directory and log."""

    tmp: Path
    clock: Clock = field(default_factory=Clock)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    daemon: Daemon | None = None
    out: io.StringIO | None = None
    ticked: float = T0

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)

    @property
    def log(self) -> Path:
        return self.tmp / "vllm.log"

    def start(self) -> Daemon:
        cfg = Config(
            log=LogConfig(path=self.log, poll_interval_s=0.05),
            http=HttpConfig(port=0),
            gpu=GpuConfig(source="none"),
            forecast=ForecastConfig(stall_floor_s=STALL_FLOOR_S),
            state_dir=self.tmp / "state",
            events_file=self.tmp / "events.jsonl",
        )
        self.out = io.StringIO()
        eventlog = EventLog(self.out, cfg.events_file, console=False)
        self.daemon = Daemon(cfg, eventlog=eventlog, gpu=NullGpuSource(), clock=self.clock)
        assert self.daemon.open_log() is not None
        self.ticked = self.clock.now
        return self.daemon

    def stop(self, *, kill: bool) -> None:
        d = self.daemon
        assert d is not None and d.log is not None
        self._collect()
        if kill:  # no last checkpoint: the next daemon resumes from the last one saved
            d.log.input.close(checkpoint=False)
            d.log.marks.close()
        else:
            d.log.close()
        d.eventlog.close()
        self.daemon = None

    def until(self, t: float) -> None:
        """The daemon's clock moves on to `t`, its tick running every second on the way."""
        d = self.daemon
        assert d is not None
        while self.ticked + 1.0 <= t:
            self.ticked += 1.0
            self.clock.now = self.ticked
            d.apply(Tick())
        self.clock.now = t

    def read(self) -> None:
        d = self.daemon
        assert d is not None and d.log is not None
        d.take_log(d.log.read())
        while d.log.backlog:
            d.take_log(d.log.read())

    def _collect(self) -> None:

        assert self.out is not None
        for line in self.out.getvalue().splitlines():
            e = json.loads(line)
            if e["event"].startswith("transition."):
                self.transitions.append(e)

    def session(self) -> Any:
        d = self.daemon
        assert d is not None
        snap = d.state.snapshot(self.clock.now)
        assert snap.session is not None
        return snap.session


def _script(skew: float, stall_at: int | None = None) -> Iterator[tuple[float, str]]:
    """(the daemon's time when vLLM wrote it, the line)."""
    clock = VllmClock(T0 + 1, skew)
    for line in startup(random.Random(7), clock, SHAPE, stall_at_shard=stall_at):
        yield clock.t, line


def _feed(run: Run, lines: Iterator[tuple[float, str]], stop_at: float | None = None) -> None:
    """vLLM writes each line at its time; the daemon reads it at once."""
    for t, line in lines:
        run.until(t)
        append(run.log, line)
        run.read()
        if stop_at is not None and t >= stop_at:
            return


def _facts(transitions: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (e["event"], e.get("phase_from"), e.get("phase_to"), e.get("at"), e.get("duration_s"))
        for e in transitions
        if not e.get("replay")
    ]


def _whole(tmp: Path, skew: float, stall_at: int | None = None) -> Run:
    run = Run(tmp)
    run.start()
    _feed(run, _script(skew, stall_at))
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    return run


@pytest.mark.parametrize("skew", SKEWS)
def test_stamps_hours_or_seconds_away_change_no_phase_stall_or_duration(
    tmp_path: Path, skew: float
) -> None:
    ref = _whole(tmp_path / "ref", 0.0)
    run = _whole(tmp_path / "skewed", skew)
    got, want = run.session(), ref.session()
    run.stop(kill=False)
    ref.stop(kill=False)
    assert not [e for e in run.transitions if "stall" in e["event"]], "stalled while loading"
    assert _facts(run.transitions) == _facts(ref.transitions)
    assert got.phase == want.phase == "ready"
    assert got.time_to_ready_s == want.time_to_ready_s
    assert got.started_at == want.started_at


@pytest.mark.parametrize("skew", SKEWS)
def test_a_load_that_stops_stalls_within_its_threshold(tmp_path: Path, skew: float) -> None:
    stops = 8  # the process hangs after this shard
    ref = _whole(tmp_path / "ref", 0.0, stall_at=stops)
    run = _whole(tmp_path / "skewed", skew, stall_at=stops)
    run.stop(kill=False)
    ref.stop(kill=False)
    raised = [e for e in run.transitions if e["event"] == "transition.stall_raised"]
    assert len(raised) == 1, raised
    (stall,) = raised
    assert stall["at"] - stall["since"] <= stall["threshold_s"] + 1.0  # the next tick
    assert stall["threshold_s"] <= STALL_FLOOR_S
    assert _facts(run.transitions) == _facts(ref.transitions)


@pytest.mark.parametrize("kill", [False, True], ids=["stop", "kill"])
@pytest.mark.parametrize("skew", SKEWS)
def test_a_restart_in_the_middle_of_the_load_resumes_without_a_stall(
    tmp_path: Path, skew: float, kill: bool
) -> None:
    ref = _whole(tmp_path / "ref", 0.0)
    run = Run(tmp_path / "skewed")
    run.start()
    lines = _script(skew)
    _feed(run, lines, stop_at=T0 + 30)  # about ten shards in
    run.stop(kill=kill)
    # down for 5 s while vLLM goes on, then a new daemon catches up and follows
    down_until = run.clock.now + 5.0
    backlog = []
    for t, line in lines:
        backlog.append((t, line))
        if t >= down_until:
            break
    for _, line in backlog[:-1]:
        append(run.log, line)
    run.clock.now = down_until
    run.start()
    run.read()  # the catch-up: the session rebuilt from its start, then what came meanwhile
    assert run.session().phase == "loading_weights"
    _feed(run, iter([backlog[-1], *lines]))
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    got, want = run.session(), ref.session()
    run.stop(kill=False)
    ref.stop(kill=False)
    assert not [e for e in run.transitions if "stall" in e["event"]], "a false stall"
    assert got.phase == want.phase == "ready"
    # the rebuilt session began when the first daemon saw it begin (stamps are whole seconds)
    assert abs(got.started_at - want.started_at) <= 1.0
    assert got.time_to_ready_s is not None and want.time_to_ready_s is not None
    assert abs(got.time_to_ready_s - want.time_to_ready_s) <= 1.0
    phases = [e["phase_to"] for e in run.transitions if e["event"] == "transition.phase"]
    assert phases[-1] == "ready"


@pytest.mark.parametrize("skew", SKEWS)
def test_a_first_start_on_a_backlog_places_it_by_the_files_time(
    tmp_path: Path, skew: float
) -> None:
    """No checkpoint: the offset between vLLM's stamps and the daemon's clock is the log's
    modification time against its last stamp."""
    ref = _whole(tmp_path / "ref", 0.0)
    run = Run(tmp_path / "skewed")
    lines = list(_script(skew))
    half = len(lines) // 2
    for _, line in lines[:half]:
        append(run.log, line)
    written = lines[half - 1][0]
    os.utime(run.log, (written, written))  # when vLLM wrote its last line, on the host's clock
    run.clock.now = written + 0.5
    run.start()
    run.read()
    s = run.session()
    assert s.phase == "loading_weights"
    assert abs(s.started_at - ref.session().started_at) <= 1.0
    _feed(run, iter(lines[half:]))
    run.until(run.clock.now + 3 * STALL_FLOOR_S)
    got, want = run.session(), ref.session()
    run.stop(kill=False)
    ref.stop(kill=False)
    assert not [e for e in run.transitions if "stall" in e["event"]]
    assert got.time_to_ready_s is not None and want.time_to_ready_s is not None
    assert abs(got.time_to_ready_s - want.time_to_ready_s) <= 1.0
