"""Watch mode against real vLLM 0.32 on the CPU: loadwatch follows the log of a vLLM something
else started, probes /health at the URL the log printed, and /readyz ends within two probe
intervals when vLLM is stopped with SIGTERM (its shutdown lines: stopped) and with SIGKILL (no
line: the probe and the process gone from /proc say it, and the session fails as `vanished`).
A loadwatch started after the SIGKILL on the dead vLLM's log never says ready and ends the
session the same way. A start that cannot fit its KV cache is one failure, of its root cause.
The servable check passes on the real server, and fails when the real completion endpoint
refuses the request (a prompt longer than the server's --max-model-len 512: vLLM answers 400
while /health and /v1/models answer)."""

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
from tests.helpers import offline_events, records, wait_for
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
    wait_for(lambda: d.get("/readyz")[0] == 503, "/readyz 503 after the stop", limit_s, 0.02)
    return time.monotonic() - since


def wait_ready(server: VllmServer, d: Running) -> None:
    def ready() -> bool:
        if server.poll() is not None:  # (not an AssertionError: that would wait on)
            raise RuntimeError(f"vLLM exited with {server.poll()}")
        return bool(d.get("/readyz")[0] == 200)

    wait_for(ready, "ready", START_S, every_s=0.2)


@pytest.mark.parametrize("vllm_and_daemon", [(True, "Hello")], indirect=True)
def test_servable_passes_or_fails_by_the_first_completion_then_sigterm_ends_ready(
    vllm_and_daemon: tuple[VllmServer, Running], tmp_path: Path
) -> None:
    """Two loadwatches follow one vLLM: one's servable check asks for a completion vLLM gives,
    the other's for one it refuses (a prompt longer than --max-model-len: HTTP 400 while
    /health and /v1/models answer). Then SIGTERM ends the first's readiness."""
    server, d = vllm_and_daemon
    (tmp_path / "refused").mkdir()
    with running(_config(tmp_path / "refused", server.log_path, True, TOO_LONG)) as refused:
        wait_ready(server, d)
        s = d.status()["session"]
        assert s["first_completion_s"] is not None and s["first_completion_s"] > 0
        assert d.metrics()["loadwatch_first_completion_seconds"] > 0
        assert d.status()["health"]["ok"] is True
        _servable_fails(server, refused)
    pid = server.pid
    assert pid is not None
    os.killpg(pid, signal.SIGTERM)
    took = _time_to_503(d, time.monotonic(), 2 * INTERVAL_S + 1.0)
    print(f"SIGTERM: /readyz 503 after {took:.2f} s (probe interval {INTERVAL_S} s)")
    assert took <= 2 * INTERVAL_S
    assert d.status()["phase"] == "stopped"


