"""The HTTP server's process: board frames, and the process's life beside the daemon's."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadwatch.daemon.config import HttpConfig
from loadwatch.exporters.http.board import Board, decode, encode, read_frame
from loadwatch.exporters.http.process import HttpProcess
from loadwatch.exporters.http.server import ServerError
from tests.helpers import wait_for


@given(
    st.binary(max_size=4096),
    st.none() | st.binary(max_size=512),
    st.booleans(),
    st.text(max_size=64),
)
def test_a_board_survives_its_frame(
    metrics: bytes, status: bytes | None, ready: bool, why: str
) -> None:
    board = Board(metrics, status, ready, why)
    frame = encode(board)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert decode(frame[4:]) == Board(metrics, status, ready, why.encode().decode())


@given(st.binary(max_size=64))
def test_a_malformed_frame_is_a_value_error(body: bytes) -> None:
    try:
        board = decode(body)
    except ValueError:
        return
    assert encode(board)[4:] == body  # what decodes is exactly what some board encodes to


def test_frames_are_read_whole_across_short_reads() -> None:
    a, b = socket.socketpair()
    big = Board(b"x" * 3_000_000, b"{}", True, "")
    frame = encode(big)
    with a, b:
        a.setblocking(True)
        t = threading.Thread(target=a.sendall, args=(frame + encode(Board(b"", None, False, "n")),))
        t.start()
        first, second = read_frame(b), read_frame(b)
        t.join()
        a.close()
        assert first is not None and decode(first) == big
        assert second is not None and decode(second).not_ready == "n"
        assert read_frame(b) is None  # the peer closed


def get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_the_server_process_serves_the_latest_board_and_ends_with_the_socket() -> None:
    server = HttpProcess(HttpConfig(port=0))
    url = server.start()
    try:
        assert get(url, "/status")[0] == 503  # nothing sent yet
        assert get(url, "/readyz") == (503, b"not ready: starting\n")
        server.send(Board(b"loadwatch_up 1\n", b'{"phase": "ready"}\n', True, ""))
        wait_for(lambda: get(url, "/readyz")[0] == 200, "the board served", 5)
        assert get(url, "/readyz") == (200, b"ready\n")
        assert get(url, "/status") == (200, b'{"phase": "ready"}\n')
        code, body = get(url, "/metrics")
        assert code == 200 and body.startswith(b"loadwatch_up 1\n")
        # the server's own request counts follow the board's exposition
        assert b'loadwatch_http_requests_total{code="200",route="/readyz"}' in body
        assert get(url, "/healthz") == (200, b"ok\n")
        pid = server.pid
        assert pid is not None
    finally:
        server.stop()
    assert server.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped
    with pytest.raises(OSError):
        get(url, "/healthz")


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_server_process_that_dies_or_hangs_is_replaced_on_the_same_address(how: str) -> None:
    problems: list[str] = []
    # (a server that reads nothing is stuck after 1 s, and killed 0.5 s after its socket closed)
    server = HttpProcess(
        HttpConfig(port=0), on_problem=problems.append, send_timeout_s=1.0, end_wait_s=0.5
    )
    url = server.start()
    try:
        server.send(Board(b"m 1\n", b"{}\n", True, ""))
        wait_for(lambda: get(url, "/readyz")[0] == 200, "first board served")
        first = server.pid
        assert first is not None
        if how == "killed":
            os.kill(first, signal.SIGKILL)
        else:
            os.kill(first, signal.SIGSTOP)  # it reads nothing more: the socket fills up
        # the loop goes on publishing (boards big enough to fill the socket of one that reads
        # nothing) until a new server process runs; send() never blocks, whatever the server does
        sent, slowest = 0, 0.0

        def publish() -> bool:
            nonlocal sent, slowest
            t0 = time.monotonic()
            server.send(Board(b"m %d\n" % sent + b"x" * 20_000, b"{}\n", True, ""))
            slowest = max(slowest, time.monotonic() - t0)
            sent += 1
            return server.pid not in (None, first)

        wait_for(publish, "a new server process", 30, every_s=0.005)
        assert slowest < 0.5, f"a send waited {slowest:.3f} s"
        newest = b"m %d\n" % (sent - 1)
        wait_for(lambda: get(url, "/metrics")[1].startswith(newest), "the newest board", 30)
        assert server.restarts == 1
        assert len(problems) == 1 and "HTTP server process" in problems[0], problems
        assert get(url, "/readyz") == (200, b"ready\n")
    finally:
        server.stop()


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match=f"cannot listen on 127.0.0.1:{port}"):
            HttpProcess(HttpConfig(port=port)).start()


def test_a_missing_token_file_is_one_line(tmp_path: Path) -> None:
    cfg = HttpConfig(port=0, bearer_token_file=tmp_path / "absent")
    with pytest.raises(ServerError) as err:
        HttpProcess(cfg).start()
    assert "\n" not in str(err.value) and "absent" in str(err.value)


def test_the_server_never_outlives_a_killed_daemon(tmp_path: Path) -> None:
    """A parent killed with SIGKILL cannot stop its HTTP process: the closed socket does."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import signal\n"
        "from loadwatch.daemon.config import HttpConfig\n"
        "from loadwatch.exporters.http.process import HttpProcess\n"
        "s = HttpProcess(HttpConfig(port=0)); url = s.start()\n"
        "print(s._proc.pid, url, flush=True); signal.pause()\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid_s, url = parent.stdout.readline().split()
    assert get(url, "/healthz")[0] == 200
    parent.send_signal(signal.SIGKILL)
    parent.wait(5)
    try:
        wait_for(lambda: not _running(int(pid_s)), "the HTTP process to end with its daemon", 5)
    finally:
        if _running(int(pid_s)):
            os.kill(int(pid_s), signal.SIGKILL)


