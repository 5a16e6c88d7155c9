"""Benchmark of the log follower (the plain-file log input): latency, throughput against `wc -l`,
CPU while idle.

Run: ``.venv/bin/python bench/follower_bench.py [--quick]``. Figures are measured side by side
in one run and printed; nothing is asserted. The last line is ``key=value`` pairs:
``p50_ms p99_ms poll_p99_ms records_per_s ratio_vs_wc idle_cpu_pct``.

- latency: a writer process appends a line holding its `CLOCK_MONOTONIC` time, every 0.5-1.5 ms
  (10,000 appends; 1,000 with --quick); the follower, driven like the daemon drives it
  (read, then wait), notes when each line comes out of `read()`. inotify (auto) and poll modes.
- throughput: a 1,000,000-line file shaped like a serving vLLM log, read whole through the
  follower and `ChunkScanner` (records/s), against `wc -l` on the same file (best of 3 each,
  page cache warm). ratio_vs_wc is follower+parser time over wc time. The follower alone is
  printed too: the parser's cost per candidate record dominates the pipeline.
- idle: process CPU (all threads) while following a quiet file for
  60 s (10 s with --quick), over wall time, in percent of one core.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loadwatch.daemon.sources.log.inputs import FileInput  # the plain-file log input
from loadwatch.daemon.sources.log.wake import Mode
from loadwatch.parsers import ChunkScanner

WRITER = """
import os, random, sys, time
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
rnd = random.Random(1)
time.sleep(0.3)
for i in range(n):
    os.write(fd, b"%d %d\\n" % (i, time.monotonic_ns()))
    time.sleep(0.0005 + rnd.random() * 0.001)
os.close(fd)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def latency(tmp: Path, mode: Mode, appends: int) -> tuple[list[float], str | None]:
    path = tmp / f"latency-{mode}.log"
    path.write_bytes(b"")
    f = FileInput(path, mode=mode, poll_interval_s=0.25)
    f.read()
    f.wait(0.001)  # start the watcher before the writer begins
    active = f.health().mode
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(appends)])
    out: list[float] = []
    deadline = time.monotonic() + 60 + appends * 0.01
    while len(out) < appends and time.monotonic() < deadline:
        chunks = f.read()
        now = time.monotonic_ns()
        for c in chunks:
            for rec in c.data.split(b"\n")[:-1]:
                out.append((now - int(rec.split()[1])) / 1e6)
        if not f.backlog:
            f.wait()
    writer.wait()
    f.close()
    return out, active


def vllm_like_lines(n: int) -> list[bytes]:
    """A serving log's mix: 55% access lines, 30% engine stats, 13.5% engine INFO lines,
    1% weight-loading progress bars, 0.5% warnings (the last two are parser candidates)."""
    rnd = random.Random(3)
    out: list[bytes] = []
    for i in range(n):
        t = f"05-01 10:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}"
        r = rnd.random()
        if r < 0.55:
            out.append(
                f'INFO:     10.0.{i % 250}.{i % 7}:5{i % 9999:04d} - "POST /v1/chat/completions '
                f'HTTP/1.1" 200 OK\n'.encode()
            )
        elif r < 0.85:
            out.append(
                f"(APIServer pid=4100) INFO {t} [loggers.py:123] Engine 000: Avg prompt "
                f"throughput: {rnd.random() * 900:.1f} tokens/s, Avg generation throughput: "
                f"{rnd.random() * 90:.1f} tokens/s, Running: {i % 17} reqs, Waiting: 0 reqs\n".encode()
            )
        elif r < 0.985:
            out.append(
                f"(EngineCore_0 pid=4103) INFO {t} [core.py:77] scheduled step {i} with "
                f"{i % 64} sequences\n".encode()
            )
        elif r < 0.995:
            k = i % 64
            out.append(
                f"Loading safetensors checkpoint shards: {k * 100 // 64:3d}% Completed | "
                f"{k}/64 [00:{k % 60:02d}<00:30,  1.10it/s]\n".encode()
            )
        else:
            out.append(
                f"(EngineCore_0 pid=4103) WARNING {t} [utils.py:9] slow step {i} took "
                f"{rnd.random():.3f}s\n".encode()
            )
    return out


