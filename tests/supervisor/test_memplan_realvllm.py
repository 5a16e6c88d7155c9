"""The memory plan against real vLLM 0.32 on the CPU: for the Llama-style and the DeepSeek-style
MLA test models, at two KV dtypes and two KV-space settings (every pair of them), the planned KV
tokens are within 2% of the `CPU KV cache size: N tokens` vLLM prints; and a --max-model-len that does not fit is
predicted as the ValueError vLLM then raises, with the same estimated maximum length.

One vLLM start per case (about 25 s each): a start is stopped as soon as the KV-cache line (or
the failure) is in the log, without waiting for the server."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.state.memplan import MemoryPlan
from loadwatch.daemon.state.memplan_inputs import layout_from_argv
from loadwatch.daemon.tools.preflight import preflight
from loadwatch.parsers import ChunkScanner, Event, EventStream, Failure, Milestone
from tests.helpers import wait_for
from tests.realvllm.vllmproc import (
    ServerSpec,
    VllmServer,
    free_port,
    server_argv,
    server_env,
    vllm_available,
    vllm_python,
)

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]
TINYMODEL = Path(__file__).resolve().parent.parent / "realvllm" / "tinymodel.py"
SPACE_BYTES = 1_610_612_736  # 1.5 GiB by --kv-cache-memory-bytes, beside VLLM_CPU_KVCACHE_SPACE=1


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not vllm_available():  # `make test` installs it first: missing is a failure, not a skip
        pytest.fail(f"no vLLM environment at {vllm_python()}: run `make vllm`")
    root = tmp_path_factory.mktemp("models")
    out = {}
    for arch in ("llama", "deepseek"):
        out[arch] = root / arch
        subprocess.run(
            [
                *(str(vllm_python()), str(TINYMODEL), str(out[arch]), "--arch", arch),
                *("--shards", "2", "--shard-mb", "4"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=300,
        )
    return out


def _run_until_kv_line(spec: ServerSpec, log: Path, deadline_s: float = 240.0) -> list[Event]:
    """Start vLLM, stop it once it printed its KV-cache size or failed; the events of its log."""
    with VllmServer(spec, log) as server:
        server.start(rss_interval_s=None)

        def said_or_exited() -> bool:
            text = log.read_bytes()
            said = b"KV cache size:" in text or b"Engine core initialization failed" in text
            return said or server.poll() is not None

        wait_for(said_or_exited, "vLLM's KV-cache size (or its failure, or exit)", deadline_s, 0.2)
        # mid-start, vLLM's processes may not act on SIGTERM until their set-up ends: what is
        # wanted is in the log already, so the group is not waited on long
        server.stop(grace_s=1.0)
    return list(ChunkScanner(EventStream()).feed(log.read_bytes(), base=0))


def _plan(spec: ServerSpec, kv_dtype: str) -> MemoryPlan:
    argv = server_argv(spec)
    layout = layout_from_argv(argv, server_env(spec), device="cpu")
    report = preflight(read_model_dir(spec.model), kv_dtype, None, layout=layout)
    assert report.memory is not None
    return report.memory


# Each pair of values of the three factors (the attention layout, the KV dtype, how the KV space
# is set) in at least one case: the plan is a sum of one term per factor, so a wrong term shows in
# every case that holds its value, and a wrong pairing of two in the case that holds that pair.
# Four starts cover what all eight would, at half the time of the suite's slowest file.
CASES = [
    ("llama", "auto", "env-1GiB"),
    ("llama", "fp8", "flag-1.5GiB"),
    ("deepseek", "auto", "flag-1.5GiB"),
    ("deepseek", "fp8", "env-1GiB"),
]


@pytest.mark.parametrize(("arch", "kv_dtype", "space"), CASES)
def test_planned_kv_tokens_match_vllm(
    models: dict[str, Path], tmp_path: Path, arch: str, kv_dtype: str, space: str
) -> None:
    extra: tuple[str, ...] = () if kv_dtype == "auto" else ("--kv-cache-dtype", kv_dtype)
    if space == "env-1GiB":
        spec = ServerSpec(models[arch], tmp_path / "w", free_port(), extra_args=extra)
    else:
        extra += ("--kv-cache-memory-bytes", str(SPACE_BYTES))
        spec = ServerSpec(
            models[arch], tmp_path / "w", free_port(), kv_cache_space_gib=None, extra_args=extra
        )
    plan = _plan(spec, kv_dtype)
    assert plan.low is not None and plan.low == plan.high  # an explicit budget: no range
    events = _run_until_kv_line(spec, tmp_path / "vllm.log")
    sizes = [e for e in events if isinstance(e, Milestone) and e.detail == "size"]
    assert sizes and sizes[0].tokens, (tmp_path / "vllm.log").read_text()[-3000:]
    vllm_tokens = sizes[0].tokens
    print(f"kv-plan {arch} {kv_dtype} {space}: planned {plan.low.tokens} vLLM {vllm_tokens}")
    assert abs(plan.low.tokens - vllm_tokens) / vllm_tokens <= 0.02, (plan.low, vllm_tokens)


def test_max_model_len_that_does_not_fit_fails_as_predicted(
    models: dict[str, Path], tmp_path: Path
) -> None:
    spec = ServerSpec(
        models["llama"],
        tmp_path / "w",
        free_port(),
        max_model_len=2048,
        kv_cache_space_gib=None,
        extra_args=("--kv-cache-memory-bytes", "4000000"),
    )
    plan = _plan(spec, "auto")
    assert plan.verdict == "will_fail" and plan.predicted_error is not None
    events = _run_until_kv_line(spec, tmp_path / "vllm.log")
    failures = [e for e in events if isinstance(e, Failure) and e.kind == "kv_cache_too_small"]
    assert failures, (tmp_path / "vllm.log").read_text()[-3000:]
    text = (tmp_path / "vllm.log").read_text()
    # vLLM rounds to two decimals; the plan's sentence is vLLM's up to the estimated length.
    assert "To serve at least one request with the model's max seq len (2048)" in text
    estimated = plan.predicted_error.split("estimated maximum model length is ")[1].rstrip(".")
    assert f"the estimated maximum model length is {estimated}." in text
