"""A free TCP port for a server started next (the demo's fake vLLM, the tests' servers)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` nothing listens on now, for a server started next. Taken below the
    kernel's ephemeral range where there is room: a port of that range can go to any outgoing
    connection (a probe, the server's own sockets, another program's) before the server binds
    it. Random, so that servers started side by side do not pick the same one."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    rng = random.SystemRandom()
    for _ in range(64 if low > 4096 else 0):
        port = rng.randrange(max(1024, low - 16384), low)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # (in use)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
