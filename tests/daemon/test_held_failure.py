"""The daemon's loop while a fatal failure is held for its echoes ([forecast] failure_hold_s).
The supervisor hears of the held failure at once (its verdict on an exit with code 0 waits 2 s,
less than the hold), of a more telling root cause when it is read, and nothing of a failure
decided on records read back (its current run did not log them). A session that a new start
replaces while its failure is held counts that failure (loadwatch_failures_total).

The real daemon's loop on an injected clock; the supervisor is a recorder behind the same calls
(`note_fatal_failure`, `note_ready`). The failures are those of a real vLLM 0.32 start that could
not fit its KV cache (tests/fixtures/real-v0.32-kv-too-small.log)."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path

from loadwatch.daemon.config import Config, ForecastConfig, GpuConfig, HttpConfig, LogConfig
from loadwatch.daemon.loop import Daemon, tell_failing
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.sources.inputs import ProcessEvent, Tick
from loadwatch.daemon.state.loadstate import LoadState, StateConfig
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import Failure
from tests.conftest import FIXTURES

T0 = 1_763_000_000.0


def failures() -> list[Failure]:
    ref = datetime(2026, 12, 1).timestamp()
    data = (FIXTURES / "real-v0.32-kv-too-small.log").read_bytes()
    evs = EventStream(ref_ts=ref).feed_all(split_records(data))
    return [e for e in evs if isinstance(e, Failure)]


class Recorder:
    """The supervisor's side of the daemon's calls."""

    def __init__(self) -> None:
        self.fatal: list[str] = []
        self.ready = 0

    def note_fatal_failure(self, kind: str) -> bool:
        self.fatal.append(kind)
        return True

    def note_ready(self) -> None:
        self.ready += 1


def daemon(tmp_path: Path, now: list[float], out: io.StringIO) -> Daemon:
    cfg = Config(
        log=LogConfig(path=tmp_path / "vllm.log"),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        forecast=ForecastConfig(failure_hold_s=5.0),
        state_dir=tmp_path / "state",
    )
    return Daemon(
        cfg, eventlog=EventLog(out, None, console=False), gpu=NullGpuSource(), clock=lambda: now[0]
    )


def test_a_held_failure_is_told_at_once_and_its_root_cause_when_read(tmp_path: Path) -> None:
    now = [T0]
    out = io.StringIO()
    d = daemon(tmp_path, now, out)
    sup = Recorder()
    d.supervisor = sup
    d.apply(ProcessEvent(kind="started", ts=T0, pid=100, argv=("vllm", "serve", "m")))
    first, root, *echoes = failures()
    assert (first.kind, root.kind) == ("engine_init_failed", "kv_cache_too_small")
    now[0] = T0 + 30
    d.apply(first)
    assert sup.fatal == ["engine_init_failed"]  # told at once: the exit may come first
    now[0] = T0 + 32
    d.apply(root)
    assert sup.fatal == ["engine_init_failed", "kv_cache_too_small"]
    for ev in echoes:
        d.apply(ev)
    d.apply(Tick())
    assert sup.fatal == ["engine_init_failed", "kv_cache_too_small"]
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert not [x for x in lines if x["event"] == "transition.failure"]  # held
    now[0] = T0 + 35
    d.apply(Tick())
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    (said,) = [x for x in lines if x["event"] == "transition.failure"]
    assert said["failure_kind"] == "kv_cache_too_small" and "replay" not in said
    assert sup.fatal[-1] == "kv_cache_too_small"


def test_a_failure_held_from_records_read_back_is_not_told() -> None:
    sup = Recorder()
    before = LoadState(config=StateConfig(failure_hold_s=5.0))
    after = before.apply(failures()[0], T0, replay=True)
    assert after.session is not None and after.session.failing is not None
    tell_failing(sup, before, after)
    assert sup.fatal == []
    live = before.apply(failures()[0], T0)
    tell_failing(sup, before, live)
    assert sup.fatal == ["engine_init_failed"]


def test_a_session_replaced_while_its_failure_is_held_counts_it(tmp_path: Path) -> None:
    now = [T0]
    d = daemon(tmp_path, now, io.StringIO())
    d.apply(ProcessEvent(kind="started", ts=T0, pid=100, argv=("vllm", "serve", "m")))
    first, root, *_ = failures()
    now[0] = T0 + 30
    d.apply(first)
    d.apply(root)
    now[0] = T0 + 31  # started again before the hold is over (no exit was seen)
    d.apply(ProcessEvent(kind="started", ts=T0 + 31, pid=101, argv=("vllm", "serve", "m")))
    assert d.state.past[-1].failure_kind == "kv_cache_too_small"
    assert d.state.lifetime.failures == {"kv_cache_too_small": 1}
