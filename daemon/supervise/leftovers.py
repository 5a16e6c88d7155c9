"""The vLLM tree an earlier supervisor left running, found from its pid file and stopped.

A supervisor killed outright (SIGKILL: a manual run, a container entrypoint, tmux) cannot stop
vLLM. vLLM is told by the kernel (the parent-death signal, procops.py), but it may ignore that or
take its time, and its workers may have left its tree; meanwhile a restarted supervisor would
start a second vLLM beside the first, both holding the GPUs. So while a run lives, the pid file
(`STATE_DIR/vllm.pid`) lists every member of its tree with its start time (a pid alone could be
reused by then) and the run's environment marker. A supervisor that starts finds the members
still alive and stops them (SIGTERM, the grace period, SIGKILL) before its own first start, and
says so. It does not adopt them: the pipe vLLM writes its output to died with the old
supervisor, so nothing of that vLLM could be read or waited for any more.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.proc.tree import ProcInfo
from loadwatch.daemon.supervise.config import SupervisorConfig
from loadwatch.daemon.supervise.procops import ProcessOps

MAX_PID_FILE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Leftover:
    root: int
    members: dict[int, int]  # pid -> start ticks, as the pid file lists them
    marker: str | None


class PidFile:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._saved: dict[str, Any] | None = None
        self.last_error: str | None = None

    def save(self, root: int, members: Mapping[int, int], marker: str) -> None:
        """Write atomically (temporary file, rename); a repeat of the last content is skipped."""
        doc = {"root": root, "marker": marker, "members": {str(p): t for p, t in members.items()}}
        if doc == self._saved:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, json.dumps(doc).encode())
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._saved, self.last_error = doc, None
        except OSError as exc:
            self.last_error = f"cannot write {self.path}: {exc.strerror or exc}"

    def clear(self) -> None:
        self._saved = None
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.last_error = f"cannot remove {self.path}: {exc.strerror or exc}"

    def load(self) -> Leftover | None:
        """What the file says; None when there is none or it is not one of ours."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_PID_FILE_BYTES + 1)
            doc = json.loads(raw)
            members = {int(p): int(t) for p, t in doc["members"].items()}
            root = int(doc["root"])
            marker = doc.get("marker")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if len(raw) > MAX_PID_FILE_BYTES:
            return None
        return Leftover(root, members, marker if isinstance(marker, str) else None)


def alive(left: Leftover, table: Mapping[int, ProcInfo]) -> list[int]:
    """The listed members still running: same pid, same start time, not a zombie."""
    out = []
    for pid, ticks in left.members.items():
        info = table.get(pid)
        if info is not None and info.start_ticks == ticks and not info.gone:
            out.append(pid)
    return sorted(out, key=lambda pid: (pid != left.root, pid))


async def stop(
    pid_file: PidFile,
    ops: ProcessOps,
    cfg: SupervisorConfig,
    note: Callable[..., None],
) -> list[int]:
    """Stop the tree `pid_file` lists, if any of it still runs; the pids that survived."""
    left = pid_file.load()
    if left is None:
        pid_file.clear()
        return []
    pids = alive(left, await asyncio.to_thread(ops.process_table))
    if pids:
        note(
            "vllm.leftover",
            action="stopping",
            pids=pids,
            reason=f"vLLM (pid {left.root}) and its tree, started by an earlier loadwatch that "
            "did not stop it, still run: stopping them before starting vLLM",
        )
        pids = await _end(left, ops, cfg)
        note("vllm.leftover", action="stopped" if not pids else "survived", pids=pids)
    if not pids:
        pid_file.clear()
    return pids


async def _end(left: Leftover, ops: ProcessOps, cfg: SupervisorConfig) -> list[int]:
    """SIGTERM, the grace period, SIGKILL, as for a run of our own."""
    pids: list[int] = []
    for sig, wait_s in ((signal.SIGTERM, cfg.stop_grace_s), (signal.SIGKILL, cfg.kill_wait_s)):
        end = ops.monotonic() + wait_s
        while True:
            pids = alive(left, await asyncio.to_thread(ops.process_table))
            if not pids:
                return []
            if ops.monotonic() >= end:
                break
            for pid in pids:
                ops.signal(pid, sig)
            await ops.sleep(0.1)
    return pids
