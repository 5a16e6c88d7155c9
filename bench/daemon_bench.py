"""The real daemon under a busy log: scrape latency, CPU and memory while it follows it.

    .venv/bin/python bench/daemon_bench.py [--quick] [--rate LINES_PER_S]

`loadwatch run --log FILE --gpu simulated --listen 127.0.0.1:0` follows FILE while a writer
replays a generated 1,000,000-line serving-phase vLLM log into it (bench/loggen.py; 100,000 with
--quick) at `--rate` lines/s, appending in 64 KiB blocks. Meanwhile:
- /metrics is scraped `--scrapes` times a second (10); each scrape's latency is timed by the
  client;
- the daemon's RSS (/proc/PID/status) is read when it has read 10%, 50% and 100% of the log
  (its own `loadwatch_log_lines_total`), and its CPU (/proc/PID/stat) over the replay. Both are
  summed over the daemon and its child processes (the HTTP server runs in one).
Goals: scrape p99 <= 5 ms; RSS <= 80 MB and flat. The last line is key=value pairs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from loggen import serving_log
from proctree import cpu_s, daemon, status_kb


def lines_read(body: bytes) -> int | None:
    for line in body.splitlines():
        if line.startswith(b"loadwatch_log_lines_total "):
            return int(float(line.split()[1]))
    return None


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


_SCRAPER = r"""
import http.client, sys, time, urllib.parse
url = urllib.parse.urlsplit(sys.argv[1])
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)  # one kept-alive connection
next_at = time.monotonic()
while True:
    start = time.perf_counter()
    try:
        conn.request("GET", url.path)
        body = conn.getresponse().read()
        ms = 1e3 * (time.perf_counter() - start)
        n = next((int(float(l.split()[1])) for l in body.splitlines()
                  if l.startswith(b"loadwatch_log_lines_total ")), -1)
        print(f"{ms:.3f} {n}", flush=True)
    except (OSError, http.client.HTTPException):
        conn.close()
        print("error -1", flush=True)
    next_at += float(sys.argv[2])
    time.sleep(max(0.0, next_at - time.monotonic()))
"""


class Scraper(threading.Thread):
    """GET /metrics every `period_s` from a process of its own (so the client's latency is not this
    process's interpreter lock); keep the latencies and the daemon's own line count."""

    def __init__(self, url: str, period_s: float) -> None:
        super().__init__(daemon=True)
        self.url = url + "/metrics"
        self.period_s = period_s
        self.latencies_ms: list[float] = []
        self.lines = 0
        self.errors = 0
        self.stop = threading.Event()

    def run(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SCRAPER, self.url, str(self.period_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if self.stop.is_set():
                    break
                ms, n = line.split()
                if ms == "error":
                    self.errors += 1
                    continue
                self.latencies_ms.append(float(ms))
                if int(n) >= 0:
                    self.lines = int(n)
        finally:
            proc.kill()
            proc.wait()


def replay(src: Path, dst: Path, rate: float, done: threading.Event) -> None:
    """Append `src` to `dst` at about `rate` lines per second, in 64 KiB blocks."""
    data = src.read_bytes()
    per_line = len(data) / max(data.count(b"\n"), 1)
    block = 64 * 1024
    start = time.monotonic()
    with dst.open("ab", buffering=0) as out:
        for i in range(0, len(data), block):
            out.write(data[i : i + block])
            due = start + (i + block) / per_line / rate
            time.sleep(max(0.0, due - time.monotonic()))
    done.set()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 100,000-line log")
    ap.add_argument("--rate", type=float, default=100_000.0, help="lines/s replayed (100000)")
    ap.add_argument("--scrapes", type=float, default=10.0, help="scrapes per second (10)")
    args = ap.parse_args(argv)
    lines_wanted = 100_000 if args.quick else 1_000_000
    exe = shutil.which("loadwatch", path=str(Path(sys.executable).parent))
    if exe is None:
        print("daemon_bench: the loadwatch command is not installed (./scripts/ensure-venv.sh)")
        return 2
    with tempfile.TemporaryDirectory(prefix="lw-daemon-bench-") as d:
        tmp = Path(d)
        src = tmp / "source.log"
        truth = serving_log(src, lines_wanted, seed=4)
        total = truth.lines
        log = tmp / "vllm.log"
        log.write_bytes(b"")
        with daemon(log, tmp / "state") as (proc, url):
            return run(proc, url, src, log, total, args.rate, args.scrapes)


def run(
    proc: subprocess.Popen[str],
    url: str,
    src: Path,
    log: Path,
    total: int,
    rate: float,
    scrapes: float,
) -> int:
    time.sleep(2.0)  # the first GPU polls, the empty log
    rss0 = status_kb(proc.pid, "VmRSS") / 1024
    scraper = Scraper(url, 1 / scrapes)
    scraper.start()
    written = threading.Event()
    writer = threading.Thread(target=replay, args=(src, log, rate, written), daemon=True)
    cpu0, wall0 = cpu_s(proc.pid), time.monotonic()
    writer.start()
    marks = {10: None, 50: None, 100: None}
    rss: dict[int, float] = {}
    end = time.monotonic() + 30 + 3 * total / rate
    while time.monotonic() < end and len(rss) < len(marks):
        read = scraper.lines
        for m in marks:
            if m not in rss and read >= total * m / 100:
                rss[m] = status_kb(proc.pid, "VmRSS") / 1024
        time.sleep(0.05)
    cpu1, wall1 = cpu_s(proc.pid), time.monotonic()
    hwm = status_kb(proc.pid, "VmHWM") / 1024
    scraper.stop.set()
    scraper.join(5)
    if len(rss) < len(marks):
        print(f"daemon_bench: the daemon read {scraper.lines:,} of {total:,} lines in time")
        return 1
    lat = scraper.latencies_ms
    cpu_pct = 100 * (cpu1 - cpu0) / (wall1 - wall0)
    behind = (wall1 - wall0) - total / rate
    print(f"replayed {total:,} serving-phase lines at {rate:,.0f} lines/s into {log.name}")
    print(
        f"scrapes: {len(lat)} at {scrapes:g}/s (errors {scraper.errors})  "
        f"p50 {pct(lat, 50):.2f} ms  "
        f"p90 {pct(lat, 90):.2f} ms  p99 {pct(lat, 99):.2f} ms  max {max(lat):.2f} ms  "
        f"mean {statistics.fmean(lat):.2f} ms  (goal p99 <= 5 ms)"
    )
    print(
        f"daemon CPU (with its HTTP process) while following: {cpu_pct:.1f}% of a core over {wall1 - wall0:.1f} s "
        f"({(cpu1 - cpu0) / total * 1e6:.2f} us of CPU per line; done {behind:+.1f} s after the writer)"
    )
    print(
        f"daemon RSS: before {rss0:.1f} MB, at 10% {rss[10]:.1f}, 50% {rss[50]:.1f}, "
        f"100% {rss[100]:.1f} MB; peak {hwm:.1f} MB (goal <= 80 MB, flat)"
    )
    growth = rss[100] - rss[10]
    print(
        f"scrape_p99_ms={pct(lat, 99):.2f} rss_mb_max={max(max(rss.values()), hwm):.1f} "
        f"rss_growth_mb={growth:.1f} cpu_pct={cpu_pct:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
