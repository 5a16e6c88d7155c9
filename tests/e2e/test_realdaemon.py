"""The end-to-end helpers themselves: the leftover check finds what it must, the config parses."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from loadwatch.daemon.config import load_config
from tests.e2e.realdaemon import kill_leftovers, leftovers, supervise_config


def _sleeper(marker: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()", str(marker)],
        stdin=subprocess.DEVNULL,
    )


def test_leftovers_by_tree_pid_and_by_command_line(tmp_path: Path) -> None:
    marker = tmp_path / "model-dir"
    proc = _sleeper(marker)
    try:
        now = time.time()  # after its start (Popen returns once it runs), at /proc's resolution
        by_tree = leftovers([proc.pid], "no-such-needle", now)
        assert [(x.pid, x.why) for x in by_tree] == [(proc.pid, "tree")]
        by_cmdline = leftovers([], str(marker), now)
        assert [(x.pid, x.why) for x in by_cmdline] == [(proc.pid, "cmdline")]
        assert str(marker) in by_cmdline[0].cmdline
        # a process that started after the run ended only reuses a recorded number
        assert leftovers([proc.pid], "no-such-needle", now - 60) == []
        kill_leftovers([proc.pid], str(marker))
        assert proc.wait(timeout=10) < 0
        assert leftovers([proc.pid], str(marker), time.time()) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_supervise_config_is_what_the_daemon_reads(tmp_path: Path) -> None:
    argv = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", 'a "b"\\c']
    env = {"PATH": "/bin", "TMPDIR": str(tmp_path / "t")}
    path = supervise_config(tmp_path, argv, env, backoff_initial_s=1.5, crash_loop_starts=2)
    cfg = load_config(path)
    assert cfg.vllm is not None and cfg.supervise
    assert cfg.vllm.argv == tuple(argv) and dict(cfg.vllm.env) == env
    assert cfg.vllm.inherit_env is False
    assert (cfg.vllm.backoff_initial_s, cfg.vllm.crash_loop_starts) == (1.5, 2)
    assert cfg.log.path == tmp_path / "vllm.log" and cfg.events_file == tmp_path / "events.jsonl"
    assert (cfg.http.host, cfg.http.port, cfg.gpu.source) == ("127.0.0.1", 0, "none")
