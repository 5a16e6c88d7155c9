"""The loop never waits on its outputs: an events file that is a FIFO nobody reads, a stdout pipe
nobody drains.

The log is tests/fixtures/real-v0.32-deepseek-kvscales.log written 12 times over (twelve vLLM
starts appended to one log): about 600 events, far more than the 64 KiB a pipe holds. Before,
the loop blocked on the full pipe after about 190 events and read no further. Now the daemon
reads the whole log (its read-bytes counter reaches the log's size), serves, and stops cleanly;
the FIFO's case is said in one `daemon.problem` line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.reliability.proc import REPO, DaemonProc, wait_for

FIXTURE = REPO / "tests" / "fixtures" / "real-v0.32-deepseek-kvscales.log"
COPIES = 12


def _log(tmp_path: Path) -> Path:
    log = tmp_path / "vllm.log"
    log.write_bytes(FIXTURE.read_bytes() * COPIES)
    return log


def _read_bytes(metrics: bytes) -> float:
    for line in metrics.decode().splitlines():
        if line.startswith("loadwatch_log_read_bytes_total "):
            return float(line.split()[1])
    return -1.0


def test_events_fifo_with_no_reader(tmp_path: Path) -> None:
    log = _log(tmp_path)
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    cfg = tmp_path / "c.toml"
    cfg.write_text("")
    d = DaemonProc(
        ["--config", str(cfg), "--log", str(log), "--state-dir", str(tmp_path / "st"),
         "--gpu", "none", "--listen", "127.0.0.1:0", "--events-file", str(fifo)],
        tmp_path / "out.jsonl",
    )  # fmt: skip
    d.wait_listening()
    try:
        size = log.stat().st_size
        wait_for(lambda: _read_bytes(d.get("/metrics")[1]) == size, "the whole log read", 15)
        wait_for(lambda: d.status()["sessions_total"] == COPIES, "every start seen", 5)

        def said() -> bool:
            problems = [e["error"] for e in d.events() if e.get("event") == "daemon.problem"]
            return len([p for p in problems if str(fifo) in p and "dropped" in p]) == 1

        wait_for(said, "one problem line for the FIFO", 8)
    finally:
        assert d.stop() == 0


def test_stdout_pipe_nobody_reads(tmp_path: Path) -> None:
    log = _log(tmp_path)
    events = tmp_path / "events.jsonl"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\nevents_file = '{events}'\n[log]\npath = '{log}'\n"
        "[gpu]\nsource = 'none'\n[http]\nlisten = '127.0.0.1:0'\n[events]\nstdout = 'all'\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(cfg)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # never read
        stderr=subprocess.DEVNULL,
    )
    try:
        client = DaemonProc.__new__(DaemonProc)  # only its HTTP client: the url from the file

        def listening() -> str | None:
            for line in events.read_text().splitlines() if events.exists() else []:
                doc = json.loads(line)
                if doc.get("event") == "daemon.listening":
                    return str(doc["url"])
            return None

        wait_for(listening, "a daemon.listening line in the events file", 20)
        client.url = str(listening())
        size = log.stat().st_size
        wait_for(lambda: _read_bytes(client.get("/metrics")[1]) == size, "the whole log read", 15)
        wait_for(lambda: client.status()["sessions_total"] == COPIES, "every start seen", 5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0  # the stop is not held up by stdout either
        docs = [json.loads(x) for x in events.read_text().splitlines()]
        kv_records = sum(
            1 if d["event"] == "log.kv_scale_warning" else d.get("count", 0)
            for d in docs
            if d["event"] in ("log.kv_scale_warning", "log.kv_scale_run")
        )
        assert docs[-1]["event"] == "daemon.stopped" and kv_records > 100
        assert events.stat().st_size > 64 * 1024  # stdout got as much: more than a pipe holds
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        assert proc.stdout is not None
        proc.stdout.close()
