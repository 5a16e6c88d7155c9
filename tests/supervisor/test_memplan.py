"""The memory plan in preflight: the Kimi-K2.5-NVFP4 demo checkpoint on 8 x RTX PRO 6000, the
verdicts (fits, tight, will fail) with the vLLM error each predicts, and the CLI's flags."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main
from loadwatch.daemon.sources.inputs import ModelGeometry
from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.state import memplan
from loadwatch.daemon.state.memplan_inputs import (
    gpu_model_capacity,
    layout_from_argv,
    weights_per_gpu,
)
from loadwatch.daemon.tools.demo import make_model_dir
from loadwatch.daemon.tools.preflight import preflight

GIB = 2**30


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("kimi"), fp8_kv=True)


def _plan(model: Path, argv: list[str], kv: str, gpu: str = "RTX PRO 6000") -> memplan.MemoryPlan:
    info = read_model_dir(model)
    assert info.geometry is not None
    layout = layout_from_argv(["vllm", "serve", str(model), *argv])
    weights, how = weights_per_gpu(info, layout)
    cap = gpu_model_capacity(gpu)
    assert cap is not None
    return memplan.plan(
        info.geometry,
        kv,
        layout,
        weights_bytes=weights,
        weights_explain=how,
        capacity_bytes=cap[0],
        capacity_source=cap[1],
    )


def test_kimi_on_eight_rtx_pro_6000_fp8_and_bf16(kimi: Path) -> None:
    fp8 = _plan(kimi, ["--tensor-parallel-size", "8"], "fp8_e4m3")
    bf16 = _plan(kimi, ["--tensor-parallel-size", "8"], "auto")
    assert fp8.kv is not None and bf16.kv is not None
    assert fp8.kv.bytes == 61 * 576 and bf16.kv.bytes == 61 * 1152  # MLA latent, whole per GPU
    assert fp8.weights_bytes is not None and 60 * GIB < fp8.weights_bytes < 70 * GIB
    assert fp8.low is not None and bf16.low is not None and fp8.high is not None
    # Half the bytes per token: twice the tokens, from the same budget (to a block).
    assert abs(fp8.low.tokens - 2 * bf16.low.tokens) <= 16
    assert fp8.max_model_len == 262_144 and fp8.verdict == "fits"
    assert bf16.verdict == "fits"


def test_max_model_len_too_long_names_vllms_error(kimi: Path) -> None:
    p = _plan(kimi, ["-tp", "8", "--max-model-len", "524288"], "auto")
    assert p.verdict == "will_fail"
    assert p.predicted_error is not None
    assert p.predicted_error.startswith(
        "To serve at least one request with the model's max seq len (524288)"
    )
    assert any(f.startswith("--max-model-len ") for f in p.fixes)
    assert any(f.startswith("--kv-cache-dtype fp8") for f in p.fixes)


def test_tight_when_it_fits_only_with_a_small_reserve(kimi: Path) -> None:
    base = _plan(kimi, ["-tp", "8"], "auto")
    assert base.low is not None and base.high is not None
    between = (base.low.max_len_fits + base.high.max_len_fits) // 2
    p = _plan(kimi, ["-tp", "8", "--max-model-len", str(between)], "auto")
    assert p.verdict == "tight"


def test_weights_that_do_not_fit_predict_oom_or_no_cache_blocks(kimi: Path) -> None:
    p = _plan(kimi, ["--tensor-parallel-size", "4"], "auto")  # 126 GiB of weights on a 96 GiB GPU
    assert p.verdict == "will_fail" and p.predicted_error is not None
    assert "CUDA out of memory" in p.predicted_error
    p = _plan(kimi, ["--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.6"], "auto")
    assert p.verdict == "will_fail"
    assert p.predicted_error == "No available memory for the cache blocks"


def test_layout_reads_vllm_flags_and_cpu_space() -> None:
    lay = layout_from_argv(
        [
            "vllm",
            "serve",
            "m",
            "--tensor_parallel_size=4",
            "-pp",
            "2",
            "--data-parallel-size",
            "2",
            "--enable-expert-parallel",
            "--max-model-len",
            "8192",
            "--kv-cache-memory-bytes",
            "4G",
        ]
    )
    assert (lay.tensor_parallel, lay.pipeline_parallel, lay.data_parallel) == (4, 2, 2)
    assert lay.expert_parallel and lay.max_model_len == 8192
    assert lay.kv_cache_memory_bytes == 4 * GIB
    cpu = layout_from_argv(
        ["x", "--kv-cache-memory-bytes", "1000"], {"VLLM_CPU_KVCACHE_SPACE": "2"}
    )
    assert cpu.device == "cpu" and cpu.kv_cache_memory_bytes == 2 * GIB


def test_preflight_cli_prints_the_plan_and_exit_codes(
    kimi: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(kimi), "--gpu-cc", "12.0", "--gpu-model", "RTX PRO 6000", "-h"]
    args = args[:-1]
    code = main(["preflight", *args, "--kv-cache-dtype", "bfloat16", "--tensor-parallel-size", "8"])
    out = capsys.readouterr().out
    assert code == 0 and "memory plan, per GPU:" in out and "KV/token     70,272 B" in out
    code = main(
        [
            "preflight",
            *args,
            "--kv-cache-dtype",
            "bfloat16",
            "--tensor-parallel-size",
            "8",
            "--max-model-len",
            "2000000",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["memory"]["verdict"] == "will_fail"
    assert doc["memory"]["kv_bytes_per_token"] == 70272


def test_preflight_without_layout_has_no_plan(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi), "bfloat16", (12, 0))
    assert report.memory is None and report.to_dict()["memory"] is None


def test_patch_model_says_what_the_patch_does_to_the_plan(
    kimi: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (kimi / "hf_quant_config.json").read_bytes()
    plan_args = ["--gpu-model", "RTX PRO 6000", "--tensor-parallel-size", "8"]
    code = main(
        [
            "patch-model",
            str(kimi),
            "--drop-fp8-kv-cache",
            "--dry-run",
            *plan_args,
            "--max-model-len",
            "400000",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and (kimi / "hf_quant_config.json").read_bytes() == before
    assert "what the patch would change in the memory plan, per GPU:" in out
    assert "fp8_e4m3 35,136 -> model dtype 70,272 (2.0x)" in out
    assert "400,000 (--max-model-len): fits with FP8, will not fit with bf16" in out
    assert "To serve at least one request with the model's max seq len (400000)" in out
    code = main(["patch-model", str(kimi), "--drop-fp8-kv-cache", *plan_args])
    out = capsys.readouterr().out
    assert code == 0 and "what the patch changes in the memory plan" in out
    assert "262,144 (config.json max_position_embeddings): fits with FP8, fits with bf16" in out
    assert main(["patch-model", str(kimi), "--revert"]) == 0
    assert (kimi / "hf_quant_config.json").read_bytes() == before


def _tiny_deepseek(root: Path) -> Path:
    """The DeepSeek-style test checkpoint's tensors, written with real safetensors headers."""
    from tests.realvllm.tinymodel import (
        BuildOptions,
        _Filler,
        plan,
        split_shards,
        write_shard,
    )

    root.mkdir()
    config, tensors = plan(BuildOptions(arch="deepseek", shards=2, shard_mb=2))
    (root / "config.json").write_text(json.dumps(config))
    weight_map = {}
    for shard in split_shards(tensors, 2):
        write_shard(root / shard.file_name, shard, _Filler(1))
        weight_map.update((t.name, shard.file_name) for t in shard.tensors)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def test_replicated_bytes_from_the_safetensors_headers(tmp_path: Path) -> None:
    model = _tiny_deepseek(tmp_path / "ds")
    info = read_model_dir(model, tensor_bytes=True)
    assert info.geometry is not None
    exact = dict(info.geometry.family_bytes)
    g = info.geometry
    assert g.hidden_size and g.num_layers and g.kv_lora_rank is not None
    latent = g.num_layers * g.hidden_size * (g.kv_lora_rank + (g.qk_rope_head_dim or 0)) * 2
    assert exact["mla_latent"] == latent  # bf16 tensors: the header's bytes are the shapes'
    assert exact["experts"] > 0 and exact["all"] <= (info.total_bytes or 0)
    layout = layout_from_argv(["vllm", "serve", "m", "-tp", "2"])
    weights, how = weights_per_gpu(info, layout)
    assert "from the safetensors headers" in how
    repl = sum(exact.get(k, 0) for k in ("mla_latent", "mla_q_latent", "router"))
    assert weights == ((info.total_bytes or 0) - repl) // 2 + repl
    ep = layout_from_argv(
        ["vllm", "serve", "m", "-tp", "2", "-dp", "2", "--enable-expert-parallel"]
    )
    ep_weights, ep_how = weights_per_gpu(info, ep)
    assert ep_weights is not None and weights is not None and ep_weights < weights
    assert "over TP x DP 4 (EP)" in ep_how
    # Without the headers (the daemon's cheap read) the same split is estimated from the shapes.
    assert read_model_dir(model).geometry.family_bytes == ()  # type: ignore[union-attr]


