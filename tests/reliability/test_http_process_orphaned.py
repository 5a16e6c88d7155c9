"""The HTTP server process when the daemon dies under it (SIGKILL about 1 s after the start).

The real server process (`python -m loadwatch.exporters.http.process FD`) on one end of a socket
pair; the test is the daemon on the other end and vanishes at each step of the start: before
the configuration, right after it (the process's `ok` reply then meets a closed socket:
BrokenPipeError), after the reply. Each time the process ends by itself, exit 0, with nothing on
stderr: no traceback for the journal.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import subprocess
import sys
import urllib.parse

import pytest

from loadwatch.daemon.config import HttpConfig
from loadwatch.exporters.http.board import frame, read_frame
from tests.reliability.proc import REPO, wait_for


def _config() -> bytes:
    cfg = dataclasses.replace(HttpConfig(), port=0)
    body = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    return frame(json.dumps(body).encode())


def _answers(url: str) -> bool:
    """An HTTP answer, whatever its status."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status > 0
    finally:
        conn.close()


@pytest.mark.parametrize("when", ["before the config", "after the config", "after the reply"])
def test_server_process_ends_quietly_when_the_daemon_is_gone(when: str) -> None:
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadwatch.exporters.http.process", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    theirs.close()
    if when != "before the config":
        ours.sendall(_config())
    if when == "after the reply":
        ours.settimeout(20)
        reply = (read_frame(ours) or b"").decode()
        assert reply.startswith("ok ")
        wait_for(lambda: _answers(reply.split()[1]), "the server serving", 10)
    ours.close()  # as the kernel closes it for a daemon killed with SIGKILL
    try:
        code = proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    assert "Traceback" not in err and err == "", err
    assert code == 0