@pytest.mark.parametrize("vllm_and_daemon", [(False, "Hello")], indirect=True)
def test_sigkill_ends_ready_and_a_loadwatch_started_after_it_is_never_ready(
    vllm_and_daemon: tuple[VllmServer, Running], tmp_path: Path
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
    # no shutdown line and no stop asked for: a failure of its own kind, which the alert sees
    d.wait(lambda: d.status()["phase"] == "failed", "failed", 2 * INTERVAL_S + 1)
    s = d.status()["session"]
    assert s["failure_kind"] == "vanished", s
    m = d.metrics()
    assert m["loadwatch_load_ready"] == 0.0
    assert m['loadwatch_session_failure{kind="vanished"}'] == 1.0
    assert m['loadwatch_failures_total{kind="vanished"}'] == 1.0
    assert server.wait_exit(30) == -signal.SIGKILL
    _never_ready_on_a_dead_log(server.log_path, pid, tmp_path / "late")


def _readyz_until_failed(d: Running, limit_s: float) -> list[int]:
    """Every /readyz answer until the phase is failed (or `limit_s` passes)."""
    answers: list[int] = []

    def failed() -> bool:
        answers.append(d.get("/readyz")[0])
        return bool(d.status()["phase"] == "failed")

    wait_for(failed, "the session failed", limit_s, every_s=0.02)
    return answers


def _never_ready_on_a_dead_log(log: Path, pid: int, work: Path) -> None:
    """The log says `Application startup complete.`; the vLLM that wrote it (API server `pid`)
    was SIGKILLed before this loadwatch started. /readyz never says 200, and the session fails
    (`vanished`): /health fails at the logged loopback URL and no process has the pid here."""
    work.mkdir()
    with running(_config(work, log, False, "Hello")) as d:
        answers = _readyz_until_failed(d, 4 * INTERVAL_S + 10)
        s = d.status()["session"]
        print(f"read back: {len(answers)} /readyz answers, then {s['phase']}")
        assert s["phase"] == "failed" and s["failure_kind"] == "vanished", s
        assert s["server_pid"] == pid and s["ready_at"] is not None  # ready, by the log
        assert 200 not in answers, answers
        assert d.metrics()['loadwatch_session_failure{kind="vanished"}'] == 1.0


def test_a_start_that_cannot_fit_its_kv_cache_is_one_failure_of_its_root_cause(
    llama: Path, tmp_path: Path
) -> None:
    """`--kv-cache-memory-bytes 1000000`: vLLM logs `EngineCore failed to start.`, then the
    KV-cache traceback, the dead worker, the API server's `Engine core initialization failed`.
    The event log says one failure, `kv_cache_too_small` (never `engine_init_failed` first),
    and the alert's kind is that one."""
    log = tmp_path / "vllm.log"
    work = Path(tempfile.mkdtemp(prefix="lw-kv-"))
    spec = ServerSpec(
        model=llama,
        work_dir=work,
        port=free_port(),
        kv_cache_space_gib=None,
        extra_args=("--kv-cache-memory-bytes", "1000000"),
    )
    server = VllmServer(spec, log)
    kinds: set[str] = set()
    try:
        with running(_config(tmp_path, log, False, "Hello")) as d:
            server.start(rss_interval_s=None)

            def exited() -> bool:  # (the alert's kinds seen on the way)
                kinds.update(k for k, v in _session_failure(d).items() if v == 1.0)
                return server.poll() is not None

            wait_for(exited, "vLLM's exit", START_S, every_s=0.2)
            d.wait(lambda: d.status()["phase"] == "failed", "failed", 20)
            # the last echoes read (a traceback closes after 2 s of quiet): every record's
            # events, as `loadwatch events` reads the whole log
            want = set(offline_events(log))
            d.wait(lambda: want <= _written(d), "every record's events", 20)
            kinds |= {k for k, v in _session_failure(d).items() if v == 1.0}
            events = d.events()
            read = [e["kind"] for e in events if e.get("event") == "log.failure"]
            said = [e for e in events if e.get("event") == "transition.failure"]
            failed = [
                e
                for e in events
                if e.get("event") == "transition.phase" and e.get("phase_to") == "failed"
            ]
            s = d.status()["session"]
    finally:
        server.stop(grace_s=20)
        shutil.rmtree(work, ignore_errors=True)
    print(f"read {read}; said {[(e['failure_kind'], e.get('fatal')) for e in said]}")
    assert read[0] == "engine_init_failed" and "kv_cache_too_small" in read and len(read) >= 3
    assert [(e["failure_kind"], e["fatal"]) for e in said] == [("kv_cache_too_small", True)]
    assert [e["failure_kind"] for e in failed] == ["kv_cache_too_small"]
    assert s["failure_kind"] == "kv_cache_too_small", s
    assert kinds == {"kv_cache_too_small"}, kinds  # what LoadwatchLoadFailed's kind would be


def _written(d: Running) -> set[tuple[str, int]]:
    """The log events the daemon wrote, (`log.TYPE`, offset), a folded line as its records."""
    return {(e["event"], e["offset"]) for e in records(d.events()) if e["event"].startswith("log.")}


def _session_failure(d: Running) -> dict[str, float]:
    return {
        k.split('kind="', 1)[1].rstrip('"}'): v
        for k, v in d.metrics().items()
        if k.startswith("loadwatch_session_failure{")
    }


# far more tokens than --max-model-len 512 (the tiny tokenizer gives one per word at least)
TOO_LONG = "hello " * 3000


def _servable_fails(server: VllmServer, d: Running) -> None:
    """`d`'s servable check fails on the first completion, vLLM itself being fine."""
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
