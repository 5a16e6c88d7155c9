"""Seeded generators of vLLM server logs in the real byte format, with the ground truth they hold.

Two shapes, as an inference host sees them:
- a load-phase log: Kimi-K2.5-like startups (119 shards, 8 tensor-parallel workers, per-layer
  k/v scale warnings from every worker, milestones, `\\r` progress bars), repeated;
- a serving-phase log: one startup, then request and access lines, periodic engine statistics,
  rare warnings, and a few restarts with fresh loads (one of them failing with a CUDA OOM).

The lines come from `loadwatch.daemon.sim.kimilog`, the same script the demo's simulated vLLM prints.
`python bench/loggen.py load|serving PATH [--lines N] [--seed S]` writes one and prints its truth.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from loadwatch.daemon.sim.kimilog import Counts, SyntheticClock, serving, startup


@dataclass
class Truth(Counts):
    lines: int = 0  # newline-terminated lines

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def write(lines: Iterator[str], path: Path, truth: Truth) -> None:
    with path.open("wb") as f:
        for line in lines:
            data = line.encode()
            truth.lines += data.count(b"\n")
            f.write(data)


def load_log(path: Path, lines: int = 200_000, seed: int = 1) -> Truth:
    rng = random.Random(seed)
    clock = SyntheticClock()
    truth = Truth()

    def gen() -> Iterator[str]:
        produced = 0
        while produced < lines:
            for line in startup(rng, clock, counts=truth):
                produced += line.count("\n")
                yield line

    write(gen(), path, truth)
    return truth


def serving_log(path: Path, lines: int = 1_000_000, seed: int = 1, restarts: int = 3) -> Truth:
    rng = random.Random(seed)
    clock = SyntheticClock()
    truth = Truth()
    per = lines // (restarts + 1)

    def gen() -> Iterator[str]:
        yield from startup(rng, clock, counts=truth)
        for r in range(restarts + 1):
            yield from serving(rng, clock, per - 2000)
            if r < restarts:
                if r == 0:  # the first restart dies of a CUDA OOM half way, then starts cleanly
                    yield from startup(rng, clock, counts=truth, fail="oom", fail_at_shard=60)
                yield from startup(rng, clock, counts=truth)

    write(gen(), path, truth)
    return truth


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("shape", choices=("load", "serving"))
    ap.add_argument("path", type=Path)
    ap.add_argument("--lines", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.shape == "load":
        truth = load_log(args.path, args.lines or 200_000, args.seed)
    else:
        truth = serving_log(args.path, args.lines or 1_000_000, args.seed)
    print(truth.to_json())


if __name__ == "__main__":
    main()
