"""Shared pieces of the fault tests: a daemon that file modes bind, a scripted load in steps."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from loadwatch.daemon.sim.kimilog import RealClock, Shape, startup


def unprivileged() -> list[str]:
    """A command prefix that makes file modes bind the daemon.

    The tests run as root here, and root reads through any mode bit. The daemon stays root (the
    interpreter lives under /root, which no other user can reach) but loses the two capabilities
    that let root ignore modes, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, from its bounding set:
    for it a file of mode 000 is then as closed as for anyone. As another user, nothing is needed.
    """
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot be made to bind")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def load_steps(model: str, shards: int, seed: int, marks: list[int]) -> list[list[str]]:
    """A load cut after the bars `n/shards` for each n in `marks`; the last step reaches ready."""
    shape = Shape(model=model, shards=shards, workers=2, layers=4)
    lines = list(startup(random.Random(seed), RealClock(speed=1e9), shape))
    steps: list[list[str]] = []
    for n in marks:
        marker = f" {n}/{shards} ["
        cut = next(i for i, line in enumerate(lines) if marker in line) + 1
        steps.append(lines[:cut])
        lines = lines[cut:]
    steps.append(lines)
    return steps
