"""Watch mode against real vLLM 0.32 on the CPU: loadwatch follows the log of a vLLM something
else started, probes /health at the URL the log printed, and /readyz ends within two probe
intervals when vLLM is stopped with SIGTERM (its shutdown lines) and with SIGKILL (no line: the
probe and the process gone from /proc say it). The servable check passes on the real server,
and fails when the real completion endpoint refuses the request (a prompt longer than the
server's --max-model-len 512: vLLM answers 400 while /health and /v1/models answer)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
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
from tests.realvllm.vllmproc import ServerSpec, VllmServer, free_port, vllm_available, vllm_python

pytestmark = [pytest.mark.realvllm, pytest.mark.slow, pytest.mark.timeout(900)]
TINYMODEL = Path(__file__).resolve().parent.parent / "realvllm" / "tinymodel.py"
INTERVAL_S = 1.0
START_S = 240.0  # a vLLM start to /health 200 (about 25 s alone; more on a busy machine)


def build_model(out: Path, *args: str) -> Path:
    if not vllm_available():  # `make test` installs it first: missing is a failure, not a skip
        pytest.fail(f"no vLLM environment at {vllm_python()}: run `make vllm`")
    subprocess.run(
        [str(vllm_python()), str(TINYMODEL), str(out), "--shards", "3", "--shard-mb", "4", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("models") / "llama", "--arch", "llama")


def _config(work: Path, log: Path, servable: bool, prompt: str) -> Config:
    return Config(
        log=LogConfig(path=log, poll_interval_s=0.1),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        model=ModelConfig(dir=None),
        # no health_url: the one the log prints (`Starting vLLM server on http://127.0.0.1:N`)
        vllm=VllmConfig(
            health_interval_s=INTERVAL_S,
            servable=servable,
            servable_prompt=prompt,
            servable_timeout_s=60.0,
        ),
        state_dir=work / "state",
    )


@pytest.fixture
def vllm_and_daemon(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[VllmServer, Running]]:
    servable, prompt = request.param
    model_dir = request.getfixturevalue("llama")
    log = tmp_path / "vllm.log"
    # vLLM's IPC socket paths live in TMPDIR and must stay under 107 bytes: a short work dir
    work = Path(tempfile.mkdtemp(prefix="lw-watch-"))
    spec = ServerSpec(model=model_dir, work_dir=work, port=free_port())
    server = VllmServer(spec, log)
    server.start(rss_interval_s=None)
    try:
        with running(_config(tmp_path, log, servable, prompt)) as d:
            yield server, d
    finally:
        server.stop(grace_s=20)
        shutil.rmtree(work, ignore_errors=True)


def _time_to_503(d: Running, since: float, limit_s: float) -> float:
    end = since + limit_s
    while time.monotonic() < end:
        if d.get("/readyz")[0] == 503:
            return time.monotonic() - since
        time.sleep(0.02)
    raise AssertionError(f"/readyz still 200 {limit_s} s after the stop: {d.get('/readyz')}")


def wait_ready(server: VllmServer, d: Running) -> None:
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        if d.get("/readyz")[0] == 200:
            return
        if server.poll() is not None:
            raise AssertionError(f"vLLM exited with {server.poll()}")
        time.sleep(0.2)
    raise AssertionError(f"not ready after {START_S} s: {d.get('/readyz')}")


@pytest.mark.parametrize("vllm_and_daemon", [(True, "Hello")], indirect=True)
def test_servable_passes_then_sigterm_ends_ready(
    vllm_and_daemon: tuple[VllmServer, Running],
) -> None:
    server, d = vllm_and_daemon
    wait_ready(server, d)
    s = d.status()["session"]
    assert s["first_completion_s"] is not None and s["first_completion_s"] > 0
    assert d.metrics()["loadwatch_first_completion_seconds"] > 0
    assert d.status()["health"]["ok"] is True
    pid = server.pid
    assert pid is not None
    os.killpg(pid, signal.SIGTERM)
    took = _time_to_503(d, time.monotonic(), 2 * INTERVAL_S + 1.0)
    print(f"SIGTERM: /readyz 503 after {took:.2f} s (probe interval {INTERVAL_S} s)")
    assert took <= 2 * INTERVAL_S
    assert d.status()["phase"] == "stopped"


@pytest.mark.parametrize("vllm_and_daemon", [(False, "Hello")], indirect=True)
def test_sigkill_ends_ready_within_two_probe_intervals(
    vllm_and_daemon: tuple[VllmServer, Running],
) -> None:
    server, d = vllm_and_daemon
    wait_ready(server, d)
    s = d.status()["session"]
    assert s["server_pid"] == server.pid  # the API server's pid, from the log's prefixes
    pid = server.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    took = _time_to_503(d, time.monotonic(), 2 * INTERVAL_S + 1.0)
    print(f"SIGKILL: /readyz 503 after {took:.2f} s (probe interval {INTERVAL_S} s)")
    assert took <= 2 * INTERVAL_S
    d.wait(lambda: d.status()["phase"] == "stopped", "stopped", 2 * INTERVAL_S + 1)
    assert d.metrics()["loadwatch_load_ready"] == 0.0


# far more tokens than --max-model-len 512 (the tiny tokenizer gives one per word at least)
TOO_LONG = "hello " * 3000


@pytest.mark.parametrize("vllm_and_daemon", [(True, TOO_LONG)], indirect=True)
def test_servable_fails_when_the_first_completion_fails(
    vllm_and_daemon: tuple[VllmServer, Running],
) -> None:
    server, d = vllm_and_daemon
    # /health 200 first (the daemon's /status answers 503 until its first board: retried)
    d.wait(lambda: d.status()["health"]["ok"] is True, "/health 200", START_S)
    try:
        d.wait(lambda: d.status()["session"]["phase"] == "failed", "failed", 120)
    except AssertionError:
        tail = server.log_path.read_bytes()[-3000:].decode("utf-8", "replace")
        raise AssertionError(f"{d.status()['session']}\n--- vLLM log tail ---\n{tail}") from None
    s = d.status()["session"]
    assert d.get("/readyz")[0] == 503
    assert s["ready_at"] is not None  # /health said 200: ready as /health alone means it
    assert s["failure_kind"] == "completion_failed", s["failures"]
    assert "HTTP 400" in s["failures"][0]["message"], s["failures"]
    assert s["first_completion_s"] is None
    assert server.poll() is None and server.health_status() == 200  # vLLM itself is fine
