"""One run of vLLM's process tree, as the supervisor drives it: the record of the run, the scan
of the tree from /proc (adopting members whose parent exited, while the supervisor is their
subreaper), ending it (SIGTERM to the group, a grace, SIGKILL for what is left), the pid file of
what survived, and the thread that waits for the main process's exit."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from loadwatch.daemon.sources.proc.tree import ProcessTree, ProcInfo
from loadwatch.daemon.supervise.config import SupervisorConfig
from loadwatch.daemon.supervise.leftovers import PidFile
from loadwatch.daemon.supervise.logsink import OutputPump
from loadwatch.daemon.supervise.orphans import RUN_MARKER_ENV
from loadwatch.daemon.supervise.procops import ChildProcess, ProcessOps


@dataclass
class Run:
    child: ChildProcess
    tree: ProcessTree
    exited: asyncio.Future[int]
    pump: OutputPump
    started_at: float
    started_mono: float
    fatal_kind: str | None = None
    stop_reason: str | None = None  # why we ended it (stop, stall), None if it exited by itself
    stalled_in: str | None = None  # the start-up phase of the stall it was ended for
    signalled: set[int] = field(default_factory=set)


class TreeControl:
    """Scans and ends a run's tree with the supervisor's OS calls, settings and pid file."""

    def __init__(
        self, ops: ProcessOps, config: SupervisorConfig, pids: PidFile | None, marker: str
    ) -> None:
        self._ops = ops
        self.config = config
        self._pids = pids
        self.run_marker = marker

    async def scan(self, run: Run) -> dict[int, ProcInfo]:
        table = await asyncio.to_thread(self._ops.process_table)
        self._adopt_orphans(run, table)
        run.tree.scan(table)
        if self._pids is not None:
            self._pids.save(run.child.pid, run.tree.members, self.run_marker)
        return table

    def settle(self, run: Run, remaining: list[int]) -> None:
        """The run ended: keep in the pid file only what survived, for a later supervisor to try
        again; clear it when nothing did."""
        if self._pids is None:
            return
        if remaining:
            members = run.tree.members
            self._pids.save(run.child.pid, {p: members[p] for p in remaining}, self.run_marker)
        else:
            self._pids.clear()

    def _adopt_orphans(self, run: Run, table: dict[int, ProcInfo]) -> None:
        """Members whose parent exited are re-parented to us (a subreaper): our children that
        carry the run's marker and started after its root. Those that ended are reaped."""
        me, root, since = os.getpid(), run.child.pid, run.tree.root_start
        marker = f"{RUN_MARKER_ENV}={self.run_marker}"
        known = run.tree.members
        for info in table.values():
            if info.ppid != me or info.pid == root or since is None or info.start_ticks < since:
                continue
            if known.get(info.pid) == info.start_ticks:
                if info.gone:
                    self._ops.reap(info.pid)
            elif self._ops.carries(info.pid, marker):
                run.tree.adopt(info)

    async def terminate(self, run: Run) -> list[int]:
        """SIGTERM the tree, wait the grace period, SIGKILL what is left; the pids that survive."""
        cfg = self.config
        poll = min(0.1, max(0.01, cfg.stop_grace_s / 20))
        table = await self.scan(run)
        self._signal_tree(run, table, signal.SIGTERM)
        deadline = self._ops.monotonic() + cfg.stop_grace_s
        while True:
            table = await self.scan(run)
            alive = run.tree.alive(table)
            if not alive and run.exited.done():
                return []
            if self._ops.monotonic() >= deadline:
                break
            # Members that appeared after the first signal (late forks) get theirs too.
            self._signal_tree(run, table, signal.SIGTERM, only_new=True)
            await self._ops.sleep(poll)
        kill_deadline = self._ops.monotonic() + cfg.kill_wait_s
        while True:
            alive = run.tree.alive(table)
            if not alive and run.exited.done():
                return []
            if self._ops.monotonic() >= kill_deadline:
                return alive
            self._signal_tree(run, table, signal.SIGKILL)
            await self._ops.sleep(poll)
            table = await self.scan(run)

    def _signal_tree(
        self, run: Run, table: dict[int, ProcInfo], sig: int, only_new: bool = False
    ) -> None:
        grouped = not only_new and run.tree.group_alive(table)
        if grouped:
            self._ops.signal_group(run.tree.pgid, sig)
        for pid in run.tree.alive(table):
            if only_new and pid in run.signalled:
                continue
            # The group signal reached the group's members; a second SIGTERM to vLLM would cut its
            # own orderly shutdown short. Processes that left the group get theirs one by one.
            info = table.get(pid)
            if not (grouped and info is not None and info.pgid == run.tree.pgid):
                self._ops.signal(pid, sig)
            run.signalled.add(pid)


def split_returncode(rc: int | None) -> tuple[int | None, int | None]:
    if rc is None:
        return None, None
    if rc < 0:
        return None, -rc
    return rc, None


def watch_exit(
    child: ChildProcess,
    fut: asyncio.Future[int],
    loop: asyncio.AbstractEventLoop,
    poke: Callable[[], None],
) -> None:
    """Wait for the exit in a thread and resolve ``fut`` on the loop."""

    def resolve(rc: int) -> None:
        if not fut.done():
            fut.set_result(rc)
        poke()

    def wait() -> None:
        rc = child.wait()
        try:
            loop.call_soon_threadsafe(resolve, rc)
        except RuntimeError:  # the loop is gone; nobody is waiting any more
            pass

    threading.Thread(target=wait, name=f"loadwatch-wait-{child.pid}", daemon=True).start()
