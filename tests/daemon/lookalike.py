"""Real processes for the tests of the pid a log names: a vLLM stand-in at vLLM's real module path
(`python -m vllm.entrypoints.openai.api_server ...`, the command tests/realvllm runs real vLLM
0.32 with), and others that only look like it.

The stand-in can drop to another user once it runs (root starts it; it then calls `setuid`, so
the interpreter under /root need not be readable by that user), start a child the way vLLM starts
its engine core (multiprocessing's spawn) and a helper that is no vLLM (`sleep`). It prints its
pids on one line, then waits on stdin. Every process is in a session of its own, ended by
`stop()` with its group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534  # `nobody`: a user other than the test's

STANDIN = r"""
import multiprocessing, os, subprocess, sys, time


def engine_core():
    time.sleep(120)


if __name__ == "__main__":
    uid = os.environ.get("STANDIN_UID")
    if uid:
        os.setuid(int(uid))
    pids = [os.getpid()]
    if os.environ.get("STANDIN_CHILDREN"):
        core = multiprocessing.get_context("spawn").Process(target=engine_core, daemon=True)
        core.start()
        helper = subprocess.Popen(["sleep", "120"])
        pids += [core.pid, helper.pid]
    print(*pids, flush=True)
    sys.stdin.read()
"""

SERVE = "import sys; print(0, flush=True); sys.stdin.read()\n"


@dataclass
class Lookalike:
    proc: subprocess.Popen[bytes]
    pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Its whole group, killed and reaped: no process of the test outlives it."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pid in self.pids[1:]:  # the children, out of the group's reach once reparented
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _start(argv: list[str], **kw: object) -> Lookalike:
    proc = subprocess.Popen(  # type: ignore[call-overload]
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, **kw
    )
    look = Lookalike(proc)
    line = proc.stdout.readline()  # once it prints, it runs as it will be seen
    if not line:
        look.stop()
        raise AssertionError(f"{argv} exited before it was up: {proc.returncode}")
    look.pids = [int(x) for x in line.split()]
    return look


def standin_package(root: Path) -> Path:
    mod = root / "vllm" / "entrypoints" / "openai"
    mod.mkdir(parents=True, exist_ok=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", mod):
        (d / "__init__.py").write_text("")
    (mod / "api_server.py").write_text(STANDIN)
    return root


def standin(root: Path, *args: str, uid: int | None = None, children: bool = False) -> Lookalike:
    """`python -m vllm.entrypoints.openai.api_server ARGS` from the stand-in package at `root`."""
    env = {**os.environ, "PYTHONPATH": str(standin_package(root))}
    if uid is not None:
        env["STANDIN_UID"] = str(uid)
    if children:
        env["STANDIN_CHILDREN"] = "1"
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]
    return _start(argv, env=env, cwd=root)


def named(root: Path, *argv: str) -> Lookalike:
    """A Python that runs under the command line `argv` (argv[0] any name, as `exec -a` gives):
    Python takes argv[1] for its script, a file of that name in `root` that waits on stdin."""
    root.mkdir(parents=True, exist_ok=True)
    (root / argv[1]).write_text(SERVE)
    return _start(list(argv), executable=sys.executable, cwd=root)


def plain(*argv: str) -> Lookalike:
    """Any command (`sleep 60`), seen with its own argv once Popen returns: Popen waits for the
    exec to succeed."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, start_new_session=True)
    return Lookalike(proc, [proc.pid])