def best_of(runs: int, fn: Callable[[], int]) -> tuple[float, int]:
    best, result = float("inf"), 0
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def read_through(path: Path, with_parser: bool) -> int:
    f = FileInput(path)
    scanner = ChunkScanner()
    records = 0
    while True:
        for c in f.read():
            if with_parser:
                scanner.feed(c.data, c.offset, c.file_id)
        if not f.backlog:
            break
    records = f.health().records_total
    f.close()
    return records


def wc_lines(path: Path) -> int:
    out = subprocess.run(["wc", "-l", str(path)], capture_output=True, check=True, text=True)
    return int(out.stdout.split()[0])


def idle_cpu(tmp: Path, mode: Mode, seconds: float) -> tuple[float, str | None]:
    path = tmp / f"idle-{mode}.log"
    path.write_bytes(b"INFO quiet\n")
    f = FileInput(path, mode=mode)
    stop = threading.Event()

    def loop() -> None:
        for _ in f.follow(stop):
            pass

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(1.0)  # let the watcher settle
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    w0 = time.monotonic()
    time.sleep(seconds)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - w0
    active = f.health().mode
    stop.set()
    t.join(2)
    f.close()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return 100.0 * cpu / wall, active


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer appends, 10 s idle")
    args = ap.parse_args()
    appends = 1_000 if args.quick else 10_000
    idle_s = 10.0 if args.quick else 60.0
    lines = 1_000_000

    with tempfile.TemporaryDirectory(prefix="follower-bench-") as d:
        tmp = Path(d)

        lat, active = latency(tmp, "auto", appends)
        p50, p99 = pct(lat, 50), pct(lat, 99)
        print(
            f"latency {active}: {len(lat)} appends  p50 {p50:.2f} ms  p90 {pct(lat, 90):.2f} ms  "
            f"p99 {p99:.2f} ms  max {max(lat):.2f} ms  (goal p99 <= 20 ms: "
            f"{'met' if p99 <= 20 else 'NOT met'})"
        )
        plat, pactive = latency(tmp, "poll", appends)
        pp50, pp99 = pct(plat, 50), pct(plat, 99)
        print(
            f"latency {pactive} (250 ms interval): {len(plat)} appends  p50 {pp50:.2f} ms  "
            f"p99 {pp99:.2f} ms  max {max(plat):.2f} ms"
        )

        big = tmp / "big.log"
        with open(big, "wb") as w:
            w.writelines(vllm_like_lines(lines))
        size_mb = big.stat().st_size / 1e6
        wc_time, wc_n = best_of(3, lambda: wc_lines(big))
        alone_time, alone_n = best_of(3, lambda: read_through(big, with_parser=False))
        full_time, full_n = best_of(3, lambda: read_through(big, with_parser=True))
        assert wc_n == alone_n == full_n == lines, (wc_n, alone_n, full_n)
        rate = lines / full_time
        ratio = full_time / wc_time
        print(f"throughput on {lines} lines ({size_mb:.0f} MB), best of 3:")
        print(f"  wc -l              {wc_time * 1000:8.1f} ms  {lines / wc_time:14,.0f} lines/s")
        print(
            f"  follower alone     {alone_time * 1000:8.1f} ms  {lines / alone_time:14,.0f} "
            f"records/s  ({alone_time / wc_time:.2f}x wc time)"
        )
        print(
            f"  follower + parser  {full_time * 1000:8.1f} ms  {rate:14,.0f} records/s  "
            f"({ratio:.2f}x wc time)"
        )

        idle, iactive = idle_cpu(tmp, "auto", idle_s)
        pidle, _ = idle_cpu(tmp, "poll", max(5.0, idle_s / 4))
        print(
            f"idle CPU following a quiet file: {iactive} {idle:.3f}% of a core over {idle_s:.0f} s"
            f" (goal < 0.2%: {'met' if idle < 0.2 else 'NOT met'}); poll mode {pidle:.3f}%"
        )
        print(f"stdev latency {active}: {statistics.pstdev(lat):.2f} ms")

    print(
        f"p50_ms={p50:.2f} p99_ms={p99:.2f} poll_p99_ms={pp99:.2f} records_per_s={rate:.0f} "
        f"ratio_vs_wc={ratio:.2f} idle_cpu_pct={idle:.3f}"
    )


if __name__ == "__main__":
    main()
