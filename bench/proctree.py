"""CPU and memory of a process and its descendants, read from /proc (the daemon runs its HTTP
server in a child process, so its cost is the tree's)."""

from __future__ import annotations

import os
from pathlib import Path


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
