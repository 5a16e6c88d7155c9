"""Where the daemon's probes of vLLM go, through the real daemon in watch mode (and supervise
mode for the argv's API key), against real loopback HTTP servers written here.

The log is a real vLLM 0.32 run (tests/fixtures/real-v0.32-llama.log, up to `Application startup
complete.`). Its line `Starting vLLM server on http://127.0.0.1:8321` (vLLM's entry.py) carries
the URL: the tests write it with a port of theirs, and write the same
line with a URL someone else chose, as a client of vLLM can get such text into its log. The
parser reads that line while vLLM starts (until `Application startup complete.`), so the forged
line goes just before that one.

A `Recorder` on another port counts every connection made to it (before any byte is read): it
must count none.

Where a test is about rounds in which something must not happen again, it drives the watch itself
(`Rounds`): the real daemon's log source and state, its pause an injected sleep, so five rounds
are five rounds and take no wall time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
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
from loadwatch.daemon.loop import Daemon, vllm_watch
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.vllm_watch import VllmWatch
from loadwatch.exporters.eventlog import EventLog
from tests.conftest import FIXTURES
from tests.daemon.harness import Running, running
from tests.helpers import append, wait_for

INTERVAL_S = 0.1
REAL_URL = "http://127.0.0.1:8321"
_LINES = (FIXTURES / "real-v0.32-llama.log").read_text().splitlines(keepends=True)
REAL = _LINES[: 1 + next(i for i, x in enumerate(_LINES) if "Application startup complete" in x)]
URL_LINE = next(i for i, x in enumerate(REAL) if f"Starting vLLM server on {REAL_URL}" in x)
KEY = "sk-probe-0f3e9a71c2d4"


def api_line(url: str) -> str:
    """vLLM's line naming its URL, with `url` in it."""
    return REAL[URL_LINE].replace(REAL_URL, url)


def run_log(url: str, forged: str | None = None, *, complete: bool = True) -> str:
    """The real run, its API server on `url`; a `forged` URL line before its last line, which
    is left out unless `complete`."""
    lines = [*REAL[:URL_LINE], api_line(url), *REAL[URL_LINE + 1 : -1]]
    if forged is not None:
        lines.append(api_line(forged))
    return "".join(lines + (REAL[-1:] if complete else []))


def finish(d: Running, forged: str) -> None:
    """Append the forged line and the run's last line to the daemon's log."""
    assert d.daemon is not None and d.daemon.cfg.log.path is not None
    append(d.daemon.cfg.log.path, api_line(forged) + REAL[-1])


class Server(ThreadingHTTPServer):
    """A loopback HTTP server that counts connections and records requests (path, headers)."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), handler)
        self.connections = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.redirect_to: str | None = None
        threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1
        super().process_request(request, client_address)

    def paths(self, method: str = "GET") -> list[str]:
        return [p for m, p, _ in self.requests if m == method]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class VllmRoutes(BaseHTTPRequestHandler):
    """What loadwatch asks of vLLM's OpenAI server: `/health`, `/v1/models`, `/v1/completions`."""

    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.requests.append(("GET", self.path, dict(self.headers)))
        if self.path == "/health" and self.server.redirect_to:
            self._send(302, {}, {"Location": self.server.redirect_to})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}]})
        else:
            self._send(200, {})  # (a recorder answers whatever it is asked)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.requests.append(("POST", self.path, dict(self.headers)))
        self._send(200, {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "!"}]})


@pytest.fixture
def vllm() -> Iterator[Server]:
    s = Server(VllmRoutes)
    yield s
    s.stop()


@pytest.fixture
def recorder() -> Iterator[Server]:
    s = Server(VllmRoutes)
    yield s
    s.stop()


