"""A log the daemon cannot reach: its directory closed to it, or a path component over 255 bytes.

Before, every wait on the log raised (`Path.exists()` raises on EACCES and ENAMETOOLONG): about
1,950 "Task exception was never retrieved" tracebacks a second on stderr, a core at 100%, and
/healthz 200. Now: one `daemon.problem` line, a retry once a second (the daemon's CPU over two
seconds stays under a tenth of them), the log source down in /metrics, /healthz 503 with the
reason, nothing on stderr; and once the directory opens, the log is read and all of it is well.

The closed directory is the unit's `SupplementaryGroups=` case: the log directory is another
user's, mode 0700, and the daemon runs without the capabilities that pass over file modes
(setpriv drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests.reliability.proc import DaemonProc, wait_for

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
# root without the capabilities that pass over file modes: a directory's mode binds it
NO_DAC = "-dac_override,-dac_read_search"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _log_up(d: DaemonProc) -> float:
    for line in d.get("/metrics")[1].decode().splitlines():
        if line.startswith('loadwatch_source_up{source="log"}'):
            return float(line.split()[1])
    return -1.0


def _check_down(d: DaemonProc, log: Path, why: str) -> None:
    def said() -> bool:
        return any(e.get("event") == "daemon.problem" for e in d.events())

    wait_for(said, "the problem line", 10)
    t0 = _cpu_s(d.pid)
    wait_for(lambda: _log_up(d) == 0.0, "the log source down in /metrics", 5)
    wait_for(lambda: d.get("/healthz")[0] == 503, "/healthz saying so", 5)
    body = d.get("/healthz")[1]
    assert b"log source is down" in body and why.encode() in body, body
    time.sleep(2.0)  # (real: the daemon's CPU over wall time is what is measured)
    assert _cpu_s(d.pid) - t0 < 0.2  # a retry a second, no spinning core
    problems = [e["error"] for e in d.events() if e.get("event") == "daemon.problem"]
    assert len(problems) == 1 and why in problems[0], problems
    assert str(log.parent)[:60] in problems[0] and problems[0].count("\n") == 0
    assert d.stderr() == ""


def test_path_component_over_255_bytes(tmp_path: Path) -> None:
    log = tmp_path / ("x" * 300) / "vllm.log"
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0"],
        tmp_path / "out.jsonl",
    )  # fmt: skip
    d.wait_listening()
    try:
        _check_down(d, log, "File name too long")
    finally:
        assert d.stop() == 0


@pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_log_directory_the_daemon_cannot_enter(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "vllm.log"
    log.write_text("INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n")
    os.chown(logs, NOBODY, NOBODY)
    logs.chmod(0o700)  # another user's: closed to the daemon
    assert SETPRIV is not None
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0"],
        tmp_path / "out.jsonl",
        wrapper=[SETPRIV, f"--bounding-set={NO_DAC}", f"--inh-caps={NO_DAC}"],
    )  # fmt: skip
    d.wait_listening()
    try:
        _check_down(d, log, "Permission denied")
        logs.chmod(0o755)  # the group is granted: the log is read, and all is well again
        wait_for(lambda: _log_up(d) == 1.0, "the log source up again", 10)
        wait_for(lambda: d.status()["sessions_total"] == 1, "the log read", 5)
        assert d.get("/healthz")[0] == 200
    finally:
        assert d.stop() == 0
    assert d.stderr() == ""
