"""The supervisor, preflight and patch against real vLLM 0.32 on the CPU (tiny DeepSeek-V3-style
checkpoint that declares an FP8 KV cache: it loads and serves, and the engine dies on the first
request, after which the server exits with code 0 by itself)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from loadwatch.daemon.sources.health import HealthProber, endpoint_from_argv
from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.supervise.supervisor import Supervisor, SupervisorConfig
from loadwatch.daemon.tools.patch import drop_fp8_kv_cache, revert_model
from loadwatch.daemon.tools.preflight import PreflightReport, preflight, start_hook
from loadwatch.parsers import ChunkScanner, EventStream, Failure, Milestone
from tests.realvllm.vllmproc import (
    ServerSpec,
    free_port,
    server_argv,
    server_env,
    vllm_available,
    vllm_python,
)
from tests.supervisor.harness import Recorder, live_pids, log_bytes, run_async, wait_until

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]
TINYMODEL = Path(__file__).resolve().parent.parent / "realvllm" / "tinymodel.py"


@pytest.fixture(scope="module")
def fp8_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not vllm_available():  # `make test` installs it first: missing is a failure, not a skip
        pytest.fail(f"no vLLM environment at {vllm_python()}: run `make vllm`")
    out = tmp_path_factory.mktemp("models") / "deepseek-fp8kv"
    subprocess.run(
        [
            str(vllm_python()),
            str(TINYMODEL),
            str(out),
            "--kv-scales",
            "--fp8-kv-decl",
            "--shards",
            "3",
            "--shard-mb",
            "4",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=300,
    )
    return out


def test_preflight_and_patch_on_a_real_checkpoint(fp8_model: Path, tmp_path: Path) -> None:
    info = read_model_dir(fp8_model)
    assert info.errors == ()
    assert info.is_mla is True and info.model_type == "deepseek_v3"
    assert info.checkpoint_kv_dtype == "fp8"
    assert info.kv_sources == ("hf_quant_config.json:quantization.kv_cache_quant_algo",)
    assert [s.name for s in info.shards] == [
        f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)
    ]
    assert info.total_bytes == sum((fp8_model / s.name).stat().st_size for s in info.shards)
    assert preflight(info, None, (12, 0)).verdict == "will_fail"

    before = (fp8_model / "hf_quant_config.json").read_bytes()
    text, code = drop_fp8_kv_cache(fp8_model)
    try:
        assert code == 0 and "removed quantization.kv_cache_quant_algo" in text
        assert preflight(read_model_dir(fp8_model), None, (12, 0)).verdict == "ok"
    finally:
        revert_model(fp8_model)
    assert (fp8_model / "hf_quant_config.json").read_bytes() == before


def test_engine_death_with_exit_code_zero_is_restarted(fp8_model: Path, tmp_path: Path) -> None:
    spec = ServerSpec(model=fp8_model, work_dir=tmp_path / "work", port=free_port())
    argv = tuple(server_argv(spec))
    reports: list[PreflightReport] = []
    cfg = SupervisorConfig(
        argv=argv,
        env=server_env(spec),
        log_path=str(tmp_path / "vllm.log"),
        backoff_initial_s=0.2,
        crash_loop_starts=2,
        stop_grace_s=15.0,
        tree_scan_interval_s=0.5,
        exit_verdict_wait_s=5.0,
        preflight=start_hook(str(fp8_model), "warn", on_report=reports.append),
    )
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)
    prober = HealthProber(endpoint_from_argv(argv), timeout_s=2.0)
    failures: list[str] = []
    seen = {"api_up": False, "ready": False, "request_status": 0}

    async def daemon_side() -> None:
        """What the daemon does: follow the log of the current session, judge, probe."""
        offset, starts, scanner = 0, 0, ChunkScanner(EventStream())
        while True:
            if len(rec.of("started")) > starts:
                starts = len(rec.of("started"))
                scanner = ChunkScanner(EventStream())
            data = log_bytes(tmp_path)[offset:]
            end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if end > 0:
                for ev in scanner.feed(data[:end], base=offset):
                    if isinstance(ev, Failure):
                        failures.append(ev.kind)
                        sup.note_fatal_failure(ev.kind)
                    elif isinstance(ev, Milestone) and ev.kind in (
                        "api_server_start",
                        "app_startup_complete",
                    ):
                        seen["api_up"] = True
                offset += end
            probe_now = seen["api_up"] and not seen["ready"] and starts == 1
            if probe_now and (await prober.probe()).ok:
                seen["ready"] = True
                sup.note_ready()
                seen["request_status"] = await asyncio.to_thread(_complete, spec)
            await asyncio.sleep(0.2)  # (real: the daemon's pace of reading and probing)

    async def scenario() -> None:
        side = asyncio.create_task(daemon_side())
        task = asyncio.create_task(sup.run())
        try:
            await wait_until(lambda: len(rec.of("started")) == 2, timeout_s=400, what="the restart")
            await sup.stop()
            assert await task == "exited"
        finally:
            side.cancel()

    run_async(scenario, timeout_s=600)
    assert seen["ready"] and seen["request_status"] != 200
    kinds = rec.kinds
    assert kinds[0] == "started" and kinds[-1] == "exited"
    assert kinds.count("started") == 2 and kinds.count("backoff") == 1
    first_exit = rec.of("exited")[0]
    assert first_exit.exit_code == 0
    assert first_exit.reason is not None and "after a fatal error in the log" in first_exit.reason
    assert failures, "the parser saw no failure"
    # Every process vLLM started (API server, engine core, worker) is gone.
    pids = sorted({p for e in rec.of("exited") for p in e.tree_pids})
    assert len(pids) >= 3
    assert live_pids(pids) == []
    assert len(reports) == 2 and reports[0].attention == "mla"
    assert b"\rLoading safetensors checkpoint shards:" in log_bytes(tmp_path)


def _complete(spec: ServerSpec) -> int:
    body = json.dumps(
        {"model": str(spec.model), "prompt": "The model loads", "max_tokens": 4, "temperature": 0.0}
    ).encode()
    req = urllib.request.Request(
        spec.base_url + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1
