"""A scripted vLLM load as log lines, stamped near the real time so a daemon reads it as live."""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, serving, startup

_API_PID = re.compile(r"(\(APIServer pid=|Started server process \[)[0-9]+")


def server_alive_here(text: str) -> str:
    """`text` with the API server's pid that of this process: in watch mode the daemon looks
    for the pid a log names in /proc, and a read-back session whose pid no process has, with
    /health failing, has vanished (tests/daemon/test_read_back_ready.py). Whether some process
    of this machine has a random pid must not decide what these tests compare."""
    return _API_PID.sub(lambda m: f"{m.group(1)}{os.getpid()}", text)


def two_sessions(
    model: Path, seed: int, *, shards: int = 8, minutes_ago: float = 15.0
) -> list[str]:
    """vLLM fails with a CUDA OOM part way through the weights, is started again, gets ready and
    serves: two sessions, warnings, a traceback-shaped failure, bars, milestones.

    Stamped from `minutes_ago` on: the state takes a line's own time only when it is older than
    its replay lag of 10 s (a live line takes its arrival time, which no two runs share), so a log
    in the past makes the state a function of the log's bytes alone, and two daemons can be
    compared field by field. Less than half an hour ago, so that no quiet-log stall is raised
    from the wall clock either.
    """
    rng = random.Random(seed)
    clock = SyntheticClock(time.time() - minutes_ago * 60)
    shape = Shape(model=str(model), shards=shards, workers=4, layers=8, shard_s=(4.0, 9.0))
    lines = list(startup(rng, clock, shape, fail="oom", fail_at_shard=shards // 2))
    clock.advance(20)
    lines += startup(rng, clock, shape)
    lines += serving(rng, clock, 40)
    # the last line: a stall hint, which /status counts, so a reader can tell it got this far
    lines.append(
        f"(EngineCore_DP0 pid=4242) WARNING {clock.stamp()} [shm_broadcast.py:466] No available "
        "shared memory broadcast block found in 60 seconds.\n"
    )
    return [server_alive_here(x) for x in lines]