def test_sparse_stand_in_shards_fall_back_to_the_estimate(kimi: Path) -> None:
    info = read_model_dir(kimi, tensor_bytes=True)
    assert info.geometry is not None and info.geometry.family_bytes == ()
    _, how = weights_per_gpu(info, layout_from_argv(["x", "-tp", "8"]))
    assert "bf16, from config.json shapes" in how


@pytest.mark.parametrize(
    "bad",
    [
        ["--tensor-parallel-size", "abc"],
        ["--max-model-len", "0"],
        ["--gpu-memory-utilization", "1.5"],
        ["--kv-cache-memory-bytes", "lots"],
        ["--gpu-model", "Voodoo 2"],
    ],
)
def test_bad_plan_flags_are_one_line_and_exit_64(
    kimi: Path, bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["preflight", str(kimi), "--gpu-cc", "12.0", *bad])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 64 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _plan_of(geo: ModelGeometry, **layout: object) -> memplan.MemoryPlan:
    return memplan.plan(
        geo,
        "auto",
        memplan.Layout(**layout),  # type: ignore[arg-type]
        weights_bytes=10 * GIB,
        weights_explain="test",
        capacity_bytes=80 * GIB,
        capacity_source="test",
    )


_LLAMA = ModelGeometry(
    num_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=64,
    hidden_size=256,
    torch_dtype="bfloat16",
    max_position_embeddings=4096,
)


