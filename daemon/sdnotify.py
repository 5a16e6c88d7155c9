"""systemd's notify protocol, without libsystemd: one datagram per message to ``$NOTIFY_SOCKET``.

Everything is a no-op when ``NOTIFY_SOCKET`` is unset (not started by systemd with
``Type=notify``). A send that fails is counted, never raised: the daemon must not die because
systemd went away.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Mapping

# Variables that belong to this process only: a child that inherited them could ping or mark
# the service ready in our name.
NOTIFY_ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str) -> str | None:
    """The AF_UNIX address for a ``NOTIFY_SOCKET`` value; ``@name`` is the abstract namespace."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # vsock (``vsock:CID:PORT``) and relative paths are not supported


def one_line(text: str, limit: int = 400) -> str:
    """STATUS= must be one line; systemd shows it verbatim in ``systemctl status``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class SdNotifier:
    """Sends notify messages; reads its settings from ``env`` (default: ``os.environ``)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        env = os.environ if env is None else env
        self._pid = os.getpid() if pid is None else pid
        self._address = socket_address(env.get("NOTIFY_SOCKET", ""))
        self._sock: socket.socket | None = None
        self.sent_total = 0
        self.errors_total = 0
        self.last_error: str | None = None
        self.watchdog_interval_s = self._watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def _watchdog_interval(self, env: Mapping[str, str]) -> float | None:
        """Half of ``WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises; None when off or not ours."""
        if not self.enabled:
            return None
        try:
            usec = int(env.get("WATCHDOG_USEC", ""))
        except ValueError:
            return None
        if usec <= 0:
            return None
        wd_pid = env.get("WATCHDOG_PID")
        if wd_pid:
            try:
                if int(wd_pid) != self._pid:
                    return None
            except ValueError:
                return None
        return usec / 1e6 / 2

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines in one datagram. False when disabled or the send failed."""
        if self._address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, self._address)
        except OSError as exc:
            self.errors_total += 1
            self.last_error = f"sd_notify to {self._address!r} failed: {exc}"
            self.close()
            return False
        self.sent_total += 1
        return True

    def ready(self, status: str | None = None) -> bool:
        fields = ["READY=1"]
        if status is not None:
            fields.append("STATUS=" + one_line(status))
        return self.notify(*fields)

    def status(self, text: str) -> bool:
        return self.notify("STATUS=" + one_line(text))

    def stopping(self, status: str | None = None) -> bool:
        fields = ["STOPPING=1"]
        if status is not None:
            fields.append("STATUS=" + one_line(status))
        return self.notify(*fields)

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    async def run_watchdog(
        self, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep
    ) -> None:
        """Ping forever at the configured interval; returns at once when no watchdog is asked.

        Run it as a task on the daemon's loop: a ping then proves the loop itself is alive.
        """
        interval = self.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.watchdog()
            await sleep(interval)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the notify variables, for processes we start."""
    return {k: v for k, v in env.items() if k not in NOTIFY_ENV_VARS}
