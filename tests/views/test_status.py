"""`loadwatch status`: the screen drawn from real snapshots (fixture and built logs folded by
`LoadState`, GPUs from `SimulatedGpuSource`), and the command against the daemon's real HTTP
server on loopback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadwatch.daemon.config import HttpConfig
from loadwatch.daemon.sim.gpus import GIB, SimulatedGpuSource
from loadwatch.daemon.sources.inputs import HealthProbe, ProcessEvent, Tick
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import Published, Totals
from loadwatch.daemon.tools.ports import free_port
from loadwatch.exporters.http.server import Handler, HttpServer, Response
from loadwatch.exporters.terminal.watch import render_status, status_command, status_text

from .helpers import FIXTURES, fold_log, linear_progress, model_of, routes, synth_load_log

T0 = 1_785_000_000.0
LOADWATCH = Path(sys.executable).with_name("loadwatch")


def mid_load(scale: float = 1.0, gpus: int = 2) -> tuple[LoadState, float, SimulatedGpuSource]:
    """60 of 119 shards in, GPUs polled every 2 s; `scale` > 1 makes memory outgrow the GPU."""
    clock = [0.0]
    sim = SimulatedGpuSource(
        gpus,
        progress=linear_progress(T0 + 40, 119 * 8.0, clock, scale),
        final_used_bytes=[88 * GIB + i * 2 * GIB for i in range(gpus)],
        clock=lambda: clock[0],
    )
    state, now = fold_log(
        synth_load_log(T0, upto=60, scale_layers=3), model=model_of(119), gpus=sim, clock=clock
    )
    return state, now, sim


def gib(n: float) -> str:
    return f"{n / 2**30:.1f}"


def test_mid_load_screen_shows_the_figures() -> None:
    state, now, _ = mid_load()
    doc = state.snapshot(now + 3).to_dict()
    text = status_text(doc)
    p = doc["session"]["progress"]
    assert (p["shards_done"], p["shards_total"]) == (60, 119)
    assert "LOADING WEIGHTS" in text and "session 1" in text and "vLLM 0.15.1" in text
    assert f"{100 * p['ratio']:5.1f}%" in text and "60/119 shards" in text
    assert "300.0 GiB / 595.0 GiB" in text  # 60 shards of 5 GiB
    eta = p["eta"]
    assert "ETA" in text and f"{eta['remaining_s'] // 60:.0f}m" in text
    assert "2 × NVIDIA RTX PRO 6000 Blackwell Server Edition" in text
    for g in doc["gpus"]:
        row = next(line for line in text.splitlines() if line.startswith(f"{g['index']}  "))
        assert f"{gib(g['memory_used_bytes'])} / {gib(g['memory_total_bytes'])}" in row
        assert gib(g["projected_final_bytes"]) in row and "│" in row and "OOM" not in row
    assert abs(doc["gpus"][0]["projected_final_bytes"] - 88 * GIB) < 2 * GIB
    assert "out of memory" not in text
    assert "kv_scale_missing ×6, layers 0-2" in text


def test_oom_predicted_is_marked() -> None:
    state, now, _ = mid_load(scale=1.4)
    doc = state.snapshot(now).to_dict()
    g = doc["gpus"][0]
    assert g["oom_predicted"] and g["projected_final_bytes"] > g["memory_total_bytes"]
    text = status_text(doc)
    row = next(line for line in text.splitlines() if line.startswith("0  "))
    assert "▶" in row and "OOM" in row
    assert (
        f"GPU 0: out of memory predicted: {gib(g['projected_final_bytes'])} GiB projected" in text
    )
    assert f"short {gib(g['shortfall_bytes'])} GiB" in text


def test_lost_gpu_and_gpu_source_down() -> None:
    state, now, sim = mid_load()
    sim.lose_gpu(1)
    state = state.apply(sim.poll(), now + 1)
    text = status_text(state.snapshot(now + 1).to_dict())
    assert "lost: GPU is lost (NVML error 15)" in text
    sim.set_library_missing()
    state = state.apply(sim.poll(), now + 2)
    text = status_text(state.snapshot(now + 2).to_dict())
    assert "source down: NVML init failed" in text


def test_stalled_load() -> None:
    state, now, _ = mid_load()
    for i in range(1, 200):
        state = state.apply(Tick(), now + i)
    doc = state.snapshot(now + 199).to_dict()
    assert doc["phase"] == "stalled"
    text = status_text(doc)
    assert "STALLED" in text and "no shard finished" in text
    assert doc["session"]["stall"]["reason"] in text


def test_failed_load_with_supervisor_and_health() -> None:
    data = (FIXTURES / "real-v0.32-kv-too-small.log").read_bytes()
    state, now = fold_log(data)
    state = state.apply(ProcessEvent(kind="exited", ts=now + 1, pid=None, exit_code=1), now + 1)
    for i in (2, 3):
        probe = HealthProbe(ok=False, ts=now + i, error="connection refused")
        state = state.apply(probe, now + i)
    doc = state.snapshot(now + 2).to_dict()
    text = status_text(doc)
    assert "FAILED" in text
    assert "✗ kv_cache_too_small" in text and "max seq len (512)" in text
    assert "exited" in text and "exit code 1" in text
    assert "/health no answer: connection refused (2 failures in a row)" in text
    assert "weights" in text and "12/12 shards" in text


def test_restarts_are_listed() -> None:
    state, now = fold_log((FIXTURES / "v1-2026-sm120.log").read_bytes())
    doc = state.snapshot(now).to_dict()
    text = status_text(doc)
    assert "READY" in text and "session 2 (1 restart)" in text
    assert "#1 failed: fp8_kv_unsupported" in text
    assert "ready 17m05s after start" in text


def test_waiting_and_partial_documents() -> None:
    assert "waiting for vLLM" in status_text(LoadState().snapshot(T0).to_dict())
    assert "waiting for vLLM" in status_text({"schema": 1, "phase": None})
    text = status_text({"schema": 1, "phase": "loading_weights", "session": {"id": 3}})
    assert "LOADING WEIGHTS" in text and "session 3" in text


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_KEYS = ["schema", "at", "phase", "ready", "restarts", "session", "sessions", "model", "kv_cache"]
_KEYS += ["gpu_source_up", "gpu_error", "gpus", "supervisor", "health"]
_SESSION_KEYS = ["id", "phase", "progress", "stall", "warnings", "failures", "version", "pid"]


@settings(max_examples=100, deadline=None)
@given(
    top=st.dictionaries(st.sampled_from(_KEYS), _json),
    session=st.dictionaries(st.sampled_from(_SESSION_KEYS), _json),
    gpus=st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "index",
                    "health",
                    "memory_used_bytes",
                    "memory_total_bytes",
                    "projected_final_bytes",
                    "oom_predicted",
                ]
            ),
            _json,
        ),
        max_size=3,
    ),
)
def test_any_document_renders(
    top: dict[str, Any], session: dict[str, Any], gpus: list[Any]
) -> None:
    doc = {**top, "session": session, "gpus": gpus}
    status_text(doc, width=80)  # never raises, whatever the daemon sent
    render_status(doc)


# -- the command against a real server ---------------------------------------------------------


def published(state: LoadState, at: float) -> Published:
    return Published(
        state=state,
        at=at,
        started_at=at - 60,
        version="test",
        totals=Totals(),
        log=None,
        gpu=None,
        supervisor=None,
        load_budget_s=None,
    )


@pytest.fixture
def daemon() -> Iterator[tuple[HttpServer, float]]:
    state, now, _ = mid_load()
    pub = published(state, now)
    srv = HttpServer(HttpConfig(port=0), routes(lambda: pub, lambda: True, lambda: now))
    srv.start()
    yield srv, now
    srv.stop()


def serve(handlers: Mapping[str, Handler], **cfg: Any) -> HttpServer:
    srv = HttpServer(HttpConfig(port=0, **cfg), handlers)
    srv.start()
    return srv


def run(url: str, capsys: pytest.CaptureFixture[str], **kw: Any) -> tuple[int, str, str]:
    args: dict[str, Any] = {"watch": False, "as_json": False, "interval_s": 1.0}
    args.update(kw)
    code = status_command(url, **args)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, *needles: str) -> None:
    assert err.startswith("loadwatch: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


def test_once_as_text(daemon: tuple[HttpServer, float], capsys: pytest.CaptureFixture[str]) -> None:
    srv, _ = daemon
    code, out, err = run(srv.url, capsys)
    assert (code, err) == (0, "")
    assert "LOADING WEIGHTS" in out and "60/119 shards" in out and "GPUs" in out
    assert "\x1b[" not in out and all(line == line.rstrip() for line in out.splitlines())


def test_once_as_json(daemon: tuple[HttpServer, float], capsys: pytest.CaptureFixture[str]) -> None:
    srv, _ = daemon
    code, out, _ = run(srv.url + "/", capsys, as_json=True)
    doc = json.loads(out)
    assert code == 0 and doc["schema"] == 1 and doc["phase"] == "loading_weights"
    assert doc["session"]["progress"]["shards_done"] == 60 and len(doc["gpus"]) == 2


def test_watch_redraws_until_interrupted(
    daemon: tuple[HttpServer, float], capsys: pytest.CaptureFixture[str]
) -> None:
    srv, _ = daemon
    naps: list[float] = []

    def nap(s: float) -> None:  # the injected sleep; the third nap is Ctrl-C
        naps.append(s)
        if len(naps) == 3:
            raise KeyboardInterrupt

    code, out, err = run(srv.url, capsys, watch=True, interval_s=0.5, sleep=nap)
    assert (code, err) == (0, "") and naps == [0.5, 0.5, 0.5]
    assert srv.stats.requests[("/status", 200)] == 3
    assert "60/119 shards" in out  # the last frame stays on screen

    naps.clear()
    code, out, _ = run(srv.url, capsys, watch=True, as_json=True, interval_s=0.5, sleep=nap)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3
    assert all(json.loads(x)["session"]["progress"]["shards_done"] == 60 for x in lines)


def test_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(f"http://127.0.0.1:{free_port()}", capsys)
    assert (code, out) == (69, "")
    one_line(err, "cannot reach", "connection refused")


def test_no_answer_times_out(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # accepts connections (the backlog) but never answers
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        port = s.getsockname()[1]
        start = time.monotonic()
        code, _, err = run(f"http://127.0.0.1:{port}", capsys, timeout_s=0.3)
    assert code == 69 and time.monotonic() - start < 5
    one_line(err, "timed out")


def _answer(body: bytes, ctype: str = "text/html") -> Callable[[Mapping[str, str]], Response]:
    return lambda q: Response(200, body, ctype)


@pytest.mark.parametrize(
    ("handlers", "code", "needle"),
    [
        ({"/status": _answer(b"<html>hello</html>")}, 65, "not JSON"),
        ({"/status": _answer(b'{"hello": 1}', "application/json")}, 65, "not a loadwatch status"),
        ({"/metrics": _answer(b"")}, 65, "HTTP 404"),
    ],
)
def test_wrong_answers(
    handlers: dict[str, Handler], code: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = serve(handlers)
    try:
        got, out, err = run(srv.url, capsys)
    finally:
        srv.stop()
    assert (got, out) == (code, "")
    one_line(err, needle)


def test_daemon_still_starting(capsys: pytest.CaptureFixture[str]) -> None:
    srv = serve(routes(lambda: None, lambda: True, lambda: T0))
    try:
        code, _, err = run(srv.url, capsys)
    finally:
        srv.stop()
    assert code == 69
    one_line(err, "starting")


def test_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    state, now, _ = mid_load(gpus=1)
    pub = published(state, now)
    srv = serve(routes(lambda: pub, lambda: True, lambda: now), bearer_token_file=token)
    try:
        code, _, err = run(srv.url, capsys)
        assert code == 77
        one_line(err, "HTTP 401", "LOADWATCH_TOKEN_FILE")
        monkeypatch.setenv("LOADWATCH_TOKEN_FILE", str(token))
        code, out, _ = run(srv.url, capsys, as_json=True)
        assert code == 0 and json.loads(out)["phase"] == "loading_weights"
    finally:
        srv.stop()


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run("ftp://127.0.0.1:1", capsys)
    assert code == 64
    one_line(err, "expected http://HOST:PORT")
    code, _, err = run("http://127.0.0.1:9321", capsys, interval_s=0.0)
    assert code == 64
    one_line(err, "--interval")


def test_the_real_command(daemon: tuple[HttpServer, float]) -> None:
    srv, _ = daemon
    r = subprocess.run(
        [str(LOADWATCH), "status", "--url", f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (r.returncode, r.stdout) == (69, "")
    one_line(r.stderr, "connection refused")
    # --watch until SIGINT, as Ctrl-C ends it
    p = subprocess.Popen(
        [str(LOADWATCH), "status", "--watch", "--json", "--interval", "0.2", "--url", srv.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a test run started in the background (SIGINT ignored, which a
        # child inherits and Python then keeps) must not make Ctrl-C mean nothing here
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert p.stdout is not None
    first = p.stdout.readline()
    second = p.stdout.readline()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and err == ""
    assert json.loads(first)["phase"] == json.loads(second)["phase"] == "loading_weights"
