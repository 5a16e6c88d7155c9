"""A scripted vLLM load as log lines, stamped near the real time so a daemon reads it as live."""

from __future__ import annotations

import random
import time
from pathlib import Path

from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, serving, startup


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
    return lines