def watch_config(tmp_path: Path, log_text: str, **vllm: Any) -> Config:
    log = tmp_path / "vllm.log"
    log.write_text(log_text)
    settings: dict[str, Any] = {"health_interval_s": INTERVAL_S, **vllm}
    return Config(
        log=LogConfig(path=log, poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        model=ModelConfig(dir=None),
        vllm=VllmConfig(**settings),
        state_dir=tmp_path / "state",
    )


def problems(d: Running) -> list[str]:
    return [str(e.get("error")) for e in d.events() if e.get("event") == "daemon.problem"]


def probes_then(server: Server, more: int) -> None:
    """Wait until `server` answered `more` further /health probes (the watch went on)."""
    start = server.paths().count("/health")
    wait_for(
        lambda: server.paths().count("/health") >= start + more,
        f"{more} further probes of {server.url}",
    )


class Rounds:
    """The watch alone, on the real daemon's log source and state; its pause is an injected
    sleep that ends `run` after the rounds asked for."""

    def __init__(self, cfg: Config, watch: Callable[[Daemon], VllmWatch] = vllm_watch) -> None:
        self.out = io.StringIO()
        self.left = 0
        self.daemon = Daemon(
            cfg,
            eventlog=EventLog(self.out, None, console=False),
            gpu=NullGpuSource(),
            sleep=self._pause,
        )
        assert self.daemon.open_log() is not None
        self.read()
        self.watch = watch(self.daemon)

    async def _pause(self, seconds: float) -> None:
        self.left -= 1
        if self.left <= 0:
            self.daemon.stop_event.set()

    def read(self) -> None:
        """Fold what the log holds now."""
        d = self.daemon
        assert d.log is not None
        d.take_log(d.log.read())
        while d.log.backlog:
            d.take_log(d.log.read())

    def append(self, text: str) -> None:
        assert self.daemon.cfg.log.path is not None
        append(self.daemon.cfg.log.path, text)
        self.read()

    def run(self, rounds: int) -> None:
        self.daemon.stop_event.clear()
        self.left = rounds
        asyncio.run(self.watch.run())

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.out.getvalue().splitlines()]

    def problems(self) -> list[str]:
        return [str(e.get("error")) for e in self.events() if e.get("event") == "daemon.problem"]

    def ready(self) -> bool:
        """What /readyz says 200 for."""
        d = self.daemon
        return d.state.snapshot(d.clock()).not_ready is None


def api_milestone_count(d: Running) -> int:
    ms = d.status()["session"]["milestones"]
    return next(int(m["count"]) for m in ms if m["key"] == "api_server_start")


def test_a_later_logged_url_is_ignored(tmp_path: Path, vllm: Server, recorder: Server) -> None:
    with running(watch_config(tmp_path, run_log(vllm.url, complete=False))) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        finish(d, recorder.url)
        d.wait(lambda: api_milestone_count(d) == 2, "the second URL read")
        probes_then(vllm, 5)
        assert recorder.connections == 0 and d.get("/readyz")[0] == 200
        assert d.status()["session"]["phase"] == "ready"


def test_a_url_logged_later_in_the_session_loses_on_restart_too(
    tmp_path: Path, vllm: Server, recorder: Server
) -> None:
    """The daemon starts on a log that already holds both lines (a restart replays the
    session): the first one still wins."""
    cfg = watch_config(tmp_path, run_log(vllm.url, recorder.url))
    with running(cfg) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        probes_then(vllm, 5)
        assert recorder.connections == 0


def test_an_unparsable_port_later_does_not_end_the_probes(tmp_path: Path, vllm: Server) -> None:
    with running(watch_config(tmp_path, run_log(vllm.url, complete=False))) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        finish(d, "http://127.0.0.1:18999-0-90eced95.")
        d.wait(lambda: api_milestone_count(d) == 2, "the bad URL read")
        probes_then(vllm, 5)
        assert not [p for p in problems(d) if "health stopped" in p]


def test_a_malformed_url_is_said_once_and_the_watch_goes_on(tmp_path: Path, vllm: Server) -> None:
    """The session's only URL has a port that is no number: one `daemon.problem`, and the
    task lives on: the next session's URL (vLLM started again in the same log) is probed."""
    w = Rounds(watch_config(tmp_path, run_log("http://127.0.0.1:18999-0-90eced95.")))
    w.run(5)  # the URL refused in the first round; four more must not say it again
    (said,) = w.problems()
    assert "18999-0-90eced95" in said and "port" in said
    w.append(run_log(vllm.url))
    w.run(3)
    assert vllm.paths().count("/health") == 3
    assert w.ready(), "the new session ready"
    assert len(w.problems()) == 1


def test_a_redirect_is_a_failed_probe_and_its_target_is_not_asked(
    tmp_path: Path, vllm: Server, recorder: Server
) -> None:
    vllm.redirect_to = f"{recorder.url}/elsewhere"
    with running(watch_config(tmp_path, run_log(vllm.url))) as d:
        d.wait(
            lambda: vllm.paths().count("/health") >= 3 and d.get("/readyz")[0] == 503,
            "three probes and readiness lost",
        )
        health = d.status()["health"]
        assert health["ok"] is False and health["status"] == 302
        assert "redirect" in health["error"] and "not followed" in health["error"]
        assert recorder.connections == 0
        assert d.get("/readyz")[0] == 503


