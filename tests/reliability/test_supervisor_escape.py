"""No vLLM process outlives its supervisor, however the supervisor or the process ends.

Real daemons supervising a stand-in vLLM (a Python child that notes its pid and waits for a
signal):
- the daemon killed with SIGKILL (a manual run, a container entrypoint): vLLM gets its parent-
  death signal and ends;
- a vLLM that ignores SIGTERM survives that: the daemon started again on the same state directory
  finds it from the pid file (pid and start time), says so in `vllm.leftover` lines, stops it, and
  only then starts its own;
- a worker that double-forks and calls setsid, its parent gone within milliseconds, before any
  scan of the tree: re-parented to the supervisor (a subreaper), it is found and ended with the
  rest at the daemon's stop.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tests.reliability.proc import DaemonProc, wait_for

PLAIN = """
import os, signal, sys
open(os.path.join(sys.argv[1], "vllm-%d" % os.getpid()), "w").close()
signal.pause()
"""

DEAF = """
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(sys.argv[1], "vllm-%d" % os.getpid()), "w").close()
signal.pause()
"""

ESCAPING = """
import os, signal, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(sys.argv[1], "escapee-%d" % os.getpid()), "w").close()
        signal.pause()
    os._exit(0)
open(os.path.join(sys.argv[1], "vllm-%d" % os.getpid()), "w").close()
signal.pause()
"""


def _daemon(tmp_path: Path, script: str, name: str) -> DaemonProc:
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    argv = [sys.executable, "-c", script, str(pids)]
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\n[log]\npoll_interval_s = 0.05\n"
        "[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[vllm]\nargv = {json.dumps(argv)}\nrestart = 'never'\npreflight = 'off'\n"
        "stop_grace_s = 0.3\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / f"{name}.jsonl")
    d.wait_listening()
    return d


def _pids(tmp_path: Path, kind: str) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (tmp_path / "pids").glob(f"{kind}-*"))


def _pid_file(tmp_path: Path) -> dict[str, Any]:
    """The tree the supervisor has noted, from its pid file."""
    doc: dict[str, Any] = json.loads((tmp_path / "st" / "vllm.pid").read_text())
    return doc


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _cleanup(tmp_path: Path) -> None:
    for kind in ("vllm", "escapee"):
        for pid in _pids(tmp_path, kind) if (tmp_path / "pids").exists() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_vllm_dies_with_a_killed_supervisor(tmp_path: Path) -> None:
    try:
        d = _daemon(tmp_path, PLAIN, "first")
        wait_for(lambda: len(_pids(tmp_path, "vllm")) == 1, "vLLM started")
        [pid] = _pids(tmp_path, "vllm")
        d.kill()
        wait_for(lambda: not _alive(pid), "vLLM gone with its supervisor", 5)
    finally:
        _cleanup(tmp_path)


def test_restarted_supervisor_stops_the_tree_it_finds(tmp_path: Path) -> None:
    try:
        first = _daemon(tmp_path, DEAF, "first")
        wait_for(lambda: len(_pids(tmp_path, "vllm")) == 1, "vLLM started")
        [old] = _pids(tmp_path, "vllm")
        wait_for(lambda: str(old) in _pid_file(tmp_path)["members"], "vLLM in the pid file")
        first.kill()  # (it waits for the daemon's exit: the parent-death SIGTERM is sent)
        assert _alive(old)  # it ignores the parent-death SIGTERM
        second = _daemon(tmp_path, DEAF, "second")
        try:
            wait_for(lambda: len(_pids(tmp_path, "vllm")) == 2, "a new vLLM started", 10)
            # (the new vLLM may write its pid before the daemon writes that it started it)
            wait_for(
                lambda: any(e.get("event") == "vllm.started" for e in second.events()),
                "the new vLLM's start in the event log",
                10,
            )
            assert not _alive(old)
            left = [e for e in second.events() if e.get("event") == "vllm.leftover"]
            assert [(e["action"], e["pids"]) for e in left] == [
                ("stopping", [old]),
                ("stopped", []),
            ]
            assert f"pid {old}" in left[0]["reason"]
            names = [e.get("event") for e in second.events()]
            assert names.index("vllm.leftover") < names.index("vllm.started")
        finally:
            assert second.stop() == 0
        assert not any(_alive(p) for p in _pids(tmp_path, "vllm"))
    finally:
        _cleanup(tmp_path)


def test_double_forked_setsid_worker_is_ended_at_stop(tmp_path: Path) -> None:
    try:
        d = _daemon(tmp_path, ESCAPING, "first")
        wait_for(lambda: len(_pids(tmp_path, "escapee")) == 1, "the worker escaped")
        [escapee] = _pids(tmp_path, "escapee")
        assert Path(f"/proc/{escapee}/stat").read_text().rpartition(")")[2].split()[1] == str(
            d.pid
        )  # re-parented to the supervisor, not to init
        assert d.stop() == 0
        assert not _alive(escapee)
        stopped = [e for e in d.events() if e.get("event") == "vllm.stopped"]
        assert stopped and escapee in stopped[0]["tree_pids"] and stopped[0]["remaining"] == []
    finally:
        _cleanup(tmp_path)
