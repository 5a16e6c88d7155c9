"""Log throughput of loadwatch against the tools an operator would pick instead, same run, same input.

    .venv/bin/python bench/throughput_vs_mtail.py [--quick] [--runs N] [--keep DIR]
                                                 [--only SHAPE ...] [--python PATH]

One vLLM log per shape of bench/loggen.py is generated in the real byte format (seeded, into a
temp dir; the generator knows what each holds): seven load-phase shapes (Kimi-K2.5-like starts:
119 shards, 8 workers, per-layer k/v scale warnings, repeated to ~200,000 lines): `blocks`
(each layer's warnings worker after worker, the weights bar after a lone process-prefix record),
`interleaved` (the 8 workers' warnings interleaved, the bar with its prefix in the same record),
`interleaved-lone` (interleaved, the bar after a lone prefix record), `coloured` (that with
every process prefix in colour codes, as vLLM printed them before 2025-11), `compose` (that
read through `docker compose logs`: `vllm-1  | ` before every line), `tty` (prefixes and
headers coloured, as vLLM prints them on a terminal since 2025-11), `old-header` (the header
before 2025-02: `src] `, no opening bracket); and two serving-phase
shapes of 1,000,000 lines (a few restarts, one of them dying of a CUDA OOM): `serving`
(request, access and statistics lines, prompts that say "ERROR" or "CUDA out of memory") and
`requests` (vLLM 0.32's `--enable-log-requests` lines with the prompts and outputs echoed,
`Added request`, uvicorn's access lines). On each, every tool runs as its own process, `--runs`
times (median), the tools interleaved:

- `wc -l`: the read bound;
- `grep -c -E` with the alternation of loadwatch's pre-filter needles;
- mtail (`--one_shot`) with bench/vllm_load.mtail, which extracts the same facts;
- a naive Python loop: every line through every regex of that mtail program;
- loadwatch's pipeline as the daemon runs it: `LogFollower(path, mode="poll")` reads, its chunks
  `joined` as the log source joins them, `ChunkScanner().feed(chunk.data, chunk.offset,
  chunk.file_id)` (one event per record), `LoadState.apply_run(events, now)` (a chunk's events
  in one call), with the C search (parsers/_scan.c) when it is built; beside it the same
  pipeline with the Python search ("loadwatch py").

Throughput is lines / (wall time - the same tool's wall time on an empty file), so process start
(mtail compiling its program, Python importing) counts for no tool. Peak RSS is the process's
(GNU time).
loadwatch's counts come from the final `LoadState` snapshot plus the state's lifetime totals
(`LoadState.lifetime`: kv-scale warnings summed over sessions, sessions that failed with a CUDA
OOM, ready sessions; weight-bar updates counted from events), and compared with the ground truth
the generator knows (mtail's too: its patterns read an echoed prompt that quotes a vLLM line as
that line). The closing table puts each shape's loadwatch and mtail side by side; the last line
is key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from loadwatch.parsers.scan import NATIVE

if TYPE_CHECKING:  # (a worker may run another checkout's loadwatch, whose sim lacks the shapes)
    from loggen import Truth

HERE = Path(__file__).resolve().parent
MTAIL_PROGRAM = HERE / "vllm_load.mtail"
FACTS = (
    "sessions",
    "ready",
    "weight_updates",
    "kv_scale_warnings",
    "oom_failures",
    "shards_done",
    "shards_total",
)

# The naive loop's regexes: the mtail program's, one per fact. (Its header, in each form vLLM
# prints: bracketed, before 2025-02 without the opening bracket, coloured on a terminal.)
_HEADER = rb"%s(\x1b\[0m)? (\x1b\[90m)?\d\d-\d\d \d\d:\d\d:\d\d(\x1b\[0m)? (\x1b\[90m)?\[?\S+\](\x1b\[0m)?"
NAIVE = {
    "kv_scale_warnings": _HEADER % b"WARNING" + rb" Found [kv]_scale in the checkpoint \(e\.g\. ",
    "weight_updates": rb"Loading safetensors checkpoint shards: +\d+% Completed \| (\d+)/(\d+) \[",
    "oom_failures": _HEADER % b"ERROR" + rb" (torch\.)?OutOfMemoryError: CUDA out of memory",
    "sessions": rb"  version \d\S*$",
    "model_load_start": rb"Starting to load model ",
    "weights_loaded": rb"Loading weights took ",
    "ready": rb"INFO:\s+Application startup complete",
}


# -- workers: run in a child process, print one JSON line ----------------------------------------


def work_loadwatch(path: str, native: bool = True) -> dict[str, object]:
    from loadwatch.daemon.sources.inputs import joined
    from loadwatch.daemon.sources.log.follower import LogFollower
    from loadwatch.daemon.state.loadstate import LoadState
    from loadwatch.parsers import ChunkScanner, EventStream, ShardProgress

    clock = time.time
    start = time.perf_counter()
    follower = LogFollower(path, mode="poll")
    scanner = ChunkScanner(EventStream(ref_ts=clock()), native=native)
    state = LoadState()
    weight_updates = 0
    while True:
        for chunk in joined(follower.read()):  # as the daemon's log source hands them over
            events = scanner.feed(chunk.data, chunk.offset, chunk.file_id)
            for ev in events:
                if type(ev) is ShardProgress and ev.bar == "weights":
                    weight_updates += 1
            state = state.apply_run(events, clock())  # a chunk's events in one call
        if not follower.backlog:
            break
    elapsed = time.perf_counter() - start
    lines = follower.health().records_total
    follower.close(checkpoint=False)
    snap = state.snapshot(clock())
    s = snap.session
    life = state.lifetime  # the sessions before the current one, as the daemon exports them
    current_kv = 0
    if s is not None:
        current_kv = sum(w.count for w in s.warnings if w.code == "kv_scale_missing")
    counts = {
        "sessions": snap.sessions_total,
        "ready": life.ready + (1 if s is not None and s.ready_at is not None else 0),
        "weight_updates": weight_updates,
        "kv_scale_warnings": life.warnings.get("kv_scale_missing", 0) + current_kv,
        "oom_failures": life.failures.get("cuda_oom", 0)
        + (1 if s is not None and s.failure_kind == "cuda_oom" else 0),
        "shards_done": s.progress.shards_done if s is not None else None,
        "shards_total": s.progress.shards_total if s is not None else None,
    }
    return {"counts": counts, "elapsed_s": elapsed, "lines": lines, "quiet": scanner.quiet}


def work_naive(path: str) -> dict[str, object]:
    patterns = [(name, re.compile(p)) for name, p in NAIVE.items()]
    bar = re.compile(NAIVE["weight_updates"])
    counts = dict.fromkeys(NAIVE, 0)
    done = total = None
    start = time.perf_counter()
    lines = 0
    with open(path, "rb") as f:
        for line in f:
            lines += 1
            for name, p in patterns:
                if p.search(line):
                    counts[name] += 1
                    if name == "weight_updates":
                        m = bar.search(line)
                        assert m is not None
                        done, total = int(m.group(1)), int(m.group(2))
    elapsed = time.perf_counter() - start
    out = {k: counts[k] for k in FACTS if k in counts}
    out["shards_done"], out["shards_total"] = done, total
    return {"counts": out, "elapsed_s": elapsed, "lines": lines}


WORKERS: dict[str, Callable[[str], dict[str, object]]] = {
    "loadwatch": work_loadwatch,
    "py": lambda path: work_loadwatch(path, native=False),
    "naive": work_naive,
}


# -- measuring processes ------------------------------------------------------------------------


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    rss_mb: float
    stdout: str


def measured(argv: list[str]) -> Run:
    """Run `argv` once: its wall time, CPU time and peak RSS. GNU time forks it from a small
    process: a child of this Python process would report this process's RSS as its own peak
    (the kernel keeps the peak across the exec)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as times:
        start = time.perf_counter()
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%U %S %M", "-o", times.name, *argv],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if proc.returncode not in (0, 1):  # grep -c exits 1 when nothing matched
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
        user, sys_s, rss_kb = times.read().split()[-3:]
    return Run(wall, float(user) + float(sys_s), int(rss_kb) / 1024, proc.stdout)


