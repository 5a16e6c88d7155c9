"""The `max_model_len` remedy against real vLLM 0.32 on the CPU: `loadwatch run` supervises a
start whose --max-model-len does not fit the KV cache it is given; vLLM fails and says which
length would fit; the next start, with that length, reaches ready. (With remedies off the same
start ends fatal: tests/e2e/test_real_vllm.py::test_kv_cache_too_small_restarts_with_backoff_then_fatal.)
Two vLLM starts of the small Llama-style test model: about three minutes on a 2-core machine."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadwatch.daemon.crashloop_file import FILE_NAME
from tests.e2e.realdaemon import DaemonProc, supervise_config
from tests.realvllm.vllmproc import (
    ServerSpec,
    free_port,
    server_argv,
    server_env,
    vllm_available,
    vllm_python,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.slow, pytest.mark.timeout(600)]
TINYMODEL = Path(__file__).resolve().parent.parent / "realvllm" / "tinymodel.py"


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    if not vllm_available():  # `make test` installs it first: missing is a failure, not a skip
        pytest.fail(f"no vLLM environment at {vllm_python()}: run `make vllm`")
    # (a short directory: vLLM's IPC socket paths under TMPDIR must stay under 107 characters)
    tmp_path = tmp_path_factory.mktemp("rem")
    model = tmp_path / "llama"
    subprocess.run(
        [
            *(str(vllm_python()), str(TINYMODEL), str(model), "--arch", "llama"),
            *("--shards", "2", "--shard-mb", "4"),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=300,
    )
    work = tmp_path / "run"
    # 4 MB of KV cache: 2048 tokens do not fit (test_memplan_realvllm.py's failing case).
    spec = ServerSpec(
        model,
        work / "vllm",
        free_port(),
        max_model_len=2048,
        kv_cache_space_gib=None,
        extra_args=("--kv-cache-memory-bytes", "4000000"),
    )
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        Path(server_env(spec)[key]).mkdir(parents=True, exist_ok=True)
    config = supervise_config(
        work,
        server_argv(spec),
        server_env(spec),
        backoff_initial_s=1.0,
        crash_loop_starts=3,
        stop_grace_s=15.0,
        remedies=["max_model_len"],
        remedy_min_model_len=16,
    )
    d = DaemonProc(config, work)
    d.start()
    try:
        yield d
    finally:
        if d.poll() is None:
            d.terminate(45)
        d.kill()


def test_a_max_model_len_that_does_not_fit_reaches_ready_after_one_remedy(
    daemon: DaemonProc,
) -> None:
    d = daemon
    d.wait(lambda: d.status()["phase"] == "ready", "ready after the remedy", 420, 0.5)
    time.sleep(0.5)  # (the events file has the ready's lines by the next publish)
    remedy = d.named("vllm.remedy")
    assert [(e["remedy"], e["outcome"]) for e in remedy] == [
        ("max_model_len", "applied"),
        ("max_model_len", "helped"),
    ], remedy
    applied = remedy[0]
    assert applied["kind"] == "kv_cache_too_small", applied
    fits = applied["diff"][1].split()[-1]
    assert applied["diff"] == ["- --max-model-len 2048", f"+ --max-model-len {fits}"]
    assert 16 <= int(fits) < 2048
    # vLLM said so: the estimate in its own message
    assert f"the estimated maximum model length is {fits}." in d.vllm_log.read_text()
    # announced before the restart, which ran with the new length
    events = [e["event"] for e in d.events() if e["event"].startswith("vllm.")]
    first_exit = events.index("vllm.exited")
    assert events[first_exit:].index("vllm.remedy") < events[first_exit:].index("vllm.started")
    starts = d.named("vllm.started")
    assert len(starts) == 2
    argv = starts[1]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == fits and argv.count("--max-model-len") == 1

    status = d.status()
    assert status["first_failure"] is None  # the loop ended at ready
    (step,) = status["remedies"]
    assert (
        step["remedy"] == "max_model_len" and step["outcome"] == "helped" and step["after"] == fits
    )
    m = d.metrics()
    assert m['loadwatch_vllm_remedies_total{outcome="applied",remedy="max_model_len"}'] == 1.0
    assert m['loadwatch_vllm_remedies_total{outcome="helped",remedy="max_model_len"}'] == 1.0
    assert m["loadwatch_vllm_remedy_ladder_exhausted"] == 0.0
    assert not (d.work / "state" / FILE_NAME).exists()
