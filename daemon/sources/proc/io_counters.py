"""Bytes read from storage by the vLLM process tree, from `/proc/<pid>/io`.

`read_bytes` counts what a process made the kernel fetch from storage: page-cache hits are not in
it, so a warm-cache load shows little or nothing while a cold one shows the checkpoint streaming
in (mmap page faults included). Between two lines of the weights bar this tells a slow shard
(bytes still arriving) from a stall (nothing), and gives the share of the file in progress.

The tree is walked from a root pid through `/proc/<pid>/task/<tid>/children`; where the kernel
lacks that file (CONFIG_PROC_CHILDREN off) every `/proc/<n>/stat` is scanned for parent pids
instead. Processes come and go during a load (workers start, compile helpers exit), and a dead
child's bytes drop out of the sum, so `ProcIoReader` keeps per-process totals and carries the
bytes of processes that went away: the sum it reports never goes backwards for the same root.
Processes are told apart by (pid, start time), so a reused pid is a new process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from loadwatch.daemon.sources.inputs import IoSample
from loadwatch.daemon.sources.proc.logged_process import ExpectedUser, look, refusal

MAX_TREE = 4096  # a runaway tree is cut here rather than walked forever


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None
    except OSError:
        return None


def stat_fields(text: str) -> list[str] | None:
    """Fields of `/proc/<pid>/stat` after the command name (which may hold spaces and
    parentheses): index 0 is the state, 1 the parent pid, 19 the start time."""
    end = text.rfind(")")
    if end < 0:
        return None
    return text[end + 1 :].split()


def io_read_bytes(text: str) -> int | None:
    """The `read_bytes:` line of `/proc/<pid>/io`."""
    return io_field(text, "read_bytes:")


def io_field(text: str, name: str) -> int | None:
    """One `name: N` line of `/proc/<pid>/io` (`rchar:` counts what read() calls returned,
    page-cache hits included; `read_bytes:` what the kernel fetched from storage)."""
    for line in text.splitlines():
        if line.startswith(name):
            value = line.partition(":")[2].strip()
            return int(value) if value.isdigit() else None
    return None


def vllm_processes(
    pids: Sequence[int], user: ExpectedUser, proc_root: str | Path = "/proc"
) -> tuple[int, ...]:
    """The pids that are vLLM's processes on this host, by the rule that adopts the pid the log
    names (logged_process.py `refusal`: vLLM's user, vLLM's command line or a child it spawned).
    A log read from shared storage names other hosts' pids too, and a client can put a process
    prefix into the log: a number that is some other process here must not count."""
    out: list[int] = []
    for pid in pids:
        seen = look(pid, str(proc_root))
        if seen is not None and refusal(seen, user, str(proc_root)) is None:
            out.append(pid)
    return tuple(out)


class ProcIoReader:
    """Reads the bytes read by a process tree; one instance per supervised process."""

    def __init__(
        self,
        proc_root: str | Path = "/proc",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.proc = Path(proc_root)
        self.clock = clock
        self._roots: frozenset[int] = frozenset()
        self._last: dict[tuple[int, str], tuple[int, int]] = {}
        self._gone_bytes = 0
        self._gone_rchar = 0
        self._children_files: bool | None = None

    # -- the tree ----------------------------------------------------------------------------

    def _start_time(self, pid: int) -> str | None:
        text = _read(self.proc / str(pid) / "stat")
        fields = stat_fields(text) if text else None
        return fields[19] if fields and len(fields) > 19 else None

    def _children(self, pid: int) -> Iterator[int]:
        task = self.proc / str(pid) / "task"
        try:
            tids = [p.name for p in task.iterdir()]
        except OSError:
            return
        for tid in tids:
            text = _read(task / tid / "children")
            if text:
                for word in text.split():
                    if word.isdigit():
                        yield int(word)

    def _has_children_files(self, root: int) -> bool:
        if self._children_files is None:
            self._children_files = (
                self.proc / str(root) / "task" / str(root) / "children"
            ).exists()
        return self._children_files

    def _by_scan(self, root: int) -> list[int]:
        kids: dict[int, list[int]] = {}
        try:
            entries = [p.name for p in self.proc.iterdir() if p.name.isdigit()]
        except OSError:
            return [root]
        for name in entries:
            text = _read(self.proc / name / "stat")
            fields = stat_fields(text) if text else None
            if fields and len(fields) > 1 and fields[1].isdigit():
                kids.setdefault(int(fields[1]), []).append(int(name))
        out: list[int] = []
        todo = [root]
        while todo and len(out) < MAX_TREE:
            pid = todo.pop()
            out.append(pid)
            todo.extend(kids.get(pid, ()))
        return out

    def tree(self, root: int) -> list[int]:
        """`root` and all its descendants that exist now (root first)."""
        if not (self.proc / str(root)).exists():
            return []
        if not self._has_children_files(root):
            return self._by_scan(root)
        out: list[int] = []
        todo, seen = [root], {root}
        while todo and len(out) < MAX_TREE:
            pid = todo.pop()
            out.append(pid)
            for child in self._children(pid):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return out

    # -- the reading -------------------------------------------------------------------------

    def read(self, root_pid: int) -> IoSample:
        """Bytes read so far by the tree under `root_pid`; `read_bytes` is None when the root is
        gone or none of its processes could be read (another user's process, no permission)."""
        return self.read_many((root_pid,))

    def read_many(self, roots: Sequence[int]) -> IoSample:
        """The same for the union of the trees under `roots` (watch mode: the vLLM pids the
        log's prefixes name; a process under two roots counts once). A set of roots that shares
        none with the last one is a new vLLM: the totals start again."""
        now = self.clock()
        wanted = frozenset(roots)
        if not wanted & self._roots:
            self._last = {}
            self._gone_bytes = self._gone_rchar = 0
        self._roots = wanted
        current: dict[tuple[int, str], tuple[int, int]] = {}
        for root in sorted(wanted):
            for pid in self.tree(root):
                start = self._start_time(pid)
                if start is None or (pid, start) in current:
                    continue
                text = _read(self.proc / str(pid) / "io")
                value = io_read_bytes(text) if text else None
                if value is None:
                    continue
                current[(pid, start)] = (value, io_field(text or "", "rchar:") or 0)
        if not current:
            return IoSample(ts=now, read_bytes=None, pids=0)
        for key, (value, rchar) in self._last.items():
            if key not in current:
                self._gone_bytes += value
                self._gone_rchar += rchar
        self._last = current
        return IoSample(
            ts=now,
            read_bytes=self._gone_bytes + sum(v for v, _ in current.values()),
            pids=len(current),
            rchar=self._gone_rchar + sum(r for _, r in current.values()),
        )


__all__ = ["MAX_TREE", "ProcIoReader", "io_field", "io_read_bytes", "stat_fields", "vllm_processes"]
