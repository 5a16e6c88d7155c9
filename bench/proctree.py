"""The real daemon as a process for the benchmarks, and the CPU and memory of a process and its
descendants, read from /proc (the daemon runs its HTTP server in a child process, so its cost
is the tree's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def daemon(log: Path, state_dir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`loadwatch run` on `log` with simulated GPUs, listening on a free loopback port: yields
    the process and its URL once it listens; its event log is read and dropped meanwhile (a
    full pipe would block it); stopped with SIGTERM at the end."""
    exe = shutil.which("loadwatch", path=str(Path(sys.executable).parent)) or "loadwatch"
    argv = [exe, "run", "--log", str(log), "--gpu", "simulated"]
    argv += ["--state-dir", str(state_dir), "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "daemon.listening" in line:
                url = line.split('"url": "', 1)[1].split('"', 1)[0]
        if url is None:
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"loadwatch run did not start (exit {proc.wait()}): {err}")
        out = proc.stdout
        threading.Thread(target=lambda: [None for _ in out], daemon=True).start()
        yield proc, url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (those that exist now)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                todo += [int(c) for c in task.read_text().split()]
            except OSError:
                pass  # the thread ended meanwhile
    return out


def status_kb(pid: int, key: str) -> int:
    """`key` of /proc/PID/status (VmRSS, VmHWM, ...), summed over the tree."""
    total = 0
    for p in tree(pid):
        try:
            text = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith(key + ":"):
                total += int(line.split()[1])
    return total


def cpu_s(pid: int) -> float:
    """User + system CPU seconds, summed over the tree."""
    ticks = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")
