"""The daemon under a service manager: sd_notify on a real datagram socket, SIGHUP, SIGTERM."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from loadwatch.daemon.sim.kimilog import RealClock, Shape, startup
from tests.helpers import wait_for


def _lines(n: int) -> str:
    shape = Shape(model="/models/m", shards=4, workers=1, layers=2)
    return "".join(list(startup(random.Random(n), RealClock(speed=1e6), shape)))


def test_notify_watchdog_reopen_and_stop(tmp_path: Path) -> None:
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(10)
    log, events = tmp_path / "vllm.log", tmp_path / "events.jsonl"
    # vLLM starts while loadwatch watches (a log read back ready is not ready until a live
    # /health answer says so, and nothing answers here)
    log.write_text("")
    env = {**os.environ, "NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "1000000"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadwatch.daemon.cli",
            "run",
            "--log",
            str(log),
            "--state-dir",
            str(tmp_path / "state"),
            "--gpu",
            "none",
            "--listen",
            "127.0.0.1:0",
            "--events-file",
            str(events),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    got: list[str] = []
    try:
        deadline = time.monotonic() + 15
        written = False
        while time.monotonic() < deadline and not (
            any(m.startswith("READY=1") for m in got)
            and sum(m == "WATCHDOG=1" for m in got) >= 2
            and any("ready" in m for m in got if m.startswith("STATUS="))
        ):
            got.append(sock.recv(4096).decode())
            if not written and got[-1].startswith("READY=1"):
                with log.open("a") as f:
                    f.write(_lines(1))
                written = True
        ready = next(m for m in got if m.startswith("READY=1"))
        assert "STATUS=" in ready
        assert sum(m == "WATCHDOG=1" for m in got) >= 2  # pinged at half of WATCHDOG_USEC
        assert any(m.startswith("STATUS=") and "ready" in m for m in got), got

        # SIGHUP reopens the event log, so logrotate can move it
        events.rename(tmp_path / "events.jsonl.1")
        proc.send_signal(signal.SIGHUP)
        wait_for(events.exists, "the event log reopened (created again)", 10)
        with log.open("a") as f:
            f.write(_lines(2))  # a restart: a new session
        wait_for(lambda: "session_started" in events.read_text(), "the new session's events", 10)
        old = [json.loads(x) for x in (tmp_path / "events.jsonl.1").read_text().splitlines()]
        assert old and old[0]["event"] == "daemon.listening"

        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(m.startswith("STOPPING=1") for m in got):
            got.append(sock.recv(4096).decode())
        assert any(m.startswith("STOPPING=1") for m in got)
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
