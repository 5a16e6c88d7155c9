"""Is the vLLM process a log names running on this host, and with which arguments?

In watch mode the log gives pids (`(APIServer pid=N)`, uvicorn's `Started server process [N]`)
but the log may come from another host or a container with its own pid namespace: a pid is only
taken for vLLM once `/proc/PID/cmdline` says so. `LoggedProcess` remembers the process it
verified (pid and start time, so a reused pid is not mistaken for it) and says when it is gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadwatch.daemon.sources.proc.tree import parse_stat


@dataclass(frozen=True, slots=True)
class Seen:
    pid: int
    start_ticks: int
    argv: tuple[str, ...]


def look(pid: int, proc_root: str = "/proc") -> Seen | None:
    """The live process `pid` (not a zombie) with its argv, or None when there is none."""
    try:
        with open(f"{proc_root}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            info = parse_stat(f.read())
        with open(f"{proc_root}/{pid}/cmdline", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:
        return None
    if info is None or info.gone:
        return None
    argv = tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    return Seen(pid, info.start_ticks, argv)


def is_vllm(argv: tuple[str, ...]) -> bool:
    """A vLLM server's command line: `vllm serve ...`, `python -m vllm.entrypoints...`, or the
    title vLLM gives its processes (`VLLM::EngineCore`)."""
    head = argv[:4]
    return any(
        a == "vllm" or a.endswith("/vllm") or a.startswith(("vllm.", "VLLM::")) for a in head
    )


class LoggedProcess:
    """The process the log named, verified on this host; `check()` after each change."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self.seen: Seen | None = None

    def check(self, pid: int | None) -> tuple[str, Seen | None]:
        """("new", seen): `pid` is a vLLM running here, first seen now; ("gone", last): the one
        seen before is no more (exited, or its pid reused); ("same" | "unknown", None)."""
        seen = self.seen
        if seen is not None and (pid is None or pid == seen.pid):
            now = look(seen.pid, self.proc_root)
            if now is None or now.start_ticks != seen.start_ticks:
                self.seen = None
                return "gone", seen
            return "same", None
        if pid is None:
            return "unknown", None
        now = look(pid, self.proc_root)
        if now is None or not is_vllm(now.argv):
            return "unknown", None
        self.seen = now
        return "new", now


__all__ = ["LoggedProcess", "Seen", "is_vllm", "look"]
