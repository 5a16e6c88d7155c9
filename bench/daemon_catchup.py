"""The real daemon catching up on a load-phase log: event log folded or not, beside mtail.

    .venv/bin/python bench/daemon_catchup.py [--quick] [--runs N]

The load-phase log of bench/throughput_vs_mtail.py (bench/loggen.py, seeded: Kimi-K2.5-like
starts, ~200,000 lines, nearly every line a k/v scale warning or a bar update; 20,000 with
--quick) is there when `loadwatch run --log FILE --events-file EVENTS --gpu none` starts, as
after a restart of the host. Timed: from the spawn until /metrics says the daemon read every
byte and counted every k/v scale warning the generator wrote (`loadwatch_events_total`), less
the same daemon's time to answer /metrics on an empty log (its start). Side by side, runs
alternating: the default (`[events] fold = true`: a run of plain k/v warnings is one event and
one line), `fold = false` (one event-log line per record), and `mtail --one_shot` on the same
file (its wall time less its wall time on an empty file) when it is installed. The last line is
key=value pairs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from loggen import load_log
from throughput_vs_mtail import MTAIL_PROGRAM, measured

EXE = shutil.which("loadwatch", path=str(Path(sys.executable).parent)) or "loadwatch"


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        body = r.read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def catch_up_s(log: Path, tmp: Path, fold: bool, kv: int) -> float:
    """Seconds from the spawn until the daemon has read every byte of `log` and counted `kv`
    k/v scale warnings (an empty log, 0: until it answers at all)."""
    size = log.stat().st_size
    run = Path(tempfile.mkdtemp(dir=tmp))
    cfg = run / "c.toml"
    cfg.write_text(f"[events]\nfold = {'true' if fold else 'false'}\n")
    events = run / "events.jsonl"
    argv = [EXE, "run", "--config", str(cfg), "--log", str(log), "--gpu", "none"]
    argv += [
        "--state-dir",
        str(run / "st"),
        "--listen",
        "127.0.0.1:0",
        "--events-file",
        str(events),
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        while url is None:
            if proc.poll() is not None:
                raise RuntimeError(f"loadwatch run exited {proc.returncode}: {proc.stderr}")
            for line in events.read_text().splitlines() if events.exists() else []:
                if '"daemon.listening"' in line:
                    url = line.split('"url": "', 1)[1].split('"', 1)[0]
            time.sleep(0.005)
        while True:
            m = metrics(url)
            if (
                m.get("loadwatch_log_read_bytes_total", -1) >= size
                and m.get('loadwatch_events_total{type="kv_scale_warning"}', 0) >= kv
            ):
                return time.perf_counter() - start
            time.sleep(0.01)
    finally:
        proc.terminate()
        proc.wait(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lw-catchup-"))
    try:
        log, empty = tmp / "load.log", tmp / "empty.log"
        truth = load_log(log, 20_000 if args.quick else 200_000, seed=1)
        empty.write_bytes(b"")
        lines = log.read_bytes().count(b"\n")
        kv = truth.kv_scale_warnings
        progs = tmp / "progs"
        progs.mkdir()
        (progs / "vllm_load.mtail").write_text(MTAIL_PROGRAM.read_text())
        mtail = shutil.which("mtail")
        times: dict[str, list[float]] = {"fold": [], "per record": [], "start": [], "mtail": []}
        for _ in range(args.runs):
            times["start"].append(catch_up_s(empty, tmp, True, 0))
            times["fold"].append(catch_up_s(log, tmp, True, kv))
            times["per record"].append(catch_up_s(log, tmp, False, kv))
            if mtail:
                mt = [mtail, "--one_shot", "--one_shot_format=prometheus", "--progs", str(progs)]
                net = measured([*mt, "--logs", str(log)]).wall_s
                times["mtail"].append(net - measured([*mt, "--logs", str(empty)]).wall_s)
        med = {k: statistics.median(v) for k, v in times.items() if v}
        start = med["start"]
        fold, per_record = med["fold"] - start, med["per record"] - start
        print(
            f"load-phase log: {lines:,} lines, {kv:,} k/v scale warnings; {args.runs} runs, median"
        )
        print(f"daemon start (empty log): {start:.2f} s")
        rate = lines / per_record
        print(f"daemon, folded runs (default):        {fold:.2f} s = {lines / fold:,.0f} lines/s")
        print(f"daemon, [events] fold = false:        {per_record:.2f} s = {rate:,.0f} lines/s")
        out = (
            f"fold_s={fold:.2f} per_record_s={per_record:.2f} fold_speedup={per_record / fold:.2f}"
        )
        if "mtail" in med:
            print(f"mtail --one_shot:                     {med['mtail']:.2f} s")
            out += f" mtail_s={med['mtail']:.2f} fold_vs_mtail={med['mtail'] / fold:.2f}"
            out += f" per_record_vs_mtail={med['mtail'] / per_record:.2f}"
        print(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