def _running(pid: int) -> bool:
    """Alive and not a zombie. A test of the supervisor earlier in this pytest process may have
    made it a child subreaper (as the daemon is): the orphaned HTTP process is then re-parented
    here and waits to be reaped once it exits."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    if state in ("Z", "X"):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True


def test_a_scrape_asks_for_a_board_that_is_behind_and_the_probes_never_do() -> None:
    """Counters are rendered when read: a scrape of /metrics or /status that finds the board
    behind (and older than the publishing interval) asks the daemon, which answers with a new
    board; /readyz answers the board held; a board not behind, or one asked for too recently,
    is served as it is."""
    wants: list[float] = []
    boards = iter(Board(b"m %d\n" % n, b'{"n": %d}\n' % n, True, "") for n in range(2, 100))
    server: HttpProcess

    def want() -> None:  # the daemon: a new board when asked for (its loop's thread does this)
        wants.append(time.monotonic())
        server.send(next(boards))

    server = HttpProcess(HttpConfig(port=0, publish_interval_s=0.2), on_want=want)
    url = server.start()
    try:
        server.send(Board(b"m 1\n", b'{"n": 1}\n', True, ""))
        wait_for(lambda: get(url, "/readyz")[0] == 200, "the first board served", 5)
        assert get(url, "/metrics")[1].startswith(b"m 1\n") and wants == []  # not behind
        server.stale()
        began = time.monotonic()
        # probes, for longer than the interval, answer the board held and never ask
        wait_for(
            lambda: get(url, "/readyz") == (200, b"ready\n") and time.monotonic() - began > 0.3,
            "probes past the interval",
            5,
        )
        assert wants == []
        assert get(url, "/metrics")[1].startswith(b"m 2\n")  # asked for, and waited for
        assert len(wants) == 1
        server.stale()  # behind again at once: the board is younger than the interval
        assert get(url, "/status")[1] == b'{"n": 2}\n' and len(wants) == 1
        wait_for(lambda: get(url, "/status")[1] == b'{"n": 3}\n', "asked past the interval", 5)
        assert len(wants) == 2
    finally:
        server.stop()


def test_a_restarted_server_hears_that_its_board_is_behind() -> None:
    wants: list[int] = []
    server = HttpProcess(
        HttpConfig(port=0, publish_interval_s=0.05), on_want=lambda: wants.append(1)
    )
    url = server.start()
    try:
        server.send(Board(b"m 1\n", b"{}\n", True, ""))
        server.stale()  # (the daemon's state moved on; nobody asked yet)
        wait_for(lambda: get(url, "/readyz")[0] == 200, "first board served")
        first = server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)

        def beat() -> bool:  # (the loop's heartbeats: a frame finds the server gone)
            server.alive()
            return server.pid not in (None, first)

        wait_for(beat, "a new server process", 30)
        wait_for(lambda: get(url, "/readyz")[0] == 200, "the last board served again", 30)
        wants.clear()
        # the restarted server knew its board was behind, and asks (nobody answers here: it
        # serves the board it has)
        wait_for(lambda: get(url, "/metrics")[1].startswith(b"m 1\n") and wants, "an ask", 10)
    finally:
        server.stop()
