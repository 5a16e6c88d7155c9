from __future__ import annotations

import json
import os
from pathlib import Path

from loadwatch.daemon.sources.model.model_info import natural_key, read_model_dir
from tests.supervisor.modeldirs import copy_model


def test_kimi_k25_nvfp4_reads_mla_quant_and_shards(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path)
    info = read_model_dir(d)
    assert info.errors == ()
    assert info.architecture == "KimiK25ForConditionalGeneration"
    assert info.model_type == "kimi_k25"
    assert info.is_mla is True  # kv_lora_rank sits in text_config
    assert info.num_layers == 61
    assert info.quant_algo == "NVFP4"
    assert info.checkpoint_kv_dtype == "fp8"
    assert info.kv_sources == (
        "config.json:quantization_config.kv_cache_scheme",
        "hf_quant_config.json:quantization.kv_cache_quant_algo",
    )
    assert [s.name for s in info.shards] == [
        f"model-{i:05d}-of-00012.safetensors" for i in range(1, 13)
    ]
    assert [s.size_bytes for s in info.shards] == [1000 * i for i in range(1, 13)]
    assert info.total_bytes == sum(1000 * i for i in range(1, 13))


def test_legacy_modelopt_uses_hf_quant_config(tmp_path: Path) -> None:
    info = read_model_dir(copy_model("deepseek-v3-nvfp4-legacy", tmp_path))
    assert info.errors == ()
    assert info.model_type == "deepseek_v3" and info.is_mla is True
    assert info.checkpoint_kv_dtype == "fp8"
    assert info.quant_algo == "NVFP4"
    assert info.kv_sources == ("hf_quant_config.json:quantization.kv_cache_quant_algo",)
    assert len(info.shards) == 10


def test_llama_standard_attention_kv_algo_inside_config(tmp_path: Path) -> None:
    d = copy_model("llama-fp8kv", tmp_path)
    (d / "model.safetensors").write_bytes(b"x" * 123)
    info = read_model_dir(d)
    assert info.is_mla is False
    assert info.checkpoint_kv_dtype == "fp8"
    assert info.quant_algo == "FP8"
    assert info.kv_sources == ("config.json:quantization_config.quantization.kv_cache_quant_algo",)
    assert info.shards[0].name == "model.safetensors" and info.total_bytes == 123


def test_config_quantization_config_wins_over_hf_quant_config(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["quantization_config"]["kv_cache_scheme"]
    (d / "config.json").write_text(json.dumps(cfg))
    info = read_model_dir(d)
    # vLLM reads hf_quant_config.json only when config.json has no quantization_config.
    assert info.checkpoint_kv_dtype is None
    assert info.kv_sources == ("hf_quant_config.json:quantization.kv_cache_quant_algo",)


def test_deepseek_model_type_without_kv_lora_rank_is_not_mla(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "deepseek_v2", "kv_lora_rank": None})
    )
    assert read_model_dir(tmp_path).is_mla is False
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mystery", "kv_lora_rank": 256})
    )
    assert read_model_dir(tmp_path).is_mla is True


def test_natural_order_not_plain_sort(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    for name in ("w-10.safetensors", "w-9.safetensors", "w-100.safetensors", "w-1.safetensors"):
        (tmp_path / name).write_bytes(b"")
    info = read_model_dir(tmp_path)
    assert [s.name for s in info.shards] == [
        "w-1.safetensors",
        "w-9.safetensors",
        "w-10.safetensors",
        "w-100.safetensors",
    ]
    assert natural_key("model-00002-of-00003.safetensors") < natural_key(
        "model-00010-of-00003.safetensors"
    )
    assert natural_key("7b.safetensors") < natural_key("10.safetensors")


def test_index_filters_stray_files_and_reports_missing(tmp_path: Path) -> None:
    d = copy_model("deepseek-v3-nvfp4-legacy", tmp_path)
    (d / "consolidated.safetensors").write_bytes(b"x")  # not in the index: vLLM skips it
    os.unlink(d / "model-00004-of-00010.safetensors")
    info = read_model_dir(d)
    names = [s.name for s in info.shards]
    assert "consolidated.safetensors" not in names
    assert len(names) == 9
    assert info.errors == (
        "model.safetensors.index.json: 1 listed shard file(s) missing on disk "
        "(first: model-00004-of-00010.safetensors)",
    )


def test_shards_in_subdirectory_via_index(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "a-2.safetensors").write_bytes(b"22")
    (tmp_path / "weights" / "a-1.safetensors").write_bytes(b"1")
    index = {"weight_map": {"x": "weights/a-2.safetensors", "y": "weights/a-1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    info = read_model_dir(tmp_path)
    assert [(s.name, s.size_bytes) for s in info.shards] == [
        ("weights/a-1.safetensors", 1),
        ("weights/a-2.safetensors", 2),
    ]


def test_bin_fallback_skips_training_state(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    for name in (
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
        "training_args.bin",
    ):
        (tmp_path / name).write_bytes(b"b")
    info = read_model_dir(tmp_path)
    assert [s.name for s in info.shards] == [
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
    ]


def test_faults_become_error_lines_never_exceptions(tmp_path: Path) -> None:
    missing = read_model_dir(tmp_path / "nope")
    assert missing.errors == (f"model directory {tmp_path / 'nope'}: no such directory",)
    assert missing.is_mla is None and missing.shards == ()

    (tmp_path / "config.json").write_text('{"model_type": "llama",\n  "x": }')
    (tmp_path / "hf_quant_config.json").write_text("[1, 2]")
    (tmp_path / "model.safetensors.index.json").write_text("{")
    info = read_model_dir(tmp_path)
    assert info.is_mla is None
    assert len(info.errors) == 3
    assert info.errors[0].startswith("config.json: malformed JSON at line 2 column")
    assert info.errors[1] == "hf_quant_config.json: expected a JSON object, found list"
    assert info.errors[2].startswith("model.safetensors.index.json: malformed JSON")
    assert all("\n" not in e for e in info.errors)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_model_dir(empty).errors == ("config.json: missing",)
