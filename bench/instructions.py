"""Instructions `loadwatch analyze` executes on logs of every shape, build against build.

    .venv/bin/python bench/instructions.py [--lines N] [--exe PATH ...] [--only SHAPE ...]

Wall-clock ratios on a shared two-core machine move by a third from run to run, which hides a
change of a tenth. The instructions a process executes do not move: this counts them with
valgrind's cachegrind (Debian `valgrind`) for `EXE analyze --json LOG`, per build (this venv's
`loadwatch` first, then each `--exe`: an older checkout's venv), on one log per shape of
bench/loggen.py (seeded, `--lines` each; the serving shapes ten times that) and on a one-line
log (the start). Printed per shape: each build's millions of instructions less its start, and
each build's ratio to the first (`x b0`). Every build is run once unmeasured first, with bytecode
writing allowed, so that no build is counted compiling its own sources.

mtail is not measured here: a Go program under valgrind is not a fair count. The ratios to
mtail are daemon_catchup.py's and throughput_vs_mtail.py's, side by side in wall time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from loggen import LOAD_SHAPES, SERVING_SHAPES, load_log, serving_log

EXE = shutil.which("loadwatch", path=str(Path(sys.executable).parent)) or "loadwatch"


def instructions(exe: str, log: Path) -> int:
    """Instructions `exe analyze --json log` executed, as cachegrind counts them."""
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    proc = subprocess.run(
        [*argv, exe, "analyze", "--json", str(log)], capture_output=True, text=True, check=False
    )
    for line in proc.stderr.splitlines():
        if "I   refs:" in line or "I    refs:" in line:
            return int(line.rsplit(":", 1)[1].replace(",", "").strip())
    raise RuntimeError(f"no instruction count from valgrind for {exe}: {proc.stderr[-300:]}")


def warm(exe: str, log: Path) -> None:
    """One run unmeasured, its bytecode written where it may be (a build's first run compiles
    its sources, which no later run does)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([exe, "analyze", "--json", str(log)], capture_output=True, env=env, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--lines", type=int, default=20_000, help="lines of each load-phase log")
    ap.add_argument("--exe", action="append", default=[], help="another build's loadwatch")
    ap.add_argument("--only", nargs="*", help="shapes to measure (default: all)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    exes = [EXE, *args.exe]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        logs: dict[str, Path] = {}
        for shape in LOAD_SHAPES:
            if not args.only or shape in args.only:
                load_log(d / f"{shape}.log", lines=args.lines, shape=shape)
                logs[shape] = d / f"{shape}.log"
        for shape in SERVING_SHAPES:
            if not args.only or shape in args.only:
                serving_log(d / f"{shape}.log", lines=10 * args.lines, shape=shape)
                logs[shape] = d / f"{shape}.log"
        one = d / "one.log"
        one.write_text("x\n")
        for exe in exes:
            warm(exe, one)
        starts = [instructions(exe, one) for exe in exes]
        print("builds: " + "; ".join(f"{i}: {exe}" for i, exe in enumerate(exes)))
        print("start (a one-line log), millions: " + "  ".join(f"{s / 1e6:,.0f}" for s in starts))
        print(
            f"{'shape':<18} "
            + "  ".join(f"{f'build {i} M':>12} {'x b0':>6}" for i in range(len(exes)))
        )
        for shape, log in logs.items():
            net = [instructions(exe, log) - s for exe, s in zip(exes, starts, strict=True)]
            cells = "  ".join(f"{n / 1e6:>12,.0f} {n / net[0]:>5.3f}x" for n in net)
            print(f"{shape:<18} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
