"""The server runner, driven against a small stand-in for vLLM's server module.

The stand-in is a real process tree at the real module path (``vllm.entrypoints.openai.
api_server`` on PYTHONPATH): it writes like vLLM does (a prefixed line on stdout, a ``\\r`` bar on
stderr), serves ``/health`` and ``/v1/completions`` on the port it is given, and starts a child
that ignores SIGTERM, so stopping has to escalate to SIGKILL for the group.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.realvllm.vllmproc import (
    ServerSpec,
    VllmServer,
    free_port,
    group_members,
    server_argv,
    server_env,
)

STANDIN = r"""
import http.server, json, os, signal, subprocess, sys

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("STANDIN_MODE", "serve")
sys.stdout.buffer.write(f"(APIServer pid={os.getpid()}) INFO 11-30 06:25:02 [x.py:1] up\n".encode())
sys.stdout.buffer.flush()
sys.stderr.write("\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\n")
sys.stderr.flush()
if mode == "fail":
    sys.stderr.write("RuntimeError: Engine core initialization failed.\n")
    sys.exit(3)
if mode == "silent":
    signal.pause()  # never serves
child = subprocess.Popen([sys.executable, "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('child up', flush=True); signal.pause()"])


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps({"choices": [{"text": " ok " + str(req["max_tokens"])}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def term(signum, frame):
    sys.stdout.buffer.write(b"got SIGTERM\n")
    sys.stdout.buffer.flush()
    os._exit(0)


signal.signal(signal.SIGTERM, term)
# (the port refused connections until here, as during a load)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    pkg = tmp_path / "standin"
    mod = pkg / "vllm" / "entrypoints" / "openai"
    mod.mkdir(parents=True)
    for d in (pkg / "vllm", pkg / "vllm" / "entrypoints", mod):
        (d / "__init__.py").write_text("")
    (mod / "api_server.py").write_text(STANDIN)
    return pkg


def spec_for(tmp_path: Path, standin: Path, mode: str) -> ServerSpec:
    return ServerSpec(
        model=tmp_path / "model",
        work_dir=tmp_path / "work",
        port=free_port(),
        python=Path(sys.executable),
        extra_env=(("PYTHONPATH", str(standin)), ("STANDIN_MODE", mode)),
    )


def test_argv_is_a_list_with_the_documented_flags(tmp_path: Path) -> None:
    spec = ServerSpec(
        model=Path("/m"),
        work_dir=tmp_path,
        port=8321,
        python=Path("/venv/bin/python"),
        extra_args=("--kv-cache-memory-bytes", "1000000"),
    )
    assert server_argv(spec) == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        "8321",
        "--kv-cache-memory-bytes",
        "1000000",
    ]


def test_env_is_offline_private_and_drops_inherited_vllm_settings(tmp_path: Path) -> None:
    base = {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "40", "HF_TOKEN": "x", "VLLM_FOO": "1"}
    spec = ServerSpec(model=Path("/m"), work_dir=tmp_path, port=1, kv_cache_space_gib=None)
    env = server_env(spec, base)
    assert env["PATH"] == "/bin"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and "VLLM_FOO" not in env and "HF_TOKEN" not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).is_relative_to(tmp_path)
    # short enough for vLLM's IPC sockets (a 36-character name under it, 107 bytes in all),
    # one per work dir
    assert len(env["TMPDIR"]) + 1 + 36 < 107
    other = ServerSpec(model=Path("/m"), work_dir=tmp_path / "other", port=1)
    assert server_env(other, base)["TMPDIR"] != env["TMPDIR"]
    assert env["VLLM_CACHE_ROOT"] == str(spec.vllm_cache)  # shared, as an operator's is
    with_space = ServerSpec(model=Path("/m"), work_dir=tmp_path, port=1, kv_cache_space_gib=2)
    assert server_env(with_space, base)["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_serves_answers_and_stops_the_whole_group(tmp_path: Path, standin: Path) -> None:
    log = tmp_path / "server.log"
    server = VllmServer(spec_for(tmp_path, standin, "serve"), log)
    with server:
        server.start(rss_interval_s=0.05)
        health = server.wait_healthy(deadline_s=30.0, interval_s=0.05)
        assert health.healthy and health.exit_code is None
        assert server.complete("hi", max_tokens=3)["choices"] == [{"text": " ok 3"}]
        pgid = server.pid
        assert pgid is not None
        wait_for(lambda: len(group_members(pgid)) >= 2, "the child in the group", 10)
        # the child is a second interpreter: on a busy machine it can be in the group a while
        # before it has set SIG_IGN and said so; stopping earlier would test nothing about it
        wait_for(lambda: b"child up\n" in log.read_bytes(), "the child's line", 30)
        assert len(group_members(pgid)) == 2  # the server and its SIGTERM-proof child
        t0 = time.monotonic()
        code = server.stop(grace_s=1.0)
        assert time.monotonic() - t0 < 15
    assert code == 0  # the main process took SIGTERM and exited on its own
    assert group_members(pgid) == []  # the child needed the SIGKILL
    raw = log.read_bytes()
    assert b"\rLoading safetensors checkpoint shards:   0% Completed | 0/2" in raw
    assert b"child up\n" in raw and b"got SIGTERM\n" in raw
    assert server.rss_peak is not None and server.rss_peak.total_bytes > 0


def test_reports_an_exit_before_health(tmp_path: Path, standin: Path) -> None:
    with VllmServer(spec_for(tmp_path, standin, "fail"), tmp_path / "fail.log") as server:
        server.start(rss_interval_s=None)
        health = server.wait_healthy(deadline_s=30.0, interval_s=0.05)
    assert not health.healthy and health.exit_code == 3
    assert b"Engine core initialization failed." in (tmp_path / "fail.log").read_bytes()


def test_gives_up_at_the_deadline_and_cleans_up(tmp_path: Path, standin: Path) -> None:
    server = VllmServer(spec_for(tmp_path, standin, "silent"), tmp_path / "silent.log")
    with server:
        server.start(rss_interval_s=None)
        health = server.wait_healthy(deadline_s=0.5, interval_s=0.05)
        pgid = server.pid
    assert not health.healthy and health.exit_code is None
    assert health.last_error == "no answer"
    assert pgid is not None and group_members(pgid) == []
    assert server.poll() is not None
