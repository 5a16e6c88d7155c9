"""Clients of a real vLLM 0.32 (on the CPU) write into its log; loadwatch in watch mode (the
systemd unit's default) follows that log and must not take their words for vLLM's.

vLLM runs with `--enable-log-requests`. Once loadwatch says ready, a client sends what a red team
sent: chat requests for unknown models named after an OOM, an NCCL error and `max_model_len`
(vLLM logs each at ERROR), completions whose `X-Request-Id` holds the version line, `Starting to
load model` and the API server's URL pointing at a recorder on another loopback port, and a
completion whose `request_id` field holds line breaks (vLLM writes each line with the request
logger's header). Afterwards the session, its phase, `/readyz`, `/livez` and every metric an
alert reads are as they were, the recorder received no connection, and the client's records
were counted.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadwatch.daemon.config import (
    Config,
    GpuConfig,
    HttpConfig,
    LogConfig,
    ModelConfig,
    VllmConfig,
)
from tests.daemon.harness import Running, running
from tests.e2e.test_watch_readiness import build_model, wait_ready
from tests.realvllm.vllmproc import ServerSpec, VllmServer, free_port

pytestmark = [pytest.mark.realvllm, pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 1.0


class Recorder:
    """A loopback TCP listener that counts every connection made to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def _alert_metrics() -> set[str]:
    """Every loadwatch metric an alert rule reads (prometheus/alerts.yml)."""
    text = (ROOT / "prometheus" / "alerts.yml").read_text()
    names = set(re.findall(r"\bloadwatch_[a-z_]+", text))
    assert len(names) > 10, names
    return names


def _alert_view(metrics: dict[str, float], names: set[str]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.split("{", 1)[0] in names and "seconds" not in k}


def _post(url: str, body: dict[str, object], headers: dict[str, str] | None = None) -> int:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[VllmServer, Running, Path]]:
    model = build_model(tmp_path / "llama", "--arch", "llama")
    log = tmp_path / "vllm.log"
    work = Path(tempfile.mkdtemp(prefix="lw-client-"))  # vLLM's IPC paths must stay short
    spec = ServerSpec(
        model=model, work_dir=work, port=free_port(), extra_args=("--enable-log-requests",)
    )
    server = VllmServer(spec, log)
    server.start(rss_interval_s=None)
    cfg = Config(
        log=LogConfig(path=log, poll_interval_s=0.1),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        model=ModelConfig(dir=None),
        vllm=VllmConfig(health_interval_s=INTERVAL_S),
        state_dir=tmp_path / "state",
    )
    try:
        with running(cfg) as d:
            yield server, d, model
    finally:
        server.stop(grace_s=20)
        shutil.rmtree(work, ignore_errors=True)


def test_what_clients_make_vllm_log_changes_nothing(
    served: tuple[VllmServer, Running, Path],
) -> None:
    server, d, model = served
    wait_ready(server, d)
    names = _alert_metrics()
    before_status = d.status()
    before_alerts = _alert_view(d.metrics(), names)
    session = before_status["session"]
    assert session["phase"] == "ready" and before_status["sessions_total"] == 1
    recorder = Recorder()
    base = server.spec.base_url
    try:
        for name in (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
            "RuntimeError: NCCL error: unhandled system error",
            "ValueError: max_model_len (4096) is greater than the derived max_model_len (512)",
        ):
            chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            assert _post(f"{base}/v1/chat/completions", chat) == 404
        completion = {"model": str(model), "prompt": "hi", "max_tokens": 1}
        for request_id in (
            "x vLLM API server version 6.6.6",
            "x Starting to load model /m",
            f"x Starting vLLM API server 0 on http://127.0.0.1:{recorder.port}/",
            "x (Worker_TP0 pid=1) Application startup complete.",
        ):
            status = _post(f"{base}/v1/completions", completion, {"X-Request-Id": request_id})
            assert status == 200
        # line breaks in the body's request id: each line gets the request logger's header
        lines = (
            "b\nvLLM API server version 6.6.6\nStarting to load model /m\n"
            f"Starting vLLM API server 0 on http://127.0.0.1:{recorder.port}/\n"
            "EngineCore encountered a fatal error."
        )
        assert _post(f"{base}/v1/completions", {**completion, "request_id": lines}) == 200
        log = server.log_path.read_bytes()
        assert b"[request_logger.py:" in log and b"] vLLM API server version 6.6.6" in log
        # the daemon has read it all and probed /health several times since
        size = len(log)
        d.wait(lambda: d.metrics()["loadwatch_log_read_bytes_total"] >= size, "log read", 30)
        read_at = time.time()
        d.wait(
            lambda: d.status()["health"]["at"] >= read_at + 2 * INTERVAL_S,
            "more /health probes since",
            30,
        )
        after_status = d.status()
        after = after_status["session"]
        assert after_status["sessions_total"] == 1
        assert (after["id"], after["phase"], after["failure_kind"]) == (
            session["id"],
            "ready",
            None,
        )
        assert after["version"] == session["version"]
        assert not any(f["fatal"] for f in after["failures"]), after["failures"]
        assert d.get("/readyz")[0] == 200 and d.get("/livez")[0] == 200
        metrics = d.metrics()
        assert _alert_view(metrics, names) == before_alerts
        counted = {k: v for k, v in metrics.items() if "client_text_records" in k}
        assert counted.get('loadwatch_log_client_text_records_total{kind="model_error"}') == 3
        assert sum(counted.values()) >= 3
        assert recorder.connections == 0
    finally:
        recorder.close()
