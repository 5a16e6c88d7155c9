"""What the HTTP abuse tests share: a real daemon on loopback with an empty log, and the share of
scrapes it answers, as Prometheus makes them (a fresh connection each, a 2 s timeout)."""

from __future__ import annotations

import http.client
from pathlib import Path

from tests.reliability.proc import DaemonProc

SCRAPES = 20


def idle_daemon(tmp_path: Path) -> tuple[DaemonProc, str, int]:
    """The daemon (its `[http] max_connections` at the default) and its host and port."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0"],
        tmp_path / "out.jsonl",
    )  # fmt: skip
    host, port = d.wait_listening().removeprefix("http://").rsplit(":", 1)
    return d, host, int(port)


def _scrape_ok(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return resp.status == 200 and b"loadwatch_" in resp.read()
    except OSError:
        return False
    finally:
        conn.close()


def answered(host: str, port: int) -> float:
    """The share of `SCRAPES` scrapes of /metrics answered 200, one after another."""
    return sum(_scrape_ok(host, port) for _ in range(SCRAPES)) / SCRAPES
