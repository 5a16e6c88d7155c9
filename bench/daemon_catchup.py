"""The real daemon and `loadwatch analyze` catching up on logs of every shape, beside mtail.

    .venv/bin/python bench/daemon_catchup.py [--quick] [--runs N] [--exe PATH] [--load-lines N]

One log per shape of bench/loggen.py (seeded): the seven load-phase shapes (Kimi-K2.5-like
starts, ~100,000 lines, nearly every line a k/v scale warning or a bar update: warnings in
blocks with the bar after a lone prefix record, the 8 workers' warnings interleaved with the
bar's prefix on its own record, interleaved with the bar after a lone prefix, that with every
prefix coloured as vLLM printed it before 2025-11, that read through `docker compose logs`,
its service column before every line, that with prefixes and headers coloured as vLLM prints
them on a terminal since 2025-11, and that with the header vLLM wrote before 2025-02) and the
two serving-phase shapes (~1,000,000 lines: kimilog.py's request lines, and vLLM 0.32's logged
requests with prompts and outputs echoed); a tenth of that with --quick; `--load-lines` sets
the load-phase logs' length (at 200,000, the starts weigh half what they do by default). Per
shape, runs alternating tool by tool, each timed from its spawn:

- the daemon: `loadwatch run --log FILE --events-file EVENTS --gpu none` (the default
  configuration), the log there when it starts, as after a restart of the host: until
  /metrics says it read every byte and counted every k/v scale warning the generator wrote,
  less the same daemon's time to answer /metrics on a log of one line (its start);
- `loadwatch analyze --json FILE`, less its time on that one-line log;
- `mtail --one_shot` with bench/vllm_load.mtail, less its time on that one-line log.

lines/s = lines / that net time (median of the runs); each tool's ratio to mtail is taken
within the run, and the least and the most it was in one run are printed after the table.
`whole`: analyze's ratio to mtail with both starts left in, as someone timing the two commands
sees it (on a log this short loadwatch's start, a few tenths of a second against mtail's
hundredth, is a large share; the floors are on the net rates).
Counts are checked against the generator's truth: the daemon's from /metrics (sessions, k/v
scale warnings, weight-bar updates, CUDA OOM failures, the last bar's shards), analyze's from
its JSON report (on a log of more starts than it keeps in full, `yes*`: its session count and
the last bar only), mtail's from its own counters. `--exe` measures another build's `loadwatch` (an older
checkout's venv) on the same logs. The floors: the daemon and analyze at least 1x mtail on
every load-phase shape and 10x on every serving shape. The last line is key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from loggen import LOAD_SHAPES, SERVING_SHAPES, Truth, load_log, serving_log
from throughput_vs_mtail import FACTS, MTAIL_PROGRAM, mtail_counts

EXE = shutil.which("loadwatch", path=str(Path(sys.executable).parent)) or "loadwatch"
FLOORS = {"load": 1.0, "serving": 10.0}  # x mtail, for the daemon and for analyze
# The facts the daemon's /metrics and analyze's report both give (`ready` has no counter).
CHECKED = tuple(f for f in FACTS if f != "ready")


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        body = r.read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def daemon_counts(m: dict[str, float]) -> dict[str, int | None]:
    def get(name: str) -> int | None:
        return int(m[name]) if name in m else None

    return {
        "sessions": get("loadwatch_sessions_total"),
        "weight_updates": get('loadwatch_events_total{type="shard_progress"}') or 0,
        "kv_scale_warnings": get('loadwatch_warnings_total{code="kv_scale_missing"}') or 0,
        "oom_failures": get('loadwatch_failures_total{kind="cuda_oom"}') or 0,
        "shards_done": get("loadwatch_load_shards_done"),
        "shards_total": get("loadwatch_load_shards"),
    }


def catch_up(exe: str, log: Path, tmp: Path, kv: int) -> tuple[float, dict[str, int | None]]:
    """Seconds from the spawn until the daemon has read every byte of `log` and counted `kv`
    k/v scale warnings, and its counts then."""
    size = log.stat().st_size
    run = Path(tempfile.mkdtemp(dir=tmp))
    events = run / "events.jsonl"
    argv = [exe, "run", "--log", str(log), "--gpu", "none", "--state-dir", str(run / "st")]
    argv += ["--listen", "127.0.0.1:0", "--events-file", str(events)]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        while url is None:
            if proc.poll() is not None:
                raise RuntimeError(f"loadwatch run exited {proc.returncode}: {proc.stderr}")
            for line in events.read_text().splitlines() if events.exists() else []:
                if '"daemon.listening"' in line:
                    url = json.loads(line)["url"]
            time.sleep(0.005)
        while True:
            m = metrics(url)
            if (
                m.get("loadwatch_log_read_bytes_total", -1) >= size
                and m.get('loadwatch_events_total{type="kv_scale_warning"}', 0) >= kv
            ):
                return time.perf_counter() - start, daemon_counts(m)
            time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(run, ignore_errors=True)


def analyze_counts(doc: dict[str, object]) -> dict[str, int | None]:
    sessions = doc["sessions"]
    assert isinstance(sessions, list)
    last = sessions[-1]["progress"] if sessions else {}
    total = int(doc["sessions_total"])  # type: ignore[call-overload]
    if doc.get("sessions_omitted"):  # not every session in full: the totals that are whole
        return {"sessions": total, "shards_done": last.get("shards_done"),
                "shards_total": last.get("shards_total")}  # fmt: skip
    return {
        "sessions": total,
        "weight_updates": sum(
            b["updates"] for s in sessions for b in s["bars"] if b["desc"].startswith("Loading")
        ),
        "kv_scale_warnings": sum(
            w["count"] for s in sessions for w in s["warnings"] if w["code"] == "kv_scale_missing"
        ),
        "oom_failures": sum(1 for s in sessions if s["failure_kind"] == "cuda_oom"),
        "shards_done": last.get("shards_done"),
        "shards_total": last.get("shards_total"),
    }


def analyze(exe: str, log: Path) -> tuple[float, dict[str, int | None]]:
    start = time.perf_counter()
    proc = subprocess.run([exe, "analyze", "--json", str(log)], capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1, 2):  # ready, failed, incomplete
        raise RuntimeError(f"loadwatch analyze exited {proc.returncode}: {proc.stderr[-300:]}")
    return took, analyze_counts(json.loads(proc.stdout)) if proc.stdout.strip() else {}


def mtail(progs: Path, log: Path) -> tuple[float, dict[str, int | None]]:
    argv = ["mtail", "--one_shot", "--one_shot_format=prometheus", "--progs", str(progs)]
    start = time.perf_counter()
    proc = subprocess.run([*argv, "--logs", str(log)], capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"mtail exited {proc.returncode}: {proc.stderr[-300:]}")
    return took, mtail_counts(proc.stdout)


@dataclass
class Shape:
    name: str
    phase: str  # "load" or "serving"
    log: Path
    truth: Truth
    times: dict[str, list[float]] = field(default_factory=dict)
    counts: dict[str, dict[str, int | None]] = field(default_factory=dict)

    def equal(self, tool: str) -> bool:
        """Every count the tool gave equals the generator's (analyze, on a log of more starts
        than it keeps in full, gives only its session count and the last bar: `partial`)."""
        got = self.counts.get(tool, {})
        return bool(got) and all(v == getattr(self.truth, k) for k, v in got.items())

    def partial(self, tool: str) -> bool:
        return 0 < len(self.counts.get(tool, {})) < len(CHECKED)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--load-lines", type=int, help="lines of each load-phase log")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--exe", default=EXE, help="the loadwatch to measure (default: this venv's)")
    ap.add_argument("--only", nargs="*", help="shapes to measure (default: all)")
    args = ap.parse_args()
    if shutil.which("mtail") is None:
        print("daemon_catchup: mtail not found (run ./scripts/ensure-tools.sh)")
        return 2
    scale = 10 if args.quick else 1
    tmp = Path(tempfile.mkdtemp(prefix="lw-catchup-"))
    try:
        progs = tmp / "progs"
        progs.mkdir()
        (progs / "vllm_load.mtail").write_text(MTAIL_PROGRAM.read_text())
        shapes: list[Shape] = []
        for name in (*LOAD_SHAPES, *SERVING_SHAPES):
            if args.only and name not in args.only:
                continue
            log = tmp / f"{name}.log"
            if name in LOAD_SHAPES:
                shapes.append(
                    Shape(
                        name,
                        "load",
                        log,
                        load_log(log, args.load_lines or 100_000 // scale, 1, name),
                    )
                )
            else:
                truth = serving_log(log, 1_000_000 // scale, 1, shape=name)
                shapes.append(Shape(name, "serving", log, truth))
        # the start: each tool on a log of one line (analyze refuses an empty one)
        empty = tmp / "one-line.log"
        empty.write_bytes(shapes[0].log.read_bytes().split(b"\n", 1)[0] + b"\n")
        base: dict[str, list[float]] = {"daemon": [], "analyze": [], "mtail": []}
        print(f"measuring {args.exe}; {args.runs} runs, median of net times", flush=True)
        for _ in range(args.runs):
            base["daemon"].append(catch_up(args.exe, empty, tmp, 0)[0])
            base["analyze"].append(analyze(args.exe, empty)[0])
            base["mtail"].append(mtail(progs, empty)[0])
            for sh in shapes:
                for tool, took_counts in (
                    (
                        "daemon",
                        lambda s=sh: catch_up(args.exe, s.log, tmp, s.truth.kv_scale_warnings),
                    ),
                    ("analyze", lambda s=sh: analyze(args.exe, s.log)),
                    ("mtail", lambda s=sh: mtail(progs, s.log)),
                ):
                    took, counts = took_counts()
                    sh.times.setdefault(tool, []).append(took)
                    sh.counts[tool] = counts
        return report(shapes, {k: statistics.median(v) for k, v in base.items()})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(shapes: list[Shape], start: dict[str, float]) -> int:
    print(
        "starts (a one-line log): "
        + ", ".join(f"{tool} {s:.2f} s" for tool, s in start.items())
        + "\n"
    )
    head = f"{'shape':<17} {'lines':>9}  {'mtail/s':>8}  {'daemon/s':>8} {'x mtail':>7}  "
    print(
        head + f"{'analyze/s':>9} {'x mtail':>7} {'whole':>6}  counts equal (daemon analyze mtail)"
    )
    out = []
    spread: list[str] = []
    met = True
    partial = False
    for sh in shapes:
        lines = sh.truth.lines
        rate = {t: lines / max(statistics.median(v) - start[t], 1e-3) for t, v in sh.times.items()}
        dx, ax = rate["daemon"] / rate["mtail"], rate["analyze"] / rate["mtail"]
        whole = statistics.median(sh.times["mtail"]) / statistics.median(sh.times["analyze"])
        floor = FLOORS[sh.phase]
        ok = dx >= floor and ax >= floor and sh.equal("daemon") and sh.equal("analyze")
        met = met and ok
        eq = " ".join(
            ("yes*" if sh.partial(t) else "yes") if sh.equal(t) else "NO"
            for t in ("daemon", "analyze", "mtail")
        )
        partial = partial or sh.partial("analyze")
        print(
            f"{sh.name:<17} {lines:>9,}  {rate['mtail']:>8,.0f}  {rate['daemon']:>8,.0f} "
            f"{dx:>6.2f}x  {rate['analyze']:>9,.0f} {ax:>6.2f}x {whole:>5.2f}x  {eq}"
            + ("" if ok else f"  (floor {floor:g}x not met)")
        )
        spread.append(
            f"{sh.name}: daemon {_span(sh, 'daemon', start)}, analyze {_span(sh, 'analyze', start)}"
        )
        key = sh.name.replace("-", "_")
        out.append(
            f"{key}_daemon_x={dx:.2f} {key}_analyze_x={ax:.2f} {key}_analyze_whole_x={whole:.2f}"
        )
    if partial:
        print("* more starts than analyze keeps in full: its session count and last bar compared")
    print("each run's own ratio (min-max): " + "; ".join(spread))
    print(" ".join(out) + f" floors_met={int(met)}")
    return 0


def _span(sh: Shape, tool: str, start: dict[str, float]) -> str:
    """The least and the most `tool`'s ratio to mtail was in one run (the same start taken off
    each), to tell a change from what the machine's other load does to one run."""
    ratios = [
        max(m - start["mtail"], 1e-3) / max(t - start[tool], 1e-3)
        for t, m in zip(sh.times[tool], sh.times["mtail"], strict=True)
    ]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


if __name__ == "__main__":
    raise SystemExit(main())