def test_a_plan_of_zero_tokens_is_never_fits() -> None:
    """Before: layers of linear attention alone (no per-token KV) made a page of 0 bytes, a
    capacity of 0 tokens, and the verdict `fits`."""
    assert _plan_of(_LLAMA).verdict == "fits"  # (the same model with its attention: fits)
    linear = dataclasses.replace(_LLAMA, layer_types=("linear_attention",) * 2)
    p = _plan_of(linear)
    assert p.verdict != "fits"
    assert p.low is None or p.low.tokens == 0
    unknown_types = dataclasses.replace(_LLAMA, layer_types=("mystery",) * 2)
    assert _plan_of(unknown_types).verdict != "fits"


def test_a_max_model_len_of_zero_is_never_fits() -> None:
    zero = dataclasses.replace(_LLAMA, max_position_embeddings=0)
    assert _plan_of(zero).verdict != "fits"


def test_fits_means_one_request_of_max_model_len_fits() -> None:
    for mml in (512, 4096, 65536, 10**7):
        p = _plan_of(_LLAMA, max_model_len=mml)
        if p.verdict == "fits":
            assert p.low is not None and p.low.tokens >= mml, mml


def test_absurd_layer_counts_are_no_plan_and_no_hang() -> None:
    """A config that claims 2**62 layers once built a tuple with one entry per layer."""
    huge = dataclasses.replace(_LLAMA, num_layers=2**62)
    t0 = time.monotonic()
    p = _plan_of(huge)
    assert time.monotonic() - t0 < 1.0
    assert p.verdict != "fits"
