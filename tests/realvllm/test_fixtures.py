"""What the recorded real vLLM 0.32 logs hold, so an edit that breaks their bytes shows up.

The facts here are what vLLM printed, counted with plain byte searches; re-recording with
capture.py must keep them (pids, times and rates change from run to run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BAR = b"\rLoading safetensors checkpoint shards: "


def load(name: str) -> bytes:
    path = FIXTURES / name
    if not path.is_file():
        pytest.fail(f"missing fixture {path} (record it with tests/realvllm/capture.py)")
    return path.read_bytes()


def bar_counts(raw: bytes) -> list[str]:
    out = []
    for chunk in raw.split(BAR)[1:]:
        record = chunk.split(b"\n", 1)[0]
        out.append(record.split(b"| ", 1)[1].split(b" ", 1)[0].decode())
    return out


@pytest.mark.parametrize(
    "name",
    [
        "real-v0.32-deepseek-kvscales.log",
        "real-v0.32-kv-too-small.log",
        "real-v0.32-deepseek-fp8kv.log",
    ],
)
def test_deepseek_logs_show_every_shard_and_a_scale_pair_per_layer(name: str) -> None:
    raw = load(name)
    # the bar's records carry no process prefix; close() redraws the final state
    assert bar_counts(raw) == [f"{i}/12" for i in range(13)] + ["12/12"]
    assert (
        b"\n\rLoading safetensors checkpoint shards:   0% Completed | 0/12 [00:00<?, ?it/s]\n"
        in raw
    )
    warnings = [line for line in raw.split(b"\n") if b"in the checkpoint (e.g." in line]
    assert len(warnings) == 24
    assert all(line.startswith(b"(Worker pid=") for line in warnings)
    for layer in range(12):
        for kv in (b"k", b"v"):
            assert (
                sum(
                    f"layers.{layer}.self_attn.".encode() in w
                    and kv + b"_scale is not loaded." in w
                    for w in warnings
                )
                == 1
            )
    assert b"[cpu.py:175] Using CPU_MLA backend.\n" in raw
    assert raw.count(b"(VllmWorker-0 pid=") == 1


def test_serving_log_has_the_start_sequence_and_the_shutdown_traceback() -> None:
    raw = load("real-v0.32-deepseek-kvscales.log")
    order = [
        b"version 0.32.0\r\n",
        b"Starting to load model /tmp/lw-real/models/deepseek-kvscales...\n",
        b"Loading weights took ",
        b"CPU KV cache size: 77,664 tokens, Maximum concurrency for 512 tokens per request: ",
        b"init engine (profile, create kv cache, warmup model) took ",
        b"Starting vLLM server on http://127.0.0.1:8321\n",
        b"INFO:     Application startup complete.\n",
        b'"POST /v1/completions HTTP/1.1" 200 OK\n',
        b"[shutdown] EngineCore: trigger received signal=SIGTERM\n",
        b"EngineDeadError: EngineCore encountered an issue.",
    ]
    positions = [raw.find(marker) for marker in order]
    assert -1 not in positions and positions == sorted(positions)


def test_kv_too_small_log_fails_in_three_processes() -> None:
    raw = load("real-v0.32-kv-too-small.log")
    assert b"Explicitly set (0.0/" in raw
    assert b"] EngineCore failed to start.\r\n" in raw
    too_small = b"ValueError: To serve at least one request with the model's max seq len (512)"
    assert raw.count(too_small) == 2  # the engine core's log record and its bare re-raise
    assert b"\nProcess EngineCore:\n" in raw
    assert b"\nRuntimeError: Engine core initialization failed. See root cause above." in raw
    assert b"Application startup complete." not in raw


def test_llama_log_serves_without_a_backend_line_or_traceback() -> None:
    raw = load("real-v0.32-llama.log")
    assert bar_counts(raw) == ["0/4", "4/4", "4/4"]
    assert (
        b"backend."
        not in raw.split(b"Starting to load model", 1)[1].split(b"Loading weights", 1)[0]
    )
    assert b"Application startup complete." in raw
    assert b"Traceback" not in raw  # SIGTERM before any request: no EngineDeadError


def test_fp8_kv_log_starts_then_dies_on_the_first_request() -> None:
    raw = load("real-v0.32-deepseek-fp8kv.log")
    assert b"Using fp8_e4m3 data type to store kv cache." in raw
    assert b"Using KV cache scaling factor 1.0 for fp8_e4m3." in raw
    assert b"(e.g. layers.0.self_attn.attn.attn.k_scale)" in raw
    startup = raw.find(b"Application startup complete.")
    death = raw.find(b"RuntimeError: expected scalar type BFloat16 but found Float8_e4m3fn")
    assert 0 < startup < death
    assert b'"POST /v1/completions HTTP/1.1" 500 Internal Server Error' in raw