@dataclass
class Tool:
    name: str
    argv: Callable[[Path], list[str]]
    counts: Callable[[str], dict[str, int | None]] | None
    runs: list[Run] = field(default_factory=list)
    empty: list[Run] = field(default_factory=list)
    found: dict[str, int | None] = field(default_factory=dict)
    note: str = ""

    def wall(self) -> float:
        return statistics.median(r.wall_s for r in self.runs)

    def net(self) -> float:
        base = statistics.median(r.wall_s for r in self.empty) if self.empty else 0.0
        return max(self.wall() - base, 1e-6)

    def cpu(self) -> float:
        return statistics.median(r.cpu_s for r in self.runs)

    def rss(self) -> float:
        return max(r.rss_mb for r in self.runs)


def mtail_counts(out: str) -> dict[str, int | None]:
    values: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name == "vllm_milestones_total":
            continue
        values[name] = float(value)

    def get(name: str) -> int | None:
        return int(values[name]) if name in values else None

    return {
        "sessions": get("vllm_sessions_total") or 0,
        "ready": get("vllm_ready_total") or 0,
        "weight_updates": get("vllm_weight_updates_total") or 0,
        "kv_scale_warnings": get("vllm_kv_scale_warnings_total") or 0,
        "oom_failures": get("vllm_oom_failures_total") or 0,
        "shards_done": get("vllm_shards_done"),
        "shards_total": get("vllm_shards_total"),
    }


