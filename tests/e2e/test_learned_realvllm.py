"""Durations learned from earlier starts, on real vLLM 0.32 on the CPU, in watch mode.

Three starts of one tiny model, each under a daemon started afresh on the same state directory
(the history is what carries from one to the next):

1. the first start is learned (`starts.json` gets its steps);
2. the second start: the ETA to ready read at its first log line is the first start's learned
   time (printed beside the time it really took, the test's own `/health` 200), and, with the
   learned thresholds in force, it raises no stall;
3. the third start is stopped (SIGSTOP, every process of vLLM's group) right after its
   weights: the stall is raised at the learned threshold of the step it is held in, names
   that step, and clears when the processes go on (SIGCONT) and the start gets ready.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
    ModelConfig,
    VllmConfig,
)
from loadwatch.daemon.history import FILE_NAME
from loadwatch.daemon.supervise.orphans import process_tree_pids
from tests.daemon.harness import running
from tests.e2e.test_watch_readiness import build_model
from tests.helpers import wait_for
from tests.realvllm.vllmproc import ServerSpec, VllmServer, free_port, group_members

pytestmark = [pytest.mark.realvllm, pytest.mark.slow, pytest.mark.timeout(900)]
START_S = 300.0  # a vLLM start to /health 200 (about 45 s alone; more on a busy machine)
# The floor under a learned threshold: the steps after the weights take a second or two here,
# so 1.5 times that (what one past start allows) would be under the default's 120 s floor.
STALL_FLOOR_S = 15.0
STALL_K = 5.0  # (the default stall_factor)
POST_LOAD = {"weight_postprocess", "torch_compile", "autotune", "kv_cache", "graph_capture"}
POST_LOAD |= {"engine_ready", "api_server"}
WEIGHTS_END = b"Loading weights took"  # vLLM's default_loader.py, after the last shard


def _config(work: Path, log: Path) -> Config:
    return Config(
        log=LogConfig(path=log, poll_interval_s=0.1),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        model=ModelConfig(dir=None),
        vllm=VllmConfig(health_interval_s=1.0),
        forecast=ForecastConfig(stall_factor=STALL_K, stall_floor_s=STALL_FLOOR_S),
        state_dir=work / "state",
    )


@dataclass
class Start:
    """One start as this test saw it: the daemon's status at the first line, and when vLLM
    answered /health 200 (the test's own probe, every 0.1 s)."""

    first: dict[str, Any]  # /status's session when it first showed one
    seen_at: float  # when the test read it
    ready_at: float
    events: list[dict[str, Any]]
    stall: dict[str, Any] | None = None  # the stall of a start held after its weights
    stopped_at: float | None = None

    @property
    def first_line_at(self) -> float:
        return float(self.first["timeline"][0]["started_at"])

    @property
    def took_s(self) -> float:
        return self.ready_at - self.first_line_at

    @property
    def eta(self) -> dict[str, Any] | None:
        return self.first["startup_eta"]


def _stop_all(pgid: int, sig: signal.Signals) -> list[int]:
    """Send `sig` to every process of vLLM's group and of its tree (API server, engine core,
    worker); the pids signalled."""
    pids = sorted({p for p, _ in group_members(pgid)} | process_tree_pids(pgid))
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def _play(model: Path, work: Path, n: int, hold_after_weights: bool) -> Start:
    log = work / f"start{n}.log"
    # vLLM's IPC socket paths live in TMPDIR and must stay under 107 bytes: a short work dir
    vwork = Path(tempfile.mkdtemp(prefix="lw-eta-"))
    server = VllmServer(ServerSpec(model=model, work_dir=vwork, port=free_port()), log)
    try:
        with running(_config(work, log)) as d:
            server.start(rss_interval_s=None)
            first: dict[str, Any] = {}

            def session_shown() -> bool:
                s = d.status()["session"]
                if s is not None:
                    first.update(s)
                return s is not None

            wait_for(session_shown, "the first line's session", START_S, every_s=0.02)
            seen_at = time.time()
            stall = stopped_at = None
            if hold_after_weights:
                wait_for(lambda: WEIGHTS_END in log.read_bytes(), "the weights", START_S, 0.02)
                pgid = server.pid
                assert pgid is not None
                stopped_at = time.time()
                pids = _stop_all(pgid, signal.SIGSTOP)
                try:
                    wait_for(
                        lambda: d.status()["session"]["stall"]["active"],
                        "a stall",
                        START_S,  # (the test below holds it to the threshold)
                        every_s=0.1,
                    )
                    stall = d.status()["session"]
                finally:
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGCONT)
                        except ProcessLookupError:
                            pass
            wait_for(lambda: server.health_status() == 200, "/health 200", START_S, every_s=0.1)
            ready_at = time.time()
            d.wait(lambda: d.status()["phase"] == "ready", "ready", 30)
            history = d.status()["session"]  # the start as the daemon saw it to ready
            d.wait(lambda: _learned(work) >= n, f"start {n} in the history", 30)
            events = d.events()
    finally:
        server.stop(grace_s=20)
        shutil.rmtree(vwork, ignore_errors=True)
    start = Start(first, seen_at, ready_at, events, stall, stopped_at)
    print(
        f"start {n}: timeline {[(x['phase'], round(x['duration_s'], 1)) for x in history['timeline']]}"
    )
    return start


