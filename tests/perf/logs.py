"""Generated vLLM logs for the fast-path tests: the byte format and mix of the benchmarks."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from loadwatch.daemon.sim.kimilog import Counts, Shape, SyntheticClock, serving, startup

SMALL = Shape(shards=12, workers=4, layers=10)


def _join(lines: Iterator[str]) -> bytes:
    return "".join(lines).encode()


def serving_log(requests: int = 6000, seed: int = 5) -> tuple[bytes, Counts]:
    """A start, request traffic (prompts that say ERROR, Traceback, CUDA out of memory), a
    restart that dies of a CUDA OOM, a clean restart, more traffic."""
    rng = random.Random(seed)
    clock = SyntheticClock()
    counts = Counts()

    def gen() -> Iterator[str]:
        yield from startup(rng, clock, SMALL, counts)
        yield from serving(rng, clock, requests)
        yield from startup(rng, clock, SMALL, counts, fail="oom", fail_at_shard=6)
        yield from startup(rng, clock, SMALL, counts)
        yield from serving(rng, clock, requests)

    return _join(gen()), counts


def load_log(starts: int = 6, seed: int = 6) -> tuple[bytes, Counts]:
    """Back-to-back starts: per-layer k/v scale warnings from every worker, `\\r` bars."""
    rng = random.Random(seed)
    clock = SyntheticClock()
    counts = Counts()

    def gen() -> Iterator[str]:
        for _ in range(starts):
            yield from startup(rng, clock, Shape(shards=20, workers=8, layers=30), counts)

    return _join(gen()), counts


def coloured(data: bytes) -> bytes:
    """Every tenth line with its level coloured, as `VLLM_LOGGING_COLOR` does."""
    out = []
    for i, line in enumerate(data.split(b"\n")):
        if i % 10 == 0:
            line = line.replace(b" INFO ", b" \x1b[32mINFO\x1b[0m ", 1)
        out.append(line)
    return b"\n".join(out)


_PREFIX = re.compile(rb"\(([A-Za-z][\w -]*? pid=[0-9]+)\) ")


def coloured_prefixes(data: bytes) -> bytes:
    """Every process prefix coloured as vLLM coloured it before 2025-11, on a file too
    (tests/fixtures/v1-2025.log): `ESC[1;36m(NAME pid=N)ESC[0;0m `."""
    return _PREFIX.sub(b"\x1b[1;36m(\\1)\x1b[0;0m ", data)
