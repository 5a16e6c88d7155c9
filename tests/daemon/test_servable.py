"""Readiness in watch mode against a real HTTP server written here (not a mock): it answers
/health, /v1/models and /v1/completions as vLLM's OpenAI server does, and can be told to fail
completions or to stop. The log is the first 105 lines of a real vLLM 0.32 run
(tests/fixtures/real-v0.32-llama.log: up to `Application startup complete.`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import (
    Config,
    GpuConfig,
    HttpConfig,
    LogConfig,
    ModelConfig,
    VllmConfig,
)
from tests.conftest import FIXTURES
from tests.daemon.harness import running

INTERVAL_S = 0.5


class FakeVllm(ThreadingHTTPServer):
    """vLLM's OpenAI routes, as far as loadwatch asks them."""

    daemon_threads = True

    def __init__(self, completion_status: int = 200) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.completion_status = completion_status
        self.requests: list[dict[str, Any]] = []
        self.health_probes = 0
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/health"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: FakeVllm

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: object) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.server.health_probes += 1
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        doc = json.loads(self.rfile.read(length) or b"{}")
        self.server.requests.append({"path": self.path, **doc})
        if self.path != "/v1/completions":
            self._send(404, {"detail": "Not Found"})
        elif self.server.completion_status != 200:
            err = {"object": "error", "message": "EngineCore encountered an issue", "code": 500}
            self._send(self.server.completion_status, err)
        else:
            self._send(
                200, {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "!"}]}
            )


def _config(tmp_path: Path, server: FakeVllm, servable: bool) -> Config:
    log = tmp_path / "vllm.log"
    lines = (FIXTURES / "real-v0.32-llama.log").read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:105]))
    return Config(
        log=LogConfig(path=log, poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        model=ModelConfig(dir=None),
        vllm=VllmConfig(
            health_url=server.health_url,
            health_interval_s=INTERVAL_S,
            servable=servable,
            servable_prompt="The capital of France is",
            servable_timeout_s=5.0,
        ),
        state_dir=tmp_path / "state",
    )


@pytest.fixture
def server() -> Iterator[FakeVllm]:
    s = FakeVllm()
    yield s
    s.stop()


def test_servable_ready_after_one_completion_and_its_latency_exported(
    tmp_path: Path, server: FakeVllm
) -> None:
    with running(_config(tmp_path, server, servable=True)) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready", 20)
        (req,) = server.requests
        assert req == {
            "path": "/v1/completions",
            "model": "tiny-llama",
            "prompt": "The capital of France is",
            "max_tokens": 1,
        }
        s = d.status()["session"]
        assert s["first_completion_s"] is not None and 0 < s["first_completion_s"] < 5
        assert d.metrics()["loadwatch_first_completion_seconds"] == pytest.approx(
            s["first_completion_s"]
        )


def test_a_failing_completion_is_not_ready_and_a_failure_of_its_own(
    tmp_path: Path, server: FakeVllm
) -> None:
    server.completion_status = 500
    with running(_config(tmp_path, server, servable=True)) as d:
        d.wait(lambda: d.status()["session"]["failure_kind"] == "completion_failed", "failed")
        code, body = d.get("/readyz")
        assert code == 503 and b"failed" in body
        s = d.status()["session"]
        assert s["phase"] == "failed" and s["first_completion_s"] is None
        assert "HTTP 500" in s["failures"][0]["message"]
        assert d.metrics()['loadwatch_failures_total{kind="completion_failed"}'] == 1.0
        assert "loadwatch_first_completion_seconds" not in d.metrics()


def test_without_servable_health_alone_makes_ready(tmp_path: Path, server: FakeVllm) -> None:
    server.completion_status = 500
    with running(_config(tmp_path, server, servable=False)) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready", 20)
        # (a servable check follows the first /health 200 in its round: later rounds come after)
        probes = server.health_probes
        d.wait(lambda: server.health_probes >= probes + 2, "two more rounds", 20)
        assert d.get("/readyz")[0] == 200 and server.requests == []


def test_health_that_stops_answering_ends_ready_within_two_intervals(
    tmp_path: Path, server: FakeVllm
) -> None:
    with running(_config(tmp_path, server, servable=False)) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready", 20)
        server.stop()
        stopped = time.monotonic()
        d.wait(lambda: d.get("/readyz")[0] == 503, "not ready", 10)
        took = time.monotonic() - stopped
        print(f"503 after {took:.2f} s, probe interval {INTERVAL_S} s")
        assert took <= 2 * INTERVAL_S + 0.3  # (+ the probe's own time and a publish)
        _, body = d.get("/readyz")
        assert b"/health failed 2 times in a row" in body
