"""After vLLM exits: who still holds GPU memory?

A worker that outlives the vLLM server (a leaked tensor-parallel worker, say) keeps its GPU memory,
and the next start then fails with out-of-memory. The check takes a GPU reading made after the
exit, the pids known to have been in the vLLM process tree, and the live process table
(``/proc``, injectable), and sorts every holder into *leaked* (a live process that was in the
tree, descends from one that was, or carries the run's environment marker: a worker that left the
tree's session before a scan saw it), *exiting* (of the tree, but gone from the table or a zombie:
NVML lists a process for a moment after it exits, longer when it held much memory) or *unknown*
(anything else, including pids this pid namespace cannot see).

``settle_orphans`` is what runs after an exit: it reads the GPUs again until no holder of the tree
is left or a grace passes, so the moment in which the driver still lists a finished process is
never taken for a leak, while a process that keeps its memory through the grace is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loadwatch.daemon.sources.inputs import GpuReading

HolderKind = Literal["leaked", "exiting", "unknown"]

RUN_MARKER_ENV = "LOADWATCH_RUN"  # set in vLLM's environment by the supervisor; workers inherit it
ORPHAN_GRACE_S = 10.0  # how long an exited tree may take to release its memory
ORPHAN_RECHECK_S = 0.25
_MAX_DEPTH = 128  # ppid chains are short; the cap only guards against a corrupt table
_CMDLINE_CHARS = 200
_GONE_STATES = ("Z", "X", "x")  # a zombie has closed its files: its GPU memory is on the way out


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    state: str  # "R", "S", "Z", ...
    cmdline: str | None


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """One process holding memory on one GPU."""

    pid: int
    gpu_index: int
    gpu_uuid: str | None
    used_bytes: int | None
    kind: HolderKind
    alive: bool  # present in the process table now
    cmdline: str | None


@dataclass(frozen=True, slots=True)
class OrphanReport:
    ts: float
    leaked: tuple[GpuHolder, ...] = ()
    unknown: tuple[GpuHolder, ...] = ()
    complete: bool = True  # False when a GPU could not be read: holders there are not listed
    error: str | None = None  # one line, when not complete
    exiting: tuple[GpuHolder, ...] = ()  # of the tree, still listed, but gone from /proc
    waited_s: float = 0.0  # how long settle_orphans re-read the GPUs before this report

    @property
    def clean(self) -> bool:
        """Nothing from the vLLM tree holds GPU memory (as far as could be seen)."""
        return not self.leaked

    @property
    def leaked_bytes(self) -> int:
        return sum(h.used_bytes or 0 for h in self.leaked)

    @property
    def unknown_bytes(self) -> int:
        return sum(h.used_bytes or 0 for h in self.unknown)

    def summary(self) -> str:
        """One line for the log."""
        if not self.leaked and not self.unknown:
            text = "no process holds GPU memory"
        else:
            text = (
                f"{len({h.pid for h in self.leaked})} leaked process(es) from the vLLM tree hold "
                f"{self.leaked_bytes} bytes; {len({h.pid for h in self.unknown})} other "
                f"process(es) hold {self.unknown_bytes} bytes"
            )
        if self.exiting:
            text += (
                f"; {len({h.pid for h in self.exiting})} exited process(es) still listed "
                f"after {self.waited_s:.1f} s"
            )
        return text if self.complete else f"{text} ({self.error})"

    @property
    def settled(self) -> bool:
        """Nothing of the tree is listed any more: re-reading cannot change the verdict."""
        return not self.leaked and not self.exiting


def read_process(pid: int, proc_root: Path = Path("/proc")) -> ProcInfo | None:
    """One process from the table, or ``None`` when it is not there (gone, or not visible)."""
    base = proc_root / str(pid)
    try:
        stat = (base / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name sits in parentheses and may itself contain spaces and parentheses.
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 2 or not fields[1].lstrip("-").isdigit():
        return None
    try:
        raw = (base / "cmdline").read_bytes()
    except OSError:
        raw = b""
    cmdline = " ".join(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)
    return ProcInfo(
        pid=pid, ppid=int(fields[1]), state=fields[0], cmdline=cmdline[:_CMDLINE_CHARS] or None
    )


def process_tree_pids(root_pid: int, proc_root: Path = Path("/proc")) -> frozenset[int]:
    """``root_pid`` and every live descendant: snapshot it while vLLM runs, for the check."""
    children: dict[int, list[int]] = {}
    for entry in _pid_entries(proc_root):
        info = read_process(entry, proc_root)
        if info is not None:
            children.setdefault(info.ppid, []).append(info.pid)
    seen = {root_pid}
    todo = [root_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return frozenset(seen)


def check_orphans(
    reading: GpuReading,
    tree_pids: Collection[int],
    *,
    proc_root: Path = Path("/proc"),
    ignore_pids: Collection[int] = (),
    run_marker: str | None = None,
) -> OrphanReport:
    """Sort the processes that hold GPU memory in ``reading`` into leaked, exiting and unknown.

    Pids are numbers only: a tree pid reused by an unrelated process after vLLM exited would be
    counted as leaked. ``ignore_pids`` are holders known to be fine (another service).
    ``run_marker`` is the value of ``RUN_MARKER_ENV`` the supervisor gave the run.
    """
    tree = frozenset(tree_pids)
    ignore = frozenset(ignore_pids)
    marker = None if run_marker is None else f"{RUN_MARKER_ENV}={run_marker}".encode()
    found: dict[HolderKind, list[GpuHolder]] = {"leaked": [], "exiting": [], "unknown": []}
    unread: list[str] = []
    if not reading.source_up and not reading.samples:
        return OrphanReport(
            ts=reading.ts, complete=False, error=f"GPUs not readable: {reading.error or 'down'}"
        )
    for sample in reading.samples:
        if not sample.up:
            unread.append(f"GPU {sample.index} {sample.health}")
        for proc in sample.processes:
            if proc.pid in ignore:
                continue
            info = read_process(proc.pid, proc_root)
            alive = info is not None and info.state not in _GONE_STATES
            ours = _descends_from(proc.pid, tree, proc_root) or (
                marker is not None and alive and _carries(proc.pid, marker, proc_root)
            )
            kind: HolderKind = ("leaked" if alive else "exiting") if ours else "unknown"
            found[kind].append(
                GpuHolder(
                    pid=proc.pid,
                    gpu_index=sample.index,
                    gpu_uuid=sample.uuid,
                    used_bytes=proc.used_bytes,
                    kind=kind,
                    alive=info is not None,
                    cmdline=info.cmdline if info is not None else None,
                )
            )
    return OrphanReport(
        ts=reading.ts,
        leaked=tuple(found["leaked"]),
        unknown=tuple(found["unknown"]),
        exiting=tuple(found["exiting"]),
        complete=not unread,
        error=("not read: " + ", ".join(unread)) if unread else None,
    )


async def settle_orphans(
    poll: Callable[[], Awaitable[GpuReading]],
    tree_pids: Collection[int],
    *,
    grace_s: float = ORPHAN_GRACE_S,
    recheck_s: float = ORPHAN_RECHECK_S,
    proc_root: Path = Path("/proc"),
    ignore_pids: Collection[int] = (),
    run_marker: str | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> OrphanReport | None:
    """The orphan check after an exit: fresh readings until the tree's holders are gone.

    Re-reads every ``recheck_s`` while a holder of the tree is still listed, up to ``grace_s``;
    what is still alive and listed then is leaked. ``None`` when the GPUs could not be read at all.
    """
    start = monotonic()
    while True:
        reading = await poll()
        waited = monotonic() - start
        if not reading.source_up and not reading.samples:
            return None
        report = check_orphans(
            reading,
            tree_pids,
            proc_root=proc_root,
            ignore_pids=ignore_pids,
            run_marker=run_marker,
        )
        if report.settled or waited >= grace_s:
            return dataclasses.replace(report, waited_s=waited)
        await sleep(min(recheck_s, max(0.0, grace_s - waited)))


def _descends_from(pid: int, tree: frozenset[int], proc_root: Path) -> bool:
    current = pid
    for _ in range(_MAX_DEPTH):
        if current in tree:
            return True
        info = read_process(current, proc_root)
        if info is None or info.ppid <= 0 or info.ppid == current:
            return False
        current = info.ppid
    return False


def _carries(pid: int, marker: bytes, proc_root: Path) -> bool:
    """``pid`` was started with the run's marker in its environment (unreadable: no)."""
    try:
        environ = (proc_root / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return marker in environ.split(b"\0")


def _pid_entries(proc_root: Path) -> Iterable[int]:
    try:
        names = [p.name for p in proc_root.iterdir()]
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit()]
