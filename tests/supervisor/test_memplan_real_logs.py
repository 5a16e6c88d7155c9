"""The memory plan's KV arithmetic against real vLLM logs from public issues: the tokens computed
from the KV memory vLLM says it had match the tokens vLLM printed, within 1%.

Each fixture (tests/fixtures/kvplan/) holds the excerpt and names its source. The model shapes
are the public config.json values of each model on the Hugging Face hub:
Qwen/Qwen3-1.7B, Qwen/Qwen3-14B, meta-llama/Llama-3.1-8B-Instruct, deepseek-ai/DeepSeek-V2-Lite
(and DeepSeek-V2-Lite-Chat, the same shapes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loadwatch.daemon.sources.inputs import ModelGeometry
from loadwatch.daemon.state.memplan import GIB, capacity, kv_per_token, pp_stage_layers

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kvplan"

# huggingface.co/<model>/blob/main/config.json
QWEN3_1_7B = ModelGeometry(
    num_layers=28, num_attention_heads=16, num_kv_heads=8, head_dim=128, torch_dtype="bfloat16"
)
QWEN3_14B = ModelGeometry(
    num_layers=40, num_attention_heads=40, num_kv_heads=8, head_dim=128, torch_dtype="bfloat16"
)
LLAMA_3_1_8B = ModelGeometry(  # head_dim = hidden_size 4096 / 32 heads
    num_layers=32, num_attention_heads=32, num_kv_heads=8, head_dim=128, torch_dtype="bfloat16"
)
DEEPSEEK_V2_LITE = ModelGeometry(
    num_layers=27,
    num_attention_heads=16,
    num_kv_heads=16,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    torch_dtype="bfloat16",
)


@dataclasses.dataclass(frozen=True)
class RealLog:
    fixture: str
    geometry: ModelGeometry
    lines: tuple[str, ...]  # the lines of the fixture the figures come from
    available_gib: tuple[float, ...]  # per PP stage, as printed
    vllm_tokens: int
    max_model_len: int | None
    tp: int = 1
    pp: int = 1
    kv_dtype: str = "auto"


CASES = (
    RealLog(
        "qwen3-1.7b-24gb.log",
        QWEN3_1_7B,
        ("Available KV cache memory: 18.78 GiB", "GPU KV cache size: 175,856 tokens"),
        (18.78,),
        175_856,
        1024,
    ),
    RealLog(
        "qwen3-14b-lmcache.log",
        QWEN3_14B,
        ("Available KV cache memory: 6.51 GiB", "GPU KV cache size: 42,656 tokens"),
        (6.51,),
        42_656,
        32_768,
    ),
    RealLog(
        "llama-3.1-8b-3090-29k.log",
        LLAMA_3_1_8B,
        ("kv_cache_size=2.89GiB", "stored in KV cache (23648)"),
        (2.89,),
        23_648,
        None,  # V0 printed blocks x block size
    ),
    RealLog(
        "llama-3.1-8b-3090-20k.log",
        LLAMA_3_1_8B,
        ("kv_cache_size=3.81GiB", "GPU blocks: 1952"),
        (3.81,),
        1952 * 16,
        None,
    ),
    RealLog(
        "deepseek-v2-lite-pp2-tp2.log",
        DEEPSEEK_V2_LITE,
        (
            "rank=0 pid=19831) INFO 07-09 09:47:45 [gpu_worker.py:233] Available KV cache memory: 12.13 GiB",
            "rank=2 pid=19833) INFO 07-09 09:47:45 [gpu_worker.py:233] Available KV cache memory: 11.33 GiB",
            "GPU KV cache size: 807,792 tokens",
        ),
        (12.13, 11.33),  # stage 0 (ranks 0-1), stage 1 (ranks 2-3)
        807_792,
        1024,
        tp=2,
        pp=2,
    ),
    RealLog(
        "deepseek-v2-lite-chat-32k.log",
        DEEPSEEK_V2_LITE,
        ("max seq len (32768), (0.95 GiB KV cache is needed",),
        (0.95,),
        32_768,
        None,
    ),
)


def planned_tokens(case: RealLog) -> int:
    """Tokens vLLM's sizing gives for the printed memory: per stage, then the smallest."""
    kv = kv_per_token(case.geometry, case.kv_dtype, case.tp, case.pp)
    assert kv is not None
    stages = pp_stage_layers(case.geometry.num_layers or 0, case.pp)
    tokens = []
    for gib, layers in zip(case.available_gib, stages, strict=True):
        stage_kv = dataclasses.replace(kv, layers=layers)
        tokens.append(capacity(stage_kv, int(gib * GIB), 16, case.max_model_len).tokens)
    return min(tokens)


@pytest.mark.parametrize("case", CASES, ids=[c.fixture for c in CASES])
def test_tokens_from_available_memory_match_vllm(case: RealLog) -> None:
    text = (FIXTURES / case.fixture).read_text()
    assert text.startswith("# source: ") and "github.com" in text.splitlines()[0]
    for line in case.lines:
        assert line in text, line
    planned = planned_tokens(case)
    assert abs(planned - case.vllm_tokens) / case.vllm_tokens < 0.01, (planned, case.vllm_tokens)


def test_pipeline_stages_follow_vllm_split() -> None:
    # DeepSeek-V2-Lite's 27 layers over 2 stages: the first takes the extra layer, which is why
    # its ranks (with more memory left) still hold fewer tokens than the second stage's.
    assert pp_stage_layers(27, 2) == [14, 13]
    assert pp_stage_layers(61, 4) == [15, 15, 16, 15]  # partitions[-2] takes the remainder
    assert pp_stage_layers(8, 4) == [2, 2, 2, 2]
    case = CASES[4]
    kv = kv_per_token(case.geometry, "auto", 2, 2)
    assert kv is not None and kv.layers == 14 and kv.bytes_per_layer == 576 * 2


def test_gqa_heads_split_and_replicated_across_tp() -> None:
    one = kv_per_token(LLAMA_3_1_8B, "auto", 1)
    eight = kv_per_token(LLAMA_3_1_8B, "auto", 8)
    sixteen = kv_per_token(LLAMA_3_1_8B, "auto", 16)
    assert one is not None and eight is not None and sixteen is not None
    assert one.bytes == 32 * 2 * 8 * 128 * 2
    assert eight.bytes == one.bytes / 8
    assert sixteen.bytes == eight.bytes  # 8 KV heads < TP 16: one head per GPU, replicated
    mla_tp1 = kv_per_token(DEEPSEEK_V2_LITE, "fp8_e4m3", 1)
    mla_tp8 = kv_per_token(DEEPSEEK_V2_LITE, "fp8_e4m3", 8)
    assert mla_tp1 is not None and mla_tp8 is not None
    assert mla_tp1.bytes == mla_tp8.bytes == 27 * 576  # the latent is not split across TP