def worker_counts(out: str) -> dict[str, int | None]:
    doc = json.loads(out.strip().splitlines()[-1])
    counts: dict[str, int | None] = doc["counts"]
    return counts


def grep_pattern() -> str:
    from loadwatch.parsers.vllm.segment import PREFILTER

    def ere(s: str) -> str:
        return re.sub(r"([.[\]()*+?{}|^$\\])", r"\\\1", s)

    return "|".join(ere(n) for n in PREFILTER["startup"])


def tools(progs: Path, py: str = sys.executable) -> list[Tool]:
    me = str(Path(__file__).resolve())
    pattern = grep_pattern()
    return [
        Tool("wc -l", lambda p: ["wc", "-l", str(p)], None),
        Tool("grep -c -E", lambda p: ["grep", "-c", "-E", pattern, str(p)], None),
        Tool(
            "mtail",
            lambda p: [
                "mtail",
                "--one_shot",
                "--one_shot_format=prometheus",
                "--progs",
                str(progs),
                "--logs",
                str(p),
            ],
            mtail_counts,
        ),
        Tool("naive python", lambda p: [py, me, "--worker", "naive", str(p)], worker_counts),
        Tool("loadwatch", lambda p: [py, me, "--worker", "loadwatch", str(p)], worker_counts),
        # the same pipeline with the searches in Python (when the C ones are built)
        *(
            [Tool("loadwatch py", lambda p: [py, me, "--worker", "py", str(p)], worker_counts)]
            if NATIVE
            else []
        ),
    ]


def measure(log: Path, empty: Path, runs: int, progs: Path, py: str = sys.executable) -> list[Tool]:
    ts = tools(progs, py)
    for t in ts:
        t.empty.append(measured(t.argv(empty)))
    for _ in range(runs):  # interleaved, so a busy spell hits every tool alike
        for t in ts:
            t.runs.append(measured(t.argv(log)))
            t.empty.append(measured(t.argv(empty)))
    for t in ts:
        last = t.runs[-1].stdout
        if t.counts is not None:
            t.found = t.counts(last)
        elif t.name.startswith("grep"):
            t.note = f"{int(last.strip() or 0):,} lines matched"
        else:
            t.note = f"{int(last.split()[0]):,} lines"
    return ts


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    return f"{x / 1e3:.0f}k"


