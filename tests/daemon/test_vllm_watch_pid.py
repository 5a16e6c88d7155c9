"""Watch mode: the pid a log line names is adopted as vLLM's only when it passes the check.

The daemon is the real one (its log source on a real file, its state, its event log) on an
injected clock; the process watch is `VllmWatch.run`, one pass per call (its sleep stops it). The
log is the start of a real vLLM 0.32 run (tests/fixtures/real-v0.32-llama.log, recorded by
tests/realvllm/capture.py), its `(APIServer pid=21820)` prefix given the pid of a process of this
test: a vLLM stand-in, or a stranger a forged prefix names (a client of vLLM can get such a line
into the log: vLLM prints text its clients choose)."""

from __future__ import annotations

import asyncio
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import Config, GpuConfig, HttpConfig, LogConfig, VllmConfig
from loadwatch.daemon.loop import Daemon, vllm_watch
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.exporters.eventlog import EventLog
from tests.conftest import FIXTURES
from tests.daemon.lookalike import NOBODY, Lookalike, plain, standin

T0 = 1_763_000_000.0
LINES = (FIXTURES / "real-v0.32-llama.log").read_text().splitlines(keepends=True)
# The banner (`version 0.32.0`) to `non-default args`, every line `(APIServer pid=21820)`.
START = LINES[:12]
AGAIN = LINES[11]  # `(APIServer pid=21820) INFO ... non-default args: {...}`: a line with its pid


def lines(text: list[str] | str, pid: int) -> str:
    return "".join(text).replace("pid=21820", f"pid={pid}")


class Watched:
    def __init__(self, tmp: Path, user: int | None = None) -> None:
        self.log = tmp / "vllm.log"
        self.log.write_text("")
        self.out = io.StringIO()
        cfg = Config(
            log=LogConfig(path=self.log),
            http=HttpConfig(port=0),
            gpu=GpuConfig(source="none"),
            vllm=VllmConfig(user=user),
            state_dir=tmp / "state",
        )
        eventlog = EventLog(self.out, None, console=False)
        self.daemon = Daemon(
            cfg, eventlog=eventlog, gpu=NullGpuSource(), clock=lambda: T0, sleep=self._stop
        )
        assert self.daemon.open_log() is not None
        self.watch = vllm_watch(self.daemon)

    async def _stop(self, seconds: float) -> None:
        self.daemon.stop_event.set()

    def write(self, text: str) -> None:
        with self.log.open("a") as f:
            f.write(text)
        d = self.daemon
        assert d.log is not None
        d.take_log(d.log.read())

    def once(self) -> None:
        """One pass of the process watch."""
        self.daemon.stop_event.clear()
        asyncio.run(self.watch.run())

    @property
    def session(self) -> Any:
        snap = self.daemon.state.snapshot(T0)
        assert snap.session is not None
        return snap.session

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.out.getvalue().splitlines()]

    def problems(self) -> list[str]:
        return [e["error"] for e in self.events() if e["event"] == "daemon.problem"]


@pytest.fixture
def procs() -> Iterator[list[Lookalike]]:
    started: list[Lookalike] = []
    yield started
    for p in started:
        p.stop()


def test_a_genuine_vllm_of_the_log_files_owner_is_adopted_and_its_kill_fails_the_session(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    """Killed (SIGKILL: `stop()`), it leaves no shutdown line: the session fails, `vanished`."""
    vllm = standin(tmp_path / "v", "--kv-cache-dtype", "fp8")
    procs.append(vllm)
    w = Watched(tmp_path)
    w.write(lines(START, vllm.pid))
    w.once()
    assert w.session.phase == "starting"
    assert w.daemon.state.session is not None and w.daemon.state.session.argv is not None
    assert w.daemon.state.session.argv[-2:] == ("--kv-cache-dtype", "fp8")
    vllm.stop()
    w.once()
    assert w.session.phase == "failed" and w.session.failure_kind == "vanished"
    assert w.problems() == []
    moves = [e for e in w.events() if e["event"] == "transition.phase"]
    assert moves[-1]["phase_to"] == "failed" and moves[-1]["failure_kind"] == "vanished"
    assert f"vLLM process {vllm.pid} is gone, with no shutdown line" in moves[-1]["reason"]


def test_a_vllm_killed_after_its_shutdown_began_stopped(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    """vLLM's engine core said a SIGTERM came (a stop asked for): its end is no failure."""
    vllm = standin(tmp_path / "v")
    procs.append(vllm)
    w = Watched(tmp_path)
    w.write(lines(START, vllm.pid))
    w.once()
    # `(EngineCore pid=22032) ... [shutdown] EngineCore: trigger received signal=SIGTERM`
    w.write(next(x for x in LINES if "signal=SIGTERM" in x))
    vllm.stop()
    w.once()
    assert w.session.phase == "stopped" and w.session.failure_kind is None


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")
def test_a_vllm_lookalike_of_another_user_is_not_adopted_nor_its_exit_taken_for_vllms(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    foreign = standin(tmp_path / "f", "--kv-cache-dtype", "fp8", uid=NOBODY)
    procs.append(foreign)
    w = Watched(tmp_path)  # the log file is the test's (root's): vLLM is root's
    w.write(lines(START, foreign.pid))
    w.once()
    w.once()
    assert w.daemon.state.session is not None and w.daemon.state.session.argv is None
    problems = w.problems()
    assert len(problems) == 1 and f"pid {foreign.pid}" in problems[0], problems
    assert f"uid {NOBODY}" in problems[0] and str(w.log) in problems[0]
    foreign.stop()
    w.once()
    assert w.session.phase == "starting" and len(w.problems()) == 1


@pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")
def test_with_vllm_user_set_that_users_vllm_is_adopted(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    theirs = standin(tmp_path / "f", "--kv-cache-dtype", "fp8", uid=NOBODY)
    procs.append(theirs)
    w = Watched(tmp_path, user=NOBODY)
    w.write(lines(START, theirs.pid))
    w.once()
    assert w.daemon.state.session is not None and w.daemon.state.session.argv is not None
    theirs.stop()
    w.once()
    assert w.session.phase == "failed" and w.session.failure_kind == "vanished"
    assert w.problems() == []


def test_a_forged_pid_after_vllms_is_refused_once_and_vllm_stays_the_one_watched(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    vllm = standin(tmp_path / "v")
    stranger = plain("sleep", "60")
    procs += [vllm, stranger]
    w = Watched(tmp_path)
    w.write(lines(START, vllm.pid))
    w.once()
    w.write(lines(AGAIN, stranger.pid))  # the forged prefix
    assert w.daemon.state.session is not None
    assert w.daemon.state.session.server_pid == stranger.pid  # (what the log says)
    w.once()
    w.once()
    problems = w.problems()
    assert len(problems) == 1 and f"pid {stranger.pid}" in problems[0], problems
    stranger.stop()
    w.once()
    assert w.session.phase == "starting"  # the stranger's exit is not vLLM's
    vllm.stop()
    w.once()
    assert w.session.phase == "failed"  # vLLM's is, though the log last named the stranger
    assert w.session.failure_kind == "vanished"
