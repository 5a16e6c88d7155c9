"""Seeded generators of vLLM server logs in the real byte format, with the ground truth they hold.

Shapes, as an inference host sees them (`LOAD_SHAPES`, `SERVING_SHAPES`):
- load-phase logs: Kimi-K2.5-like startups (119 shards, 8 tensor-parallel workers, per-layer k/v
  scale warnings from every worker, milestones, progress bars), repeated, in seven shapes:
  `blocks` (each layer's warnings worker after worker, the bar after a lone `(Worker_TP0
  pid=N) ` record and tqdm's `\\r`: what the demo's simulated vLLM prints), `interleaved` (the
  8 workers' own per-layer warnings merged as processes writing to one stream merge them, the
  bar with its process prefix on the same record), `interleaved-lone` (interleaved warnings,
  the bar after a lone prefix record), `coloured` (as `interleaved-lone`, every process
  prefix in colour codes as vLLM printed them before 2025-11), `compose` (as
  `interleaved-lone`, read through `docker compose logs`: `vllm-1  | ` before every line),
  `tty` (as `coloured`, every header coloured too, as vLLM prints both on a terminal since
  2025-11) and `old-header` (as `interleaved-lone`, the header as vLLM wrote it before
  2025-02: `WARNING 11-18 11:07:05 weight_utils.py:1398] `);
- serving-phase logs: one startup, then request lines, periodic engine statistics, and a few
  restarts with fresh loads (one of them failing with a CUDA OOM), in two shapes: `serving`
  (the request, access and statistics lines of daemon/sim/kimilog.py's `serving`, prompts that
  say ERROR) and `requests` (vLLM 0.32 with `--enable-log-requests --enable-log-outputs` at
  DEBUG: parameters, the prompt and the output echoed, `Added request`, uvicorn's access line;
  kimilog.py's `logged_requests`).

The lines come from `loadwatch.daemon.sim.kimilog`, the same script the demo's simulated vLLM prints.
`python bench/loggen.py SHAPE PATH [--lines N] [--seed S]` writes one and prints its truth.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from loadwatch.daemon.sim.kimilog import (
    Counts,
    LogClock,
    Shape,
    SyntheticClock,
    logged_requests,
    serving,
    startup,
)

LOAD_SHAPES: dict[str, Shape] = {
    "blocks": Shape(),
    "interleaved": Shape(warnings="interleaved", bar="same_record"),
    "interleaved-lone": Shape(warnings="interleaved", bar="lone_prefix"),
    "coloured": Shape(warnings="interleaved", bar="lone_prefix", coloured=True),
}
# What stands before each line of the shapes read through a log collector: `docker compose
# logs`'s service column (the line as vLLM wrote it after it)
WRAPPED: dict[str, str] = {"compose": "vllm-1  | "}
LOAD_SHAPES["compose"] = LOAD_SHAPES["interleaved-lone"]
# vLLM's header, `LEVEL MM-DD HH:MM:SS [file.py:N] `, as the shapes that change it print it:
# on a terminal since 2025-11 (vllm/logging_utils/formatter.py colours the level, the time and
# the source, each closed by `ESC[0m`; the prefixes are coloured too), and before 2025-02 (the
# source without its opening bracket).
_HEADER = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) \[(\S+?)\] ")
_LEVEL_COLOUR = {"DEBUG": 37, "INFO": 32, "WARNING": 33, "ERROR": 31, "CRITICAL": 35}
HEADERS: dict[str, Callable[[re.Match[str]], str]] = {
    "tty": lambda m: (
        f"\x1b[{_LEVEL_COLOUR[m[1]]}m{m[1]}\x1b[0m \x1b[90m{m[2]}\x1b[0m \x1b[90m[{m[3]}]\x1b[0m "
    ),
    "old-header": lambda m: f"{m[1]} {m[2]} {m[3]}] ",
}
LOAD_SHAPES["tty"] = LOAD_SHAPES["coloured"]
LOAD_SHAPES["old-header"] = LOAD_SHAPES["interleaved-lone"]
Requests = Callable[[random.Random, LogClock, int], Iterator[str]]
SERVING_SHAPES: dict[str, Requests] = {"serving": serving, "requests": logged_requests}


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


def load_log(path: Path, lines: int = 200_000, seed: int = 1, shape: str = "blocks") -> Truth:
    rng = random.Random(seed)
    clock = SyntheticClock()
    truth = Truth()
    form = LOAD_SHAPES[shape]

    def gen() -> Iterator[str]:
        produced = 0
        while produced < lines:
            for line in startup(rng, clock, form, counts=truth):
                produced += line.count("\n")
                yield line

    lines_out = gen()
    header = HEADERS.get(shape)
    if header is not None:
        lines_out = (_HEADER.sub(header, text) for text in lines_out)
    wrapper = WRAPPED.get(shape)
    write(lines_out if wrapper is None else wrapped(lines_out, wrapper), path, truth)
    return truth


def wrapped(lines: Iterator[str], wrapper: str) -> Iterator[str]:
    """`lines` with `wrapper` before each line, as a collector writes it (a `\r` inside a line
    is the line's own)."""
    at_start = True
    for text in lines:
        out = []
        for i, part in enumerate(text.split("\n")):
            if i:
                out.append("\n")
                at_start = True
            if part:
                out.append(wrapper + part if at_start else part)
                at_start = False
        yield "".join(out)


def serving_log(
    path: Path,
    lines: int = 1_000_000,
    seed: int = 1,
    restarts: int = 3,
    shape: str = "serving",
) -> Truth:
    rng = random.Random(seed)
    clock = SyntheticClock()
    truth = Truth()
    per = lines // (restarts + 1)
    requests = SERVING_SHAPES[shape]

    def gen() -> Iterator[str]:
        yield from startup(rng, clock, counts=truth)
        for r in range(restarts + 1):
            yield from requests(rng, clock, per - 2000)
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
    ap.add_argument("shape", choices=(*LOAD_SHAPES, *SERVING_SHAPES))
    ap.add_argument("path", type=Path)
    ap.add_argument("--lines", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.shape in LOAD_SHAPES:
        truth = load_log(args.path, args.lines or 200_000, args.seed, args.shape)
    else:
        truth = serving_log(args.path, args.lines or 1_000_000, args.seed, shape=args.shape)
    print(truth.to_json())


if __name__ == "__main__":
    main()