def report(title: str, log: Path, truth: Truth, ts: list[Tool]) -> dict[str, float]:
    lines = truth.lines
    size_mb = log.stat().st_size / 1e6
    print(f"\n== {title}: {lines:,} lines, {size_mb:.1f} MB ==")
    print("ground truth: " + "  ".join(f"{k} {getattr(truth, k)}" for k in FACTS))
    head = (
        f"{'tool':<13} {'wall s':>7} {'start s':>7} {'lines/s':>8} {'CPU s':>6} {'RSS MB':>7}  "
        + " ".join(f"{k[:10]:>10}" for k in FACTS)
        + "  vs truth"
    )
    print(head)
    rates: dict[str, float] = {}
    for t in ts:
        base = statistics.median(r.wall_s for r in t.empty)
        rate = lines / t.net()
        rates[t.name] = rate
        if t.found:
            cells = " ".join(f"{_cell(t.found.get(k)):>10}" for k in FACTS)
            diff = [k for k in FACTS if t.found.get(k) != getattr(truth, k)]
            verdict = "equal" if not diff else "differs: " + ", ".join(diff)
        else:
            cells = f"{t.note:>{11 * len(FACTS) - 1}}"
            verdict = ""
        print(
            f"{t.name:<13} {t.wall():>7.2f} {base:>7.2f} {fmt_rate(rate):>8} {t.cpu():>6.2f} "
            f"{t.rss():>7.1f}  {cells}  {verdict}"
        )
    lw = rates["loadwatch"]
    print(
        f"loadwatch: {lw / rates['mtail']:.1f}x mtail, {lw / rates['naive python']:.1f}x the naive "
        f"loop, {lw / rates['grep -c -E']:.2f}x grep, {lw / rates['wc -l']:.3f}x wc -l"
        + (f", {lw / rates['loadwatch py']:.1f}x its Python search" if NATIVE else "")
    )
    return rates


def _cell(v: int | None) -> str:
    return "-" if v is None else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small logs, one run: a smoke test")
    ap.add_argument("--runs", type=int, default=None, help="runs per tool (median; default 3)")
    ap.add_argument("--keep", type=Path, help="write the logs here and keep them")
    ap.add_argument("--only", nargs="*", help="shapes to measure (default: all)")
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter whose loadwatch the workers run (another checkout's venv)",
    )
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "LOG"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, path = args.worker
        print(json.dumps(WORKERS[kind](path)))
        return 0
    for tool in ("wc", "grep", "mtail", "/usr/bin/time"):
        if shutil.which(tool) is None:
            print(f"throughput_vs_mtail: {tool} not found (run ./scripts/ensure-tools.sh)")
            return 2
    from loggen import LOAD_SHAPES, SERVING_SHAPES, load_log, serving_log

    runs = args.runs or (1 if args.quick else 3)
    load_lines, serving_lines = (20_000, 100_000) if args.quick else (200_000, 1_000_000)
    rows: list[tuple[str, int, dict[str, float], bool, bool]] = []
    with tempfile.TemporaryDirectory(prefix="lw-throughput-") as tmp:
        d = args.keep or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        progs = Path(tmp) / "progs"
        progs.mkdir()
        shutil.copy(MTAIL_PROGRAM, progs / MTAIL_PROGRAM.name)
        empty = d / "empty.log"
        empty.write_bytes(b"")
        print(f"logs in {d}; {runs} run(s) per tool, median; lines/s = lines / (wall - wall on")
        print("an empty file)", flush=True)
        for shape in (*LOAD_SHAPES, *SERVING_SHAPES):
            if args.only and shape not in args.only:
                continue
            log = d / f"{shape}.log"
            if shape in LOAD_SHAPES:
                truth = load_log(log, load_lines, seed=1, shape=shape)
            else:
                truth = serving_log(log, serving_lines, seed=1, shape=shape)
            ts = measure(log, empty, runs, progs, args.python)
            rates = report(f"{shape} log", log, truth, ts)
            want = {k: getattr(truth, k) for k in FACTS}
            equal = {t.name: t.found == want for t in ts if t.counts is not None}
            rows.append((shape, truth.lines, rates, equal["loadwatch"], equal["mtail"]))
    print(
        f"\nloadwatch's candidate search: {'C (parsers/_scan.c)' if NATIVE else 'Python (not built)'}"
    )
    print(
        f"{'shape':<17} {'lines':>9} {'mtail/s':>9} {'loadwatch/s':>11} {'x mtail':>8}  counts equal"
    )
    out = []
    for shape, lines, rates, lw_equal, mt_equal in rows:
        x = rates["loadwatch"] / rates["mtail"]
        print(
            f"{shape:<17} {lines:>9,} {fmt_rate(rates['mtail']):>9} "
            f"{fmt_rate(rates['loadwatch']):>11} {x:>7.2f}x  loadwatch {lw_equal}, mtail {mt_equal}"
        )
        out.append(
            f"{shape.replace('-', '_')}_x_mtail={x:.2f} {shape.replace('-', '_')}_equal={int(lw_equal)}"
        )
    print(" ".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
