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
from pathlib import Path

from tests.helpers import offline_events, wait_for
from tests.views.helpers import FIXTURES

from .common import SYSTEMD, require

SNIPPET = SYSTEMD / "loadwatch.logrotate"


def _events(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _log_events(path: Path) -> list[tuple[object, object]]:
    """The log's events in an events file: (event, offset), in order."""
    return [
        (e["event"], e.get("offset")) for e in _events(path) if str(e["event"]).startswith("log.")
    ]


def test_rotation_by_the_shipped_snippet_loses_and_repeats_nothing(tmp_path: Path) -> None:
    require("logrotate")
    log, events = tmp_path / "vllm.log", tmp_path / "events.jsonl"
    lines = (FIXTURES / "real-v0.32-llama.log").read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    log.write_bytes(b"".join(lines[:half]))
    want = offline_events(FIXTURES / "real-v0.32-llama.log")  # (what the log holds at the end)
    first_half = [w for w in want if w[1] < log.stat().st_size]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--log", str(log),
         "--events-file", str(events), "--gpu", "none", "--listen", "127.0.0.1:0",
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for(lambda: _log_events(events) == first_half, "the first half's events all out", 30)
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
        wait_for(
            lambda: _log_events(rotated) + _log_events(events) == want,
            "the second half's events",
            30,
        )
        old = [e for e in _events(rotated) if str(e["event"]).startswith("log.")]
        new = [e for e in _events(events) if str(e["event"]).startswith("log.")]
        assert old == before and new  # the reopened file gets what came after, nothing before
        # Every record's events once: what `loadwatch events` reads from the whole log.
        assert [(e["event"], e.get("offset")) for e in old + new] == want
        assert oct(events.stat().st_mode & 0o777) == "0o640"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
