"""The real daemon as a process for the benchmarks, and the CPU and memory of a process and its
descendants (the daemon runs its HTTP server in a child process, so its cost is the tree's):
read from /proc, or for CPU to the microsecond from a cgroup of the process's own (`TreeCpu`)."""

from __future__ import annotations

import itertools
import json
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
                url = json.loads(line)["url"]
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


_GROUPS = itertools.count()


class TreeCpu:
    """The CPU seconds of a process and of all it starts, from its start on.

    Where this machine lets the bench make a cgroup (v2's `cpu.stat`, else v1's `cpuacct`), the
    process goes into one of its own as soon as it is started, before it starts anything: the
    kernel counts every thread and child in it, exited ones too, to the microsecond (`method`
    says which). Else `cpu_s`: the tree's utime + stime in clock ticks (10 ms), and only the
    descendants alive when read. A daemon at 0.3% of a core for 30 s is 9 ticks: a figure read
    in ticks moves by a ninth with one of them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.method = "/proc ticks"
        self._group: Path | None = None
        self._usage: Path | None = None
        self._scale = 0.0
        for mount, usage, scale, method in _cgroup_mounts():
            group = mount / f"loadwatch-bench-{os.getpid()}-{next(_GROUPS)}"
            try:
                group.mkdir()
            except OSError:
                continue
            try:
                _read_usage(group / usage)  # (read before the process is in: else it stays)
                (group / "cgroup.procs").write_text(f"{pid}\n")
            except (OSError, ValueError):
                group.rmdir()
                continue
            self._group, self._usage, self._scale, self.method = group, group / usage, scale, method
            break

    def seconds(self) -> float:
        if self._usage is None:
            return cpu_s(self.pid)
        return _read_usage(self._usage) * self._scale

    def close(self) -> None:
        """After the process and its children exited: the cgroup goes."""
        if self._group is not None:
            try:
                self._group.rmdir()
            except OSError:
                pass  # (something of it still runs: left for the machine's owner)
            self._group = None


def _cgroup_mounts() -> list[tuple[Path, str, float, str]]:
    """Where a cgroup could be made: (mount, usage file, seconds per unit, method), v2 first."""
    found: list[tuple[Path, str, float, str]] = []
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return found
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        where, kind, options = Path(fields[1]), fields[2], fields[3].split(",")
        if kind == "cgroup2":
            found.insert(0, (where, "cpu.stat", 1e-6, "cgroup v2 cpu.stat"))
        elif kind == "cgroup" and "cpuacct" in options:
            found.append((where, "cpuacct.usage", 1e-9, "cgroup v1 cpuacct"))
    return found


def _read_usage(path: Path) -> int:
    text = path.read_text()
    if path.name == "cpu.stat":
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value)
        raise ValueError(f"{path} has no usage_usec")
    return int(text)
