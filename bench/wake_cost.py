"""What one wake-up of the daemon's loop costs beside what it reads, on this machine.

    .venv/bin/python bench/wake_cost.py [--hz 10] [--seconds 10] [--lines 30]

Three figures, CPU time (`time.process_time`) of this process:
- a bare loop woken `--hz` times a second by `call_later`, doing nothing: the price of a
  wake-up itself (the kernel's and the interpreter's), µs each, for asyncio's own loop and for
  libuv's (uvloop), which the daemon runs on;
- the daemon's read of a serving log (`LogSource.read` and `Daemon.take_log`, in process, on a
  real file) of `--lines` lines of vLLM 0.32's request lines per read (bench/live_cost.py's
  writer), µs per read.
Following a serving log costs about (wake-up + read) times the reads a second; the reads a
second are what `[log] coalesce_ms` bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import live_cost

from loadwatch.daemon.config import Config, GpuConfig, HttpConfig, LogConfig
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.exporters.eventlog import EventLog


def bare_wake_us(hz: float, seconds: float, loop_factory: Any = None) -> float:
    async def main() -> float:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            loop.call_later(1 / hz, tick)

        tick()
        c0 = time.process_time()
        await asyncio.sleep(seconds)
        return time.process_time() - c0

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return 1e6 * runner.run(main()) / (hz * seconds)


def read_us(lines: int, reads: int) -> float:
    with tempfile.TemporaryDirectory(prefix="lw-wake-") as name:
        tmp = Path(name)
        log = tmp / "vllm.log"
        log.write_bytes(live_cost.startup_bytes(os.getpid(), 8321))
        cfg = Config(
            log=LogConfig(path=log),
            http=HttpConfig(port=0),
            gpu=GpuConfig(source="none"),
            state_dir=tmp / "state",
        )
        d = Daemon(cfg, eventlog=EventLog(io.StringIO(), None, console=False), gpu=NullGpuSource())
        source = d.open_log()
        assert source is not None
        d.take_log(source.read())  # the start-up: caught up
        serving = live_cost.serving_lines(random.Random(1), os.getpid())
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        spent = 0.0
        try:
            for _ in range(reads):
                os.write(fd, b"".join(next(serving) for _ in range(lines)))
                c0 = time.process_time()
                d.take_log(source.read())
                spent += time.process_time() - c0
        finally:
            os.close(fd)
        return 1e6 * spent / reads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--lines", type=int, default=30, help="serving lines per read")
    args = ap.parse_args()
    wake = bare_wake_us(args.hz, args.seconds)
    uv = bare_wake_us(args.hz, args.seconds, uvloop.new_event_loop)
    read = read_us(args.lines, 2000)
    print(f"a bare wake-up at {args.hz:g} Hz: asyncio's loop {wake:.0f} us, uvloop's {uv:.0f} us; "
          f"a read of {args.lines} serving lines (LogSource.read + Daemon.take_log): "
          f"{read:.0f} us")  # fmt: skip
    print(f"wake_us={wake:.0f} uvloop_wake_us={uv:.0f} read_us={read:.0f}")


if __name__ == "__main__":
    main()
