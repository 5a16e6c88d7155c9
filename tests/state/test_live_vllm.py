"""Real vLLM on the CPU, watched live: its log through the parser, its process tree through
/proc, its /health endpoint, folded as they come; then a clean stop. About a minute or two."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from loadwatch.daemon.inputs import HealthProbe, ModelInfo, ProcessEvent, ShardInfo, Tick
from loadwatch.daemon.procio import ProcIoReader
from loadwatch.daemon.state import Input, LoadState, StateConfig
from loadwatch.parsers import EventStream
from loadwatch.parsers.events import Record

VENV = Path(os.environ.get("LOADWATCH_VLLM_VENV", Path.home() / ".cache/loadwatch/vllm-0.32.0"))
VPY = VENV / "bin" / "python"

pytestmark = [
    pytest.mark.realvllm,
    pytest.mark.slow,
    pytest.mark.skipif(not VPY.exists(), reason="vLLM venv missing (make vllm)"),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(port: int) -> HealthProbe:
    now = time.time()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return HealthProbe(ok=r.status == 200, ts=now, status=r.status)
    except urllib.error.HTTPError as e:
        return HealthProbe(ok=False, ts=now, status=e.code, error=str(e))
    except OSError as e:
        return HealthProbe(ok=False, ts=now, error=str(e)[:200])


class _Tail:
    """Whole records from a growing file (a record ends at `\\n` or `\\r`)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.rest = path, 0, b""

    def records(self) -> list[Record]:
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        data = self.rest + data
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        self.rest = data[cut:]
        out = []
        for part in data[:cut].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
            if part:
                out.append(Record(part.decode("utf-8", "replace")))
        return out


def test_live_load_to_ready_then_clean_stop(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    subprocess.run(
        [str(VPY), str(Path(__file__).with_name("tiny_model.py")), str(model_dir)],
        check=True,
        timeout=120,
    )
    shards = tuple(
        ShardInfo(p.name, p.stat().st_size) for p in sorted(model_dir.glob("model-*.safetensors"))
    )
    port = _port()
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CACHE_ROOT": str(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache),
        "TMPDIR": str(cache),
    }
    argv = [
        str(VPY),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--enforce-eager",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = tmp_path / "vllm.log"
    state = LoadState(config=StateConfig(stall_floor_s=120, stall_first_shard_s=300))
    transitions = []

    def apply(item: Input) -> None:
        nonlocal state
        state = state.apply(item, time.time())
        transitions.extend(state.transitions)

    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        apply(ProcessEvent(kind="started", ts=time.time(), pid=proc.pid, argv=tuple(argv)))
        apply(
            ModelInfo(
                path=str(model_dir), shards=shards, total_bytes=sum(s.size_bytes for s in shards)
            )
        )
        tail, stream, io = _Tail(log), EventStream(), ProcIoReader()
        pids_seen = 0
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            for rec in tail.records():
                for ev in stream.feed(rec):
                    apply(ev)
            sample = io.read(proc.pid)
            pids_seen = max(pids_seen, sample.pids)
            apply(sample)
            apply(_health(port))
            apply(Tick())
            if state.session is not None and state.session.phase == "ready":
                break
            time.sleep(0.5)
        snap = state.snapshot(time.time())
        assert snap.phase == "ready", (snap.phase, log.read_text()[-3000:])
        s = snap.session
        assert s is not None and s.time_to_ready_s is not None and s.time_to_ready_s > 1
        assert s.version == "0.32.0"
        weights = [b for b in s.bars if b.kind == "weights"]
        assert weights and weights[0].done == weights[0].total == len(shards)
        assert s.progress.bytes_done == sum(x.size_bytes for x in shards)
        assert pids_seen >= 2  # the API server and its engine/worker processes
        assert snap.health is not None and snap.health.ok
        assert [t.phase_to for t in transitions if t.kind == "phase"][-1] == "ready"

        # A clean stop: vLLM may log an EngineDeadError on the way down; still "stopped".
        apply(ProcessEvent(kind="stopping", ts=time.time(), pid=proc.pid))
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=90)
        for rec in tail.records():
            for ev in stream.feed(rec):
                apply(ev)
        for ev in stream.flush():
            apply(ev)
        apply(ProcessEvent(kind="exited", ts=time.time(), pid=proc.pid, exit_code=code))
        snap = state.snapshot(time.time())
        assert snap.phase == "stopped", (
            [f.message for f in snap.session.failures] if snap.session else None
        )
        assert snap.session is not None and all(not f.fatal for f in snap.session.failures)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    print(f"time to ready {s.time_to_ready_s:.1f} s; processes seen {pids_seen}", file=sys.stderr)