def test_an_ftp_url_is_refused_without_a_connection(tmp_path: Path, recorder: Server) -> None:
    url = f"ftp://127.0.0.1:{recorder.server_address[1]}"
    w = Rounds(watch_config(tmp_path, run_log(url)))
    w.run(5)
    assert recorder.connections == 0
    (said,) = w.problems()
    assert "ftp" in said and "http" in said


def _other_address() -> str | None:
    """This machine's address on a network, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 9))
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith("127.") else addr


@pytest.fixture
def lan_recorder() -> Iterator[Server]:
    addr = _other_address()
    if addr is None:
        pytest.skip("this machine has no address besides loopback")
    s = Server(VllmRoutes, host=addr)
    yield s
    s.stop()


def test_a_host_off_loopback_is_refused_without_a_connection(
    tmp_path: Path, lan_recorder: Server
) -> None:
    w = Rounds(watch_config(tmp_path, run_log(lan_recorder.url)))
    w.run(5)
    assert lan_recorder.connections == 0
    (said,) = w.problems()
    assert lan_recorder.server_address[0] in said and "allowed_hosts" in said


def test_allowed_hosts_lets_the_log_name_that_host(tmp_path: Path, lan_recorder: Server) -> None:
    host = lan_recorder.server_address[0]
    cfg = watch_config(tmp_path, run_log(lan_recorder.url), allowed_hosts=(host,))
    with running(cfg) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        assert "/health" in lan_recorder.paths() and problems(d) == []


def test_the_api_key_file_goes_with_the_servable_check(tmp_path: Path, vllm: Server) -> None:
    key_file = tmp_path / "vllm.key"
    key_file.write_text(f"  {KEY}\n")
    cfg = watch_config(tmp_path, run_log(vllm.url), servable=True, api_key_file=key_file)
    with running(cfg) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        sent = {(m, p): h.get("Authorization") for m, p, h in vllm.requests}
        assert sent[("GET", "/v1/models")] == f"Bearer {KEY}"
        assert sent[("POST", "/v1/completions")] == f"Bearer {KEY}"
        assert sent[("GET", "/health")] is None  # (vLLM asks none there)
        assert d.daemon is not None and d.daemon.redactor.text(f"key {KEY}") == "key ***"
        assert KEY not in d.out.getvalue() and KEY not in json.dumps(d.status())


# The supervised "vLLM": prints the real run's log (its API server on the URL given), then
# waits for the signal that stops it.
CHILD = """
import signal, sys
sys.stdout.write(open(sys.argv[1]).read())
sys.stdout.flush()
signal.pause()
"""


def test_the_supervised_argv_api_key_goes_with_the_servable_check(
    tmp_path: Path, vllm: Server
) -> None:
    script = tmp_path / "run.log"
    script.write_text(run_log(vllm.url))
    argv = (sys.executable, "-c", CHILD, str(script), "--api-key", KEY, "--port", "1")
    cfg = watch_config(tmp_path, "", servable=True, argv=argv, preflight="off", restart="never")
    cfg = dataclasses.replace(
        cfg,
        vllm=dataclasses.replace(cfg.vllm, health_url=f"{vllm.url}/health"),  # type: ignore[type-var]
        log=LogConfig(path=tmp_path / "state" / "vllm.log", poll_interval_s=0.05),
    )
    with running(cfg) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        sent = {(m, p): h.get("Authorization") for m, p, h in vllm.requests}
        assert sent[("POST", "/v1/completions")] == f"Bearer {KEY}"
        assert KEY not in d.out.getvalue()


class RaisingRounds(VllmWatch):
    """The watch with rounds that raise, as a fault no log line should be able to cause would:
    the loop must say it and go on."""

    rounds = 0
    failing = 0

    async def _round(self) -> None:
        self.rounds += 1
        if self.rounds <= self.failing:
            raise RuntimeError("a fault in the round")


def test_a_round_that_raises_is_said_once_and_the_rounds_go_on(tmp_path: Path) -> None:
    def three_failing(d: Daemon) -> VllmWatch:
        watch = vllm_watch(d, kind=RaisingRounds)
        watch.failing = 3  # type: ignore[attr-defined]
        return watch

    w = Rounds(watch_config(tmp_path, ""), three_failing)
    w.run(5)
    assert isinstance(w.watch, RaisingRounds) and w.watch.rounds == 5
    said = w.events()
    assert [e["event"] for e in said] == ["daemon.problem"]
    assert "RuntimeError: a fault in the round" in said[0]["error"]
