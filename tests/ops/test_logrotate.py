"""The shipped logrotate snippet, run by the real logrotate against a real `loadwatch run`: the
events file is rotated, SIGHUP (what the snippet's `systemctl reload` sends) makes the daemon
reopen it, and no event is lost or written twice across the rotation."""

from __future__ import annotations

import getpass
import grp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.views.helpers import FIXTURES

from .common import SYSTEMD, require

SNIPPET = SYSTEMD / "loadwatch.logrotate"


def _events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wait(check: object, what: str, timeout_s: float = 30) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out: {what}")


def test_rotation_by_the_shipped_snippet_loses_and_repeats_nothing(tmp_path: Path) -> None:
    require("logrotate")
    log, events = tmp_path / "vllm.log", tmp_path / "events.jsonl"
    lines = (FIXTURES / "real-v0.32-llama.log").read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    log.write_bytes(b"".join(lines[:half]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--log", str(log),
         "--events-file", str(events), "--gpu", "none", "--listen", "127.0.0.1:0",
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        _wait(lambda: any(e["event"] == "log.milestone" for e in _events(events)), "events")
        time.sleep(0.5)  # the first half's events all out
        before = [e for e in _events(events) if str(e["event"]).startswith("log.")]
        # The snippet as shipped, for this test's file, user and daemon.
        text = SNIPPET.read_text()
        text = re.sub(r"^/var/log/loadwatch/\S+ /var/log/loadwatch/\S+ \{", f"{events} {{", text,
                      flags=re.M)  # fmt: skip
        group = grp.getgrgid(os.getgid()).gr_name
        text = text.replace(
            "create 0640 loadwatch loadwatch", f"create 0640 {getpass.getuser()} {group}"
        )
        text = re.sub(r"systemctl reload .*$", f"kill -HUP {proc.pid}", text, flags=re.M)
        assert f"kill -HUP {proc.pid}" in text and str(events) in text
        conf = tmp_path / "logrotate.conf"
        conf.write_text(text)
        r = subprocess.run(
            [shutil.which("logrotate") or "logrotate", "-f", "-s", str(tmp_path / "state.lr"),
             str(conf)],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        rotated = tmp_path / "events.jsonl.1"  # delaycompress: the newest stays plain
        assert rotated.exists()
        with log.open("ab") as f:
            f.write(b"".join(lines[half:]))
        _wait(lambda: any(e["event"] == "log.milestone" for e in _events(events)), "new file")
        time.sleep(1.0)
        old = [e for e in _events(rotated) if str(e["event"]).startswith("log.")]
        new = [e for e in _events(events) if str(e["event"]).startswith("log.")]
        assert old == before and new  # the reopened file gets what came after, nothing before
        # Every record's events once: what `loadwatch events` reads from the whole log.
        whole = subprocess.run(
            [sys.executable, "-m", "loadwatch.daemon.cli", "events", str(log)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        want = [
            (f"log.{e['type']}", e["offset"])
            for e in map(json.loads, whole.stdout.split("\n")[:-1])
        ]
        assert [(e["event"], e.get("offset")) for e in old + new] == want
        assert oct(events.stat().st_mode & 0o777) == "0o640"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
