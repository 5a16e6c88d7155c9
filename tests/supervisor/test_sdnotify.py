from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

from loadwatch.daemon.sdnotify import SdNotifier, child_environment, one_line, socket_address


def _listener(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    s.settimeout(2.0)
    return s


def test_messages_reach_a_real_datagram_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with _listener(path) as sock:
        n = SdNotifier({"NOTIFY_SOCKET": path})
        assert n.enabled
        assert n.ready("loading 3/12 shards\n12 GiB")
        assert sock.recv(4096) == b"READY=1\nSTATUS=loading 3/12 shards 12 GiB"
        assert n.status("weights 50%")
        assert sock.recv(4096) == b"STATUS=weights 50%"
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert n.stopping()
        assert sock.recv(4096) == b"STOPPING=1"
        assert n.sent_total == 4 and n.errors_total == 0
        n.close()


def test_abstract_namespace_socket() -> None:
    name = f"loadwatch-test-{uuid.uuid4().hex}"
    with _listener("\0" + name) as sock:
        n = SdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert n.ready()
        assert sock.recv(4096) == b"READY=1"


def test_no_notify_socket_is_a_no_op() -> None:
    n = SdNotifier({})
    assert not n.enabled
    assert n.ready() is False and n.watchdog() is False
    assert n.watchdog_interval_s is None
    assert n.sent_total == 0 and n.errors_total == 0


def test_send_failure_is_counted(tmp_path: Path) -> None:
    n = SdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.status("x") is False
    assert n.errors_total == 1 and n.last_error is not None and "\n" not in n.last_error


def test_watchdog_interval_is_half_and_honours_watchdog_pid() -> None:
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "20000000"}
    assert SdNotifier(env).watchdog_interval_s == 10.0
    assert SdNotifier({**env, "WATCHDOG_PID": str(os.getpid())}).watchdog_interval_s == 10.0
    assert SdNotifier({**env, "WATCHDOG_PID": str(os.getpid() + 1)}).watchdog_interval_s is None
    assert SdNotifier({**env, "WATCHDOG_USEC": "x"}).watchdog_interval_s is None
    assert SdNotifier({"WATCHDOG_USEC": "20000000"}).watchdog_interval_s is None


def test_run_watchdog_pings_at_the_interval(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)
        if len(slept) == 3:
            raise asyncio.CancelledError

    with _listener(path) as sock:
        n = SdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "3000000"})
        try:
            asyncio.run(n.run_watchdog(fake_sleep))
        except asyncio.CancelledError:
            pass
        assert slept == [1.5, 1.5, 1.5]
        assert [sock.recv(64) for _ in range(3)] == [b"WATCHDOG=1"] * 3


def test_helpers() -> None:
    assert socket_address("@abc") == "\0abc"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("vsock:2:1234") is None and socket_address("") is None
    assert one_line("a\n b\tc") == "a b c"
    assert len(one_line("x" * 1000)) == 400
    env = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1", "PATH": "/bin"}
    assert child_environment(env) == {"PATH": "/bin"}
