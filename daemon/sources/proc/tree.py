"""The processes that belong to one vLLM run, found through /proc.

vLLM's workers can outlive their parent and hold GPU memory, and a child that calls ``setsid``
leaves the process group, so neither the group nor the parent link alone finds them all. A
``ProcessTree`` remembers every process it has seen in the run (pid plus start time, so a reused
pid is never mistaken for a member) and at each scan adds the descendants of every remembered
member and every process in the run's session or group.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str  # one letter: R, S, D, Z, ...
    start_ticks: int  # clock ticks after boot: with the pid, identifies the process

    @property
    def gone(self) -> bool:
        """A zombie holds no memory and cannot be signalled: it counts as gone."""
        return self.state in ("Z", "X", "x")


def parse_stat(text: str) -> ProcInfo | None:
    """One ``/proc/PID/stat`` line. The command name may hold spaces and parentheses."""
    head, sep, rest = text.rpartition(")")
    if not sep:
        return None
    pid_text = head.split("(", 1)[0].strip()
    fields = rest.split()
    # After the name: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice num_threads itrealvalue starttime ...
    if len(fields) < 20:
        return None
    try:
        return ProcInfo(
            pid=int(pid_text),
            ppid=int(fields[1]),
            pgid=int(fields[2]),
            sid=int(fields[3]),
            state=fields[0],
            start_ticks=int(fields[19]),
        )
    except ValueError:
        return None


def read_process_table(proc_root: str = "/proc") -> dict[int, ProcInfo]:
    """Every process visible in ``proc_root``; processes that vanish mid-read are skipped."""
    table: dict[int, ProcInfo] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc_root}/{name}/stat", encoding="utf-8", errors="replace") as f:
                info = parse_stat(f.read())
        except OSError:
            continue
        if info is not None:
            table[info.pid] = info
    return table


class ProcessTree:
    """Members of one run: the root, its descendants, its session and group, remembered."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        # start_new_session makes the root its own session and group leader.
        self.sid = root_pid
        self.pgid = root_pid
        self._seen: dict[int, int] = {}  # pid -> start_ticks
        self._root_start: int | None = None

    @property
    def pids(self) -> tuple[int, ...]:
        """Every pid seen in the run so far (for the GPU orphan check)."""
        return tuple(sorted(self._seen))

    @property
    def members(self) -> dict[int, int]:
        """Every member seen: pid -> start ticks (what identifies it after its pid is reused)."""
        return dict(self._seen)

    @property
    def root_start(self) -> int | None:
        return self._root_start

    def adopt(self, info: ProcInfo) -> None:
        """A member found otherwise (re-parented to the supervisor); its descendants follow."""
        self._seen[info.pid] = info.start_ticks

    def _same(self, info: ProcInfo) -> bool:
        return self._seen.get(info.pid) == info.start_ticks

    def scan(self, table: dict[int, ProcInfo]) -> None:
        root = table.get(self.root_pid)
        if self._root_start is None and root is not None:
            self._root_start = root.start_ticks
            self._seen[root.pid] = root.start_ticks
        members = {pid for pid, info in table.items() if pid in self._seen and self._same(info)}
        if self._root_start is not None:
            # Once the root's pid is reused, a session or group of that number is someone else's.
            reused = root is not None and root.start_ticks != self._root_start
            newer_than = root.start_ticks if reused and root is not None else None
            for info in table.values():
                if info.sid != self.sid and info.pgid != self.pgid:
                    continue
                if info.start_ticks < self._root_start:
                    continue
                if newer_than is not None and info.start_ticks >= newer_than:
                    continue
                members.add(info.pid)
        children: dict[int, list[int]] = defaultdict(list)
        for info in table.values():
            children[info.ppid].append(info.pid)
        queue = list(members)
        while queue:
            for child in children.get(queue.pop(), ()):
                if child not in members:
                    members.add(child)
                    queue.append(child)
        for pid in members:
            self._seen[pid] = table[pid].start_ticks

    def alive(self, table: dict[int, ProcInfo]) -> list[int]:
        """Members still running (same pid and start time, not a zombie), root first."""
        out = [pid for pid, info in table.items() if self._same(info) and not info.gone]
        return sorted(out, key=lambda pid: (pid != self.root_pid, pid))

    def group_alive(self, table: dict[int, ProcInfo]) -> bool:
        """Whether the run's process group still has a live member, so killpg hits only ours."""
        return any(
            info.pgid == self.pgid and self._same(info) and not info.gone for info in table.values()
        )
