"""The vLLM process a log names, looked for in the real /proc of this host."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from loadwatch.daemon.sources.proc.logged_process import LoggedProcess, is_vllm


def _child(*argv: str) -> subprocess.Popen[bytes]:
    """A child whose command line is `argv` once it has exec'd (until then, between fork and
    exec, /proc shows the parent's: waited out, bounded)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", *argv], stdin=subprocess.DEVNULL
    )
    want = "\0".join(argv).encode()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            if want in f.read():
                return proc
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    raise AssertionError(f"child {proc.pid} did not exec within 10 s")


def test_a_vllm_running_here_is_seen_with_its_argv_then_gone_once_killed() -> None:
    proc = _child("vllm.entrypoints.openai.api_server", "--kv-cache-dtype", "fp8")
    try:
        watch = LoggedProcess()
        what, seen = watch.check(proc.pid)
        assert what == "new" and seen is not None and seen.pid == proc.pid
        assert seen.argv[-2:] == ("--kv-cache-dtype", "fp8")
        assert watch.check(proc.pid) == ("same", None)
    finally:
        proc.kill()
        proc.wait()
    what, seen = watch.check(proc.pid)
    assert what == "gone" and seen is not None and seen.pid == proc.pid
    assert watch.check(proc.pid) == ("unknown", None)  # not looked for again as vLLM


def test_a_pid_that_is_not_vllm_here_is_never_judged() -> None:
    watch = LoggedProcess()
    assert watch.check(os.getpid()) == ("unknown", None)  # pytest, not vLLM
    assert watch.check(None) == ("unknown", None)
    assert watch.check(2**22 + 12345) == ("unknown", None)  # no such process


def test_vllm_command_lines() -> None:
    assert is_vllm(("/opt/vllm/bin/vllm", "serve", "/models/m"))
    assert is_vllm(("python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"))
    assert is_vllm(("VLLM::EngineCore",))
    assert not is_vllm(("python3", "-m", "http.server"))
    assert not is_vllm(("bash", "-c", "echo vllm"))
