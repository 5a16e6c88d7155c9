"""How loadwatch's cost grows with what it watches. Four tables, each measured in this run:

    .venv/bin/python bench/scaling.py [--quick]

1. log size: serving-phase logs of 100k, 1M and 5M lines (5M = the 1M log five times over;
   --quick: 20k, 100k, 500k)
   through the daemon's pipeline (follower, chunk scanner, load state) in a fresh process each:
   wall and CPU time, lines/s, peak RSS (GNU time). Time should grow linearly, RSS stay flat.
2. GPUs: a `SimulatedGpuSource` of 1, 8, 64 GPUs behind the daemon's `GuardedGpuSource`, polled
   at 1 Hz for real and folded into a `LoadState` that is loading weights (so the per-GPU memory
   forecast runs): CPU per poll and in percent of one core.
3. idle: the real daemon (`loadwatch run --log FILE --gpu simulated --listen 127.0.0.1:0`, 8
   GPUs) on a quiet log for 60 s (10 s with --quick); its CPU from /proc. Goal: < 0.5% of a core.
4. scrape: a `/metrics` render (snapshot + exposition) of states with more GPUs and warning
   codes, against the number of series.

The last line is key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loggen import serving_log
from proctree import cpu_s, daemon

HERE = Path(__file__).resolve().parent
GIB = 1024**3
T0 = 1_763_000_000.0


def timed(argv: list[str]) -> tuple[float, float, float, str]:
    """Wall s, CPU s, peak RSS MB of one process (GNU time: a fork from a small parent, so the
    peak is the tool's own), and its stdout."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%e %U %S %M", "-o", out.name, *argv],
            capture_output=True,
            text=True,
            check=True,
        )
        wall, user, sys_s, rss_kb = out.read().split()[-4:]
    return float(wall), float(user) + float(sys_s), int(rss_kb) / 1024, proc.stdout


# -- 1. log size ---------------------------------------------------------------------------------