def _learned(work: Path) -> int:
    path = work / "state" / FILE_NAME
    return len(json.loads(path.read_text())["starts"]) if path.exists() else 0


def _history(work: Path) -> list[dict[str, Any]]:
    return list(json.loads((work / "state" / FILE_NAME).read_text())["starts"])


@pytest.fixture(scope="module")
def starts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Start], Path]]:
    model = build_model(tmp_path_factory.mktemp("models") / "llama", "--arch", "llama")
    work = tmp_path_factory.mktemp("learned")
    played = [_play(model, work, 1, False), _play(model, work, 2, False)]
    played.append(_play(model, work, 3, True))
    yield played, work


def _stalls(start: Start) -> list[dict[str, Any]]:
    return [e for e in start.events if e.get("event") == "transition.stall_raised"]


def test_the_second_starts_eta_from_its_first_line_is_the_first_starts_time_to_ready(
    starts: tuple[list[Start], Path],
) -> None:
    played, work = starts
    first, second, _third = played
    assert first.eta is None  # nothing learned yet
    assert first.first["startup_eta_reason"]
    eta = second.eta
    assert eta is not None, second.first
    # taken at the first line: the first step (configuration) is under way, nothing ended yet
    assert eta["step"] == "config" and eta["past_starts"] == 1, eta
    assert [x["phase"] for x in second.first["timeline"]] == ["config"]
    assert eta["phase_overdue_s"] == 0.0  # config, seconds old: within what it took before
    assert second.seen_at - second.first_line_at < 1.0
    predicted = eta["ready_at"] - second.first_line_at
    error = (predicted - second.took_s) / second.took_s
    # the history's own figure: the first start's time from its first line to ready. How close
    # that comes to the second start's time is the machine's, not the product's: on a fresh
    # clone's run the same two starts took 19.3 s and 15.5 s (other test processes, a cold
    # cache), so the error is printed, not asserted
    learned = _history(work)[0]["ready_s"]
    assert predicted == pytest.approx(learned, abs=1.0)
    print(
        f"ETA at the first line: predicted {predicted:.1f} s to ready, took {second.took_s:.1f} s "
        f"({100 * error:+.1f}%); range {eta['remaining_low_s']:.1f}-{eta['remaining_high_s']:.1f} s"
        f" (the first start took {first.took_s:.1f} s)"
    )
    assert eta["remaining_low_s"] < eta["remaining_s"] < eta["remaining_high_s"]


def test_a_normal_start_under_learned_thresholds_raises_no_stall(
    starts: tuple[list[Start], Path],
) -> None:
    played, _ = starts
    first, second, _third = played
    assert _stalls(first) == [] and _stalls(second) == []
    assert second.first["stall"]["stalls_total"] == 0


def test_a_start_held_after_its_weights_is_stalled_at_the_learned_threshold(
    starts: tuple[list[Start], Path],
) -> None:
    played, work = starts
    third = played[2]
    s = third.stall
    assert s is not None and third.stopped_at is not None
    stall = s["stall"]
    # the step it is held in: the one after the weights, named as the last starts name it (the
    # log may not have named it yet: then it is the phase that came next in the last start)
    phase = stall["reason"].split(" has run ", 1)[0]
    assert phase in POST_LOAD, stall["reason"]
    assert s["timeline"][-1]["phase"] in (phase, "unknown"), s["timeline"]
    learned = [{p: t for p, t in e["steps"]} for e in _history(work)[:2]]
    took = [e[phase] for e in learned]
    spread = max(max(took) - min(took), 0.1 * statistics.median(took))
    threshold = max(max(took) + STALL_K * spread, STALL_FLOOR_S)
    assert stall["threshold_s"] == pytest.approx(threshold), (stall, took)
    assert "the last 2 starts took" in stall["reason"], stall["reason"]
    # the step is also past the slowest earlier start's time in it (the warning's figure), once
    # the log has named it; a step not named yet is compared with nothing
    eta = s["startup_eta"]
    assert eta["step"] == s["timeline"][-1]["phase"], eta
    if eta["step"] == "unknown":
        assert eta["phase_overdue_s"] is None, eta
    else:
        assert eta["phase_overdue_s"] > 0, eta
    # raised once the silence passed the threshold, and not long after (the check runs often)
    silent = stall["raised_at"] - stall["since"]
    print(
        f"held in {phase} after its weights: stalled after {silent:.1f} s of silence "
        f"(learned threshold {threshold:.1f} s from {took}); {stall['reason']}"
    )
    assert stall["since"] >= third.stopped_at - 5.0  # the silence began about when it stopped
    assert threshold < silent <= threshold + 2.0
    # it went on when the processes did: the stall cleared, ready
    cleared = [e for e in third.events if e.get("event") == "transition.stall_cleared"]
    assert len(_stalls(third)) == 1 and len(cleared) == 1
