"""The HTTP side under abuse: /metrics stays quick for a well-behaved scraper, nothing breaks.

The real daemon (a subprocess, following a load) is hit from another process for 12 s by 200
scrapers, 40 clients that never finish their request (a byte a second), 40 that send nothing,
oversized and malformed requests (a 1 MiB request line, 300 headers, a 200 KiB header, an 8 MiB
body, binary garbage, a bad method, HTTP/0.9, a huge version), and unknown paths. Meanwhile this
process scrapes /metrics every 20 ms as Prometheus would (more often, for a steadier p99): its p99 must stay under 50 ms. Before
the abuse the same scraper measures the quiet p99, side by side. Afterwards: every abusive
request got an error status or a closed connection and never a 200 or a 500, the clients that
never finish were dropped within the request timeout, the daemon serves on from the same HTTP
server process with as many threads as before, and its stderr holds no traceback.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.faults import load_steps
from tests.reliability.proc import REPO, DaemonProc, wait_for

ABUSE_S = 12.0
TIMEOUT_S = 3.0


def _scrape(host: str, port: int) -> float:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert resp.status == 200 and b"loadwatch_load_phase" in body
    return time.perf_counter() - t0


def _scrapes(host: str, port: int, seconds: float, every_s: float) -> list[float]:
    """Scrape /metrics at a scraper's pace for `seconds`: each scrape's time."""
    took = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        took.append(_scrape(host, port))
        time.sleep(every_s)  # (real: a scraper's pace, as Prometheus keeps one)
    return took


def _p99(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def _http_process(pid: int) -> int:
    """The daemon's HTTP server process (`python -m loadwatch.exporters.http.process`), its child."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (
            int(stat.rsplit(")", 1)[1].split()[1]) == pid
            and b"loadwatch.exporters.http.process" in cmdline
        ):
            return int(entry.name)
    raise AssertionError(f"no HTTP server process under {pid}")


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


@pytest.mark.slow  # bounded: see the module docstring
def test_metrics_stay_quick_under_abuse(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("".join(load_steps("/models/m", 12, 3, [5])[0]))
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'state'}'\n[log]\npath = '{log}'\n"
        f"[http]\nlisten = '127.0.0.1:0'\nrequest_timeout_s = {TIMEOUT_S}\n"
        "[gpu]\nsource = 'simulated'\npoll_interval_s = 0.5\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
    d.wait_listening()
    host, port = "127.0.0.1", int(d.url.rsplit(":", 1)[1])
    try:
        wait_for(lambda: d.status()["phase"] == "loading_weights", "the load")
        httpd = _http_process(d.pid)  # the handlers' threads are there, not in the daemon
        threads_before = _threads(httpd)
        quiet = _scrapes(host, port, 3.0, 0.05)

        abuser = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.http_abuse", host, str(port), str(ABUSE_S)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)  # (real: the abusers start spread over their first second)
        loud = _scrapes(host, port, ABUSE_S - 3, 0.02)
        out, _ = abuser.communicate(timeout=ABUSE_S + 60)
        report = json.loads(out)
        assert d.proc.poll() is None, "the daemon died"
        assert _http_process(d.pid) == httpd, "the HTTP server process was restarted"
        wait_for(lambda: _threads(httpd) <= threads_before + 1, "handler threads to end", 15)
        assert d.get("/healthz")[0] == 200
    finally:
        code = d.stop()
    assert code == 0 and "Traceback" not in d.stderr(), d.stderr()

    counts: dict[str, int] = report["counts"]
    print(
        f"\n/metrics p99 quiet {_p99(quiet) * 1e3:.1f} ms, under abuse {_p99(loud) * 1e3:.1f} ms "
        f"(max {max(loud) * 1e3:.1f} ms, {len(loud)} scrapes); abuse: "
        + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        + f"; slow clients kept up to {max(report['kept_s']['trickle'] + [0]):.1f} s (trickle), "
        f"{max(report['kept_s']['silent'] + [0]):.1f} s (silent)"
    )
    assert _p99(loud) < 0.050, f"p99 {_p99(loud) * 1e3:.1f} ms under abuse"
    assert counts.get("scrape 200", 0) >= 1000
    for key, n in counts.items():
        kind, _, result = key.rpartition(" ")
        if kind.startswith(("oversized", "unknown path")):
            assert result not in ("200", "500"), (key, n)
        if kind == "unknown path":
            assert result in ("404", "400"), (key, n)
    assert all(k.endswith(": 414") for k in counts if "request line" in k)
    assert all(k.endswith((": 405", ": reset", ": closed")) for k in counts if "body" in k)
    # a client that never finishes its request is dropped once the request timeout is up
    for kind in ("trickle", "silent"):
        assert report["kept_s"][kind] and max(report["kept_s"][kind]) < TIMEOUT_S + 2.5, kind
