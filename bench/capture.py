"""What capturing vLLM's output costs: the supervisor's pump + rotating log, side by side with
writing straight to the file and with ``cat`` as the pipe reader.

A producer process writes a generated load-phase log (bench/loggen.py) the way vLLM does: one
``write`` per line or bar update. Three ways to get it into a file, timed from the producer's
start until every byte is in the file:

  direct   the producer's stdout is the file (what ``StandardOutput=file:`` gives)
  cat      producer | cat > file
  pump     producer | loadwatch's OutputPump -> RotatingLog (rotation at --rotate-mib)

Then the pump's latency: how long a ``\\r`` progress update takes from ``write`` to the sink.

    python bench/capture.py [--lines 400000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loadwatch.daemon.supervise.logsink import OutputPump, RotatingLog

HERE = Path(__file__).resolve().parent

PRODUCER = r"""
import os, sys
data = open(sys.argv[1], "rb").read()
start = 0
w = os.write
while start < len(data):
    # one write per record, ending at \n or \r, as vLLM's handlers and tqdm do
    nl = data.find(b"\n", start)
    cr = data.find(b"\r", start)
    ends = [i for i in (nl, cr) if i >= 0]
    end = (min(ends) + 1) if ends else len(data)
    w(1, data[start:end])
    start = end
"""


def _producer(src: Path) -> list[str]:
    return [sys.executable, "-c", PRODUCER, str(src)]


def run_direct(src: Path, out: Path) -> float:
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        subprocess.run(_producer(src), stdout=f, check=True)
    return time.perf_counter() - t0


def run_cat(src: Path, out: Path) -> float:
    t0 = time.perf_counter()
    with open(out, "wb") as f:
        prod = subprocess.Popen(_producer(src), stdout=subprocess.PIPE)
        cat = subprocess.Popen(["cat"], stdin=prod.stdout, stdout=f)
        assert prod.stdout is not None
        prod.stdout.close()
        prod.wait()
        cat.wait()
    return time.perf_counter() - t0


def run_pump(src: Path, out: Path, rotate_bytes: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, i.e. the pump thread)."""
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    log = RotatingLog(str(out), rotate_bytes, backups=100)
    r, w = os.pipe()
    pump = OutputPump(r, log.write)
    pump.start()
    prod = subprocess.Popen(_producer(src), stdout=w)
    os.close(w)
    prod.wait()
    pump.join()
    log.close()
    return time.perf_counter() - t0, time.process_time() - cpu0


def pump_latency_us(updates: int) -> list[float]:
    arrived: list[float] = []
    done = threading.Event()

    def sink(chunk: bytes) -> None:
        arrived.append(time.perf_counter())
        if len(arrived) == updates:
            done.set()

    r, w = os.pipe()
    pump = OutputPump(r, sink)
    pump.start()
    out: list[float] = []
    for i in range(updates):
        sent = time.perf_counter()
        os.write(w, f"\rCapturing CUDA graphs: {i % 100:3d}%|".encode())
        while len(arrived) <= i:  # wait for this update before sending the next
            time.sleep(0)
        out.append((arrived[i] - sent) * 1e6)
    os.close(w)
    pump.join(5)
    done.wait(1)
    return out


def best(fn: Callable[[], float], rounds: int) -> float:
    return min(fn() for _ in range(rounds))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=400_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rotate-mib", type=float, default=16.0)
    ap.add_argument("--updates", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lw-capture-") as tmp:
        d = Path(tmp)
        src = d / "src.log"
        subprocess.run(
            [sys.executable, str(HERE / "loggen.py"), "load", str(src), "--lines", str(args.lines)],
            stdout=subprocess.DEVNULL,
            check=True,
        )
        size = src.stat().st_size
        rotate = int(args.rotate_mib * 2**20)
        direct = best(lambda: run_direct(src, d / "direct.log"), args.rounds)
        cat = best(lambda: run_cat(src, d / "cat.log"), args.rounds)
        pumps = []
        for i in range(args.rounds):
            out = d / f"pump{i}" / "v.log"
            out.parent.mkdir()
            pumps.append(run_pump(src, out, rotate))
            parts = sorted(out.parent.glob("v.log.*"), key=lambda p: -int(p.suffix[1:]))
            joined = b"".join(p.read_bytes() for p in [*parts, out])
            assert joined == src.read_bytes(), "pump output differs from the source"
        pump_wall, pump_cpu = min(pumps)
        assert (d / "cat.log").read_bytes() == src.read_bytes()
    mib = size / 2**20
    print(f"{mib:.1f} MiB, {args.lines} lines, one write per record; best of {args.rounds}")
    print(f"{'capture':8} {'wall s':>8} {'MiB/s':>8} {'x direct':>9} {'x cat':>7}")
    for name, s in (("direct", direct), ("cat", cat), ("pump", pump_wall)):
        print(f"{name:8} {s:8.3f} {mib / s:8.1f} {s / direct:9.2f} {s / cat:7.2f}")
    print(
        f"pump CPU (reader thread + rotation): {pump_cpu:.3f} s, {pump_cpu / mib * 1e3:.1f} ms/MiB"
    )
    lat = sorted(pump_latency_us(args.updates))
    p99 = lat[int(len(lat) * 0.99) - 1]
    print(
        f"\\r update, write to sink: median {statistics.median(lat):.0f} us, "
        f"p99 {p99:.0f} us, max {lat[-1]:.0f} us ({len(lat)} updates)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
