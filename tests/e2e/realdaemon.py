"""`loadwatch run` as a real subprocess, as an operator runs it, and /proc checks for leftovers.

The daemon is started with a TOML file (supervise mode, a `[vllm]` table); its JSON event log goes
to stdout and to `events_file`; its HTTP server listens on a free loopback port, named by the
`daemon.listening` line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.client import DaemonClient

PROC = Path("/proc")


def _toml_value(value: object) -> str:
    # JSON strings, numbers and booleans are valid TOML (basic strings share the escapes).
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
        )
    if isinstance(value, Path):
        return json.dumps(str(value))
    return json.dumps(value)


def write_config(path: Path, top: Mapping[str, object], **tables: Mapping[str, object]) -> Path:
    """A TOML file: top-level keys, then one `[name]` table per keyword."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for name, table in tables.items():
        lines.append(f"\n[{name}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def supervise_config(
    work: Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    **vllm: object,
) -> Path:
    """The daemon's configuration for supervising `argv` (no GPUs here: `[gpu] source = none`)."""
    return write_config(
        work / "loadwatch.toml",
        {"state_dir": work / "state", "events_file": work / "events.jsonl"},
        log={"path": work / "vllm.log", "poll_interval_s": 0.1},
        http={"listen": "127.0.0.1:0"},
        gpu={"source": "none"},
        vllm={"argv": list(argv), "env": dict(env), "inherit_env": False, **vllm},
    )


class DaemonExited(AssertionError):
    """The daemon ended while a test was waiting on it."""


class DaemonProc(DaemonClient):
    """`python -m loadwatch.daemon.cli run --config FILE` with its output in files."""

    def __init__(self, config: Path, work: Path) -> None:
        self.config = config
        self.work = work
        self.stdout_path = work / "daemon.stdout"
        self.stderr_path = work / "daemon.stderr"
        self.events_path = work / "events.jsonl"
        self.vllm_log = work / "vllm.log"
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self.work,
            )
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for doc in self._stdout_docs():
                if doc.get("event") == "daemon.listening":
                    self.url = str(doc["url"])
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the daemon did not start listening: {self.stderr_tail()}")

    def _stdout_docs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stdout_path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("{") and line.endswith("}"):
                out.append(json.loads(line))
        return out

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-n:]
        except OSError:
            return ""

    def vllm_log_tail(self, n: int = 3000) -> str:
        try:
            return self.vllm_log.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- talking to it --------------------------------------------------------------------------

    def events(self) -> list[dict[str, Any]]:
        """The event log file, one object per line."""
        try:
            text = self.events_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(x) for x in text.splitlines() if x.strip()]

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == event]

    def wait(
        self, check: Callable[[], bool], what: str, timeout_s: float, interval_s: float = 0.2
    ) -> float:
        """Poll `check` until true; the seconds it took. Fails at once if the daemon exits."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.poll() is not None:
                raise DaemonExited(
                    f"the daemon exited ({self.poll()}) while waiting for {what}: "
                    f"{self.stderr_tail()}\n--- vLLM log ---\n{self.vllm_log_tail()}"
                )
            try:
                if check():
                    return time.monotonic() - t0
            except (OSError, KeyError, TypeError, IndexError, ValueError):
                pass
            time.sleep(interval_s)
        raise AssertionError(
            f"timed out after {timeout_s:.0f} s waiting for {what}\n--- vLLM log ---\n"
            f"{self.vllm_log_tail()}"
        )

    def terminate(self, timeout_s: float) -> tuple[int | None, float]:
        """SIGTERM the daemon; (its exit code or None if still running, seconds waited)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        return code, time.monotonic() - t0

    def kill(self) -> None:
        """Last resort in a teardown: the daemon, then anything of its vLLM runs still alive."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


# -- /proc ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Leftover:
    pid: int
    started_at: float
    cmdline: str
    why: str  # "tree" (a pid the supervisor recorded) or "cmdline" (names the model directory)


def _boot_time() -> float:
    for line in (PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise RuntimeError("no btime in /proc/stat")


def process_start(pid: int) -> float | None:
    """When a live, non-zombie process started (epoch seconds); None when there is none."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    # fields[0] is the state, fields[19] the start time in clock ticks after boot.
    if fields[0] in ("Z", "X", "x"):
        return None
    return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def cmdline(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def leftovers(tree_pids: Sequence[int], needle: str, ended_at: float) -> list[Leftover]:
    """Processes of a finished vLLM run still alive: a recorded tree pid whose process started
    before `ended_at` (a later one reused the number), or any process whose command line names
    `needle` (the model directory)."""
    out: dict[int, Leftover] = {}
    for pid in tree_pids:
        started = process_start(pid)
        if started is not None and started <= ended_at + 1.0:  # ticks are 10 ms, btime 1 s
            out[pid] = Leftover(pid, started, cmdline(pid), "tree")
    me = os.getpid()
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in (me, *out):
            continue
        pid = int(entry.name)
        line = cmdline(pid)
        started = process_start(pid)
        if needle in line and started is not None:
            out[pid] = Leftover(pid, started, line, "cmdline")
    return sorted(out.values(), key=lambda x: x.pid)


def kill_leftovers(tree_pids: Sequence[int], needle: str) -> None:
    """Teardown safety net: SIGKILL whatever `leftovers` would report."""
    for left in leftovers(tree_pids, needle, time.time()):
        try:
            os.kill(left.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