def log_sizes(tmp: Path, quick: bool) -> list[dict[str, float]]:
    base_lines = 100_000 if quick else 1_000_000
    small = tmp / "small.log"
    big = tmp / "big.log"
    serving_log(small, base_lines // 10 + 8000, seed=2)  # its four starts take ~8,000 lines
    serving_log(big, base_lines, seed=2)
    huge = tmp / "huge.log"
    with huge.open("wb") as out:
        for _ in range(5):
            with big.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    worker = [sys.executable, str(HERE / "throughput_vs_mtail.py"), "--worker", "loadwatch"]
    rows = []
    for path in (small, big, huge):
        wall, cpu, rss, out = timed([*worker, str(path)])
        doc = json.loads(out.strip().splitlines()[-1])
        lines = int(doc["lines"])
        rows.append(
            {
                "lines": lines,
                "mb": path.stat().st_size / 1e6,
                "pipeline_s": float(doc["elapsed_s"]),
                "wall_s": wall,
                "cpu_s": cpu,
                "rss_mb": rss,
                "lines_per_s": lines / float(doc["elapsed_s"]),
            }
        )
        path.unlink() if path is huge else None
    print("\n1. serving-phase log size (one fresh process each; lines/s over the pipeline time)")
    print(
        f"{'lines':>10} {'MB':>7} {'pipeline s':>10} {'process s':>9} {'CPU s':>7} "
        f"{'lines/s':>9} {'peak RSS MB':>11}"
    )
    for r in rows:
        print(
            f"{r['lines']:>10,.0f} {r['mb']:>7.0f} {r['pipeline_s']:>10.2f} {r['wall_s']:>9.2f} "
            f"{r['cpu_s']:>7.2f} {r['lines_per_s']:>9,.0f} {r['rss_mb']:>11.1f}"
        )
    mid, last = rows[1], rows[2]
    print(
        f"time per line at {last['lines']:,.0f} lines / at {mid['lines']:,.0f} (the same mix): "
        f"{growth(rows):.2f} (1.00 = linear); peak RSS {rows[0]['rss_mb']:.1f} -> "
        f"{last['rss_mb']:.1f} MB"
    )
    return rows


def growth(rows: list[dict[str, float]]) -> float:
    mid, last = rows[1], rows[2]
    return (last["pipeline_s"] / mid["pipeline_s"]) / (last["lines"] / mid["lines"])


# -- 2. GPUs -------------------------------------------------------------------------------------


def loading_state() -> object:
    """A state loading weights with a byte-weighed bar, so every GPU reading feeds the
    per-GPU memory fit and the OOM forecast."""
    from loadwatch.daemon.sources.inputs import ModelInfo, ProcessEvent, ShardInfo
    from loadwatch.daemon.state.loadstate import LoadState
    from loadwatch.parsers import Milestone, ShardProgress

    shards = tuple(ShardInfo(f"model-{i:05d}.safetensors", 5 * GIB) for i in range(119))
    st = LoadState()
    now = time.time()
    st = st.apply(ProcessEvent(kind="started", ts=now, pid=1), now)
    st = st.apply(ModelInfo(path="/m", shards=shards, total_bytes=5 * GIB * 119), now)
    st = st.apply(Milestone(kind="model_load_start", ts=now), now)
    desc = "Loading safetensors checkpoint shards"
    for i in range(0, 30):
        st = st.apply(
            ShardProgress(desc=desc, bar="weights", done=i, total=119, process="W", ts=now), now
        )
    return st


def gpu_counts(counts: tuple[int, ...], seconds: float) -> list[dict[str, float]]:
    from loadwatch.daemon.sim.gpus import SimulatedGpuSource
    from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
    from loadwatch.daemon.state.loadstate import LoadState

    rows = []
    for n in counts:
        progress = [0.25]
        source = GuardedGpuSource(SimulatedGpuSource(n, progress=lambda p=progress: p[0]))
        st = loading_state()
        assert isinstance(st, LoadState)
        source.poll()  # start the worker thread outside the measurement
        polls = 0
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.monotonic()
        next_at = w0
        while time.monotonic() - w0 < seconds:
            reading = source.poll()
            st = st.apply(reading, time.time())
            polls += 1
            progress[0] = min(progress[0] + 0.001, 1.0)
            next_at += 1.0
            time.sleep(max(0.0, next_at - time.monotonic()))
        wall = time.monotonic() - w0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        source.close()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        rows.append(
            {"gpus": n, "polls": polls, "ms_per_poll": 1e3 * cpu / polls, "pct": 100 * cpu / wall}
        )
    print(
        "\n2. GPUs polled at 1 Hz (GuardedGpuSource + SimulatedGpuSource + LoadState.apply, loading)"
    )
    print(f"{'GPUs':>5} {'polls':>6} {'CPU ms/poll':>12} {'% of a core':>12}")
    for r in rows:
        print(f"{r['gpus']:>5} {r['polls']:>6} {r['ms_per_poll']:>12.2f} {r['pct']:>12.3f}")
    return rows


# -- 3. idle -------------------------------------------------------------------------------------


def idle_daemon(tmp: Path, seconds: float) -> float:
    log = tmp / "quiet.log"
    serving_log(log, 3000, seed=3, restarts=0)
    with daemon(log, tmp / "state") as (proc, _url):
        time.sleep(3.0)  # settle: the log read, the first polls
        c0, w0 = cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        c1, w1 = cpu_s(proc.pid), time.monotonic()
    pct = 100 * (c1 - c0) / (w1 - w0)
    print(
        f"\n3. idle: the real daemon (and its HTTP process) on a quiet log, 8 simulated GPUs, "
        f"{seconds:.0f} s: {pct:.3f}% of a core (goal < 0.5%: {'met' if pct < 0.5 else 'NOT met'})"
    )
    return pct


# -- 4. scrape -----------------------------------------------------------------------------------


def scrape_costs(shapes: tuple[tuple[int, int], ...], reps: int) -> list[dict[str, float]]:
    from loadwatch.daemon.sim.gpus import SimulatedGpuSource
    from loadwatch.daemon.state.loadstate import LoadState
    from loadwatch.daemon.state.published import Published, Totals
    from loadwatch.exporters.prometheus import LoadwatchCollector, registry_for, render
    from loadwatch.parsers import LogWarning

    rows = []
    for gpus, codes in shapes:
        st = loading_state()
        assert isinstance(st, LoadState)
        now = time.time()
        for i in range(codes):
            st = st.apply(LogWarning(source=f"mod_{i}.py:{i}", message="odd", ts=now), now)
        st = st.apply(SimulatedGpuSource(gpus, progress=lambda: 0.3).poll(), now)
        totals = Totals(
            warnings={w: 1 for w in (st.session.warnings if st.session else {})},
            events={"log_warning": codes, "shard_progress": 30},
        )

        def tick(clock: list[float] = [now]) -> float:  # noqa: B006 (the clock's own state)
            clock[0] += 1.0  # every scrape builds a fresh snapshot, as at 1 scrape/s or slower
            return clock[0]

        pub = Published(
            state=st,
            at=now,
            started_at=now,
            version="bench",
            totals=totals,
            log=None,
            gpu=None,
            supervisor=None,
            load_budget_s=None,
        )
        registry = registry_for(LoadwatchCollector(lambda p=pub: p, tick))  # type: ignore[misc]
        body = render(registry)
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            render(registry)
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "gpus": gpus,
                "codes": codes,
                "series": series,
                "bytes": len(body),
                "ms": 1e3 * statistics.median(times),
                "p99_ms": 1e3 * sorted(times)[int(0.99 * (len(times) - 1))],
            }
        )
    print("\n4. scrape cost (snapshot + Prometheus exposition) against series")
    print(
        f"{'GPUs':>5} {'warning codes':>13} {'series':>7} {'bytes':>7} {'median ms':>10} "
        f"{'p99 ms':>7} {'us/series':>10}"
    )
    for r in rows:
        print(
            f"{r['gpus']:>5} {r['codes']:>13} {r['series']:>7} {r['bytes']:>7} {r['ms']:>10.2f} "
            f"{r['p99_ms']:>7.2f} {1e3 * r['ms'] / r['series']:>10.1f}"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small logs, short windows")
    args = ap.parse_args(argv)
    if not Path("/usr/bin/time").exists():
        print("scaling: /usr/bin/time (GNU time) is needed for peak RSS", file=sys.stderr)
        return 2
    quick = args.quick
    with tempfile.TemporaryDirectory(prefix="lw-scaling-") as d:
        tmp = Path(d)
        sizes = log_sizes(tmp, quick)
        gpus = gpu_counts((1, 8, 64), 3.0 if quick else 20.0)
        idle = idle_daemon(tmp, 10.0 if quick else 60.0)
        scrapes = scrape_costs(((1, 1), (8, 16), (64, 64)), 20 if quick else 100)
    print(
        f"time_growth={growth(sizes):.2f} rss_first_mb={sizes[0]['rss_mb']:.1f} "
        f"rss_last_mb={sizes[-1]['rss_mb']:.1f} gpu64_cpu_pct={gpus[-1]['pct']:.3f} "
        f"idle_cpu_pct={idle:.3f} scrape_ms_max={max(r['ms'] for r in scrapes):.2f} "
        f"series_max={max(r['series'] for r in scrapes):.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
