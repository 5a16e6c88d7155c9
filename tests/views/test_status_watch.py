"""`loadwatch status --watch` as operators run it: on a pipe (one plain frame per interval), on a
terminal (a real pseudo-terminal; `q` quits), laid out for the width it has, identical per-GPU
lines folded, long durations readable. Against the daemon's real HTTP server on loopback."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadwatch.daemon.config import HttpConfig
from loadwatch.daemon.state.published import Published
from loadwatch.exporters.http.server import HttpServer
from loadwatch.exporters.terminal.fmt import duration
from loadwatch.exporters.terminal.watch import status_text
from tests.helpers import wait_for

from .helpers import routes
from .test_status import mid_load, published

LOADWATCH = Path(sys.executable).with_name("loadwatch")


@pytest.fixture
def server() -> Iterator[HttpServer]:
    state, now, _ = mid_load(gpus=8)
    pub: Published = published(state, now)
    srv = HttpServer(HttpConfig(port=0), routes(lambda: pub, lambda: True, lambda: now))
    srv.start()
    yield srv
    srv.stop()


def test_watch_on_a_pipe_writes_a_plain_frame_per_interval(server: HttpServer) -> None:
    proc = subprocess.Popen(
        [str(LOADWATCH), "status", "--watch", "--interval", "0.2", "--url", server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "100"},
    )
    chunks: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: b"".join(chunks).count(b"LOADING WEIGHTS") >= 3, "three frames", 20)
    finally:
        proc.terminate()
        proc.wait(10)
        reader.join(10)
    assert proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    text = b"".join(chunks).decode()
    frames = text.count("LOADING WEIGHTS")
    assert frames >= 3, text
    assert "\x1b[" not in text and "Traceback" not in err.decode()
    assert text.count("-" * 100 + "\n") == frames  # each frame headed by a rule


def test_host_port_without_a_scheme_is_http(server: HttpServer) -> None:
    r = subprocess.run(
        [str(LOADWATCH), "status", "--url", server.url.removeprefix("http://")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0 and "LOADING WEIGHTS" in r.stdout, r.stderr


def _read_until(fd: int, needle: bytes, timeout_s: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_q_quits_the_screen_on_a_terminal(server: HttpServer) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: loadwatch on the pseudo-terminal
        os.environ["COLUMNS"] = "120"
        os.execv(
            str(LOADWATCH),
            [str(LOADWATCH), "status", "--watch", "--interval", "5", "--url", server.url],
        )
    try:
        seen = _read_until(fd, b"LOADING", 20)
        assert b"LOADING" in seen, seen[-500:]
        os.write(fd, b"q")
        deadline = time.monotonic() + 3  # well inside the 5 s interval
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            _read_until(fd, b"\x00", 0.1)  # keep the pty drained
        assert status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def _gpu_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line[:2] in {f"{i} " for i in range(8)}]


def test_gpu_table_fits_80_columns_and_uses_160() -> None:
    state, now, _ = mid_load(gpus=8)
    doc = state.snapshot(now).to_dict()
    narrow, wide = status_text(doc, 80), status_text(doc, 160)
    rows80, rows160 = _gpu_rows(narrow), _gpu_rows(wide)
    assert len(rows80) == len(rows160) == 8
    for row in rows80:
        assert len(row) <= 80 and "…" not in row, row
    for g, row in zip(doc["gpus"], rows80, strict=True):
        used, total = g["memory_used_bytes"] / 2**30, g["memory_total_bytes"] / 2**30
        assert f"{used:.1f} / {total:.1f}" in row
        assert f"{g['projected_final_bytes'] / 2**30:.1f}" in row
    assert "…" not in narrow.split("GPUs", 1)[1].split("\n\n")[0]
    bar80 = sum(row.count(c) for row in rows80[:1] for c in "█▒░│▶")
    bar160 = sum(row.count(c) for row in rows160[:1] for c in "█▒░│▶")
    assert bar160 >= 2 * bar80, (rows80[0], rows160[0])


def test_identical_per_gpu_notes_are_folded() -> None:
    state, now, _ = mid_load(scale=1.4, gpus=8)
    doc = state.snapshot(now).to_dict()
    for g in doc["gpus"]:  # eight GPUs predicting the same shortfall
        g.update(
            projected_final_bytes=110 * 2**30,
            shortfall_bytes=14 * 2**30,
            oom_predicted=True,
            oom_predicted_since=None,
        )
    text = status_text(doc, 120)
    notes = [line for line in text.splitlines() if "out of memory predicted" in line]
    assert len(notes) == 1 and notes[0].startswith("GPUs 0-7: out of memory predicted"), notes
    doc["gpus"][3]["shortfall_bytes"] = 20 * 2**30
    notes = [line for line in status_text(doc, 120).splitlines() if "out of memory" in line]
    assert [n.split(":")[0] for n in notes] == ["GPUs 0-2, 4-7", "GPU 3"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(5.25, "5.2s"), (42, "42s"), (754, "12m34s"), (7380, "2h03m"), (135814, "1d13h")],
)
def test_durations_read_as_operators_write_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_long_stall_reads_in_days_and_hours() -> None:
    from loadwatch.daemon.sources.inputs import Tick

    state, now, _ = mid_load()
    last = state.snapshot(now).to_dict()["session"]["progress"]["last_progress_at"]
    later = last + 135814
    state = state.apply(Tick(), later)
    doc = state.snapshot(later).to_dict()
    assert doc["phase"] == "stalled"
    reason = doc["session"]["stall"]["reason"]
    assert reason.endswith("for 1d13h") and "135814" not in reason, reason
    assert "1d13h" in status_text(doc) and "135814" not in status_text(doc)
