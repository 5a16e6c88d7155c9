"""The live-cost bench's CPU meter (bench/proctree.py `TreeCpu`): in a cgroup of the process's
own, the CPU of a child that already exited counts (the HTTP server threads a scrape starts and
ends do); read from /proc, only what is alive does. Real processes burning real CPU."""

from __future__ import annotations

import subprocess
import sys

from bench.proctree import TreeCpu

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
PARENT = (
    "import sys\n"
    + "sys.stdin.readline()\n"  # burns nothing until the meter holds it
    + BURN.format(s=0.3)
    + "import subprocess, sys\n"
    + f"subprocess.run([sys.executable, '-c', {BURN.format(s=0.4)!r}], check=True)\n"
    + "print('done', flush=True)\n"
    + "sys.stdin.read()\n"  # alive until told: its child has exited by then
)


def test_the_cpu_of_a_child_that_exited_counts_in_a_cgroup() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    meter = TreeCpu(proc.pid)
    try:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout is not None and proc.stdout.readline() == "done\n"
        seconds = meter.seconds()
    finally:
        proc.communicate("")
        meter.close()
    if meter.method == "/proc ticks":  # no cgroup can be made here: the parent alone is seen
        assert 0.3 <= seconds < 0.7
    else:
        assert meter.method in ("cgroup v2 cpu.stat", "cgroup v1 cpuacct")
        assert seconds >= 0.7  # the parent's 0.3 s and its exited child's 0.4 s
