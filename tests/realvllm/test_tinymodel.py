"""The tiny checkpoint builder: sizes, names, and bytes a safetensors reader accepts."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.realvllm import tinymodel as tm
from tests.realvllm.vllmproc import vllm_python

HERE = Path(__file__).resolve().parent


def read_header(path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    return n, header


def bf16_values(data: bytes) -> list[float]:
    # bf16 is the top half of a float32
    return [struct.unpack("<f", b"\x00\x00" + data[i : i + 2])[0] for i in range(0, len(data), 2)]


def test_deepseek_plan_hits_the_size_and_shape_targets() -> None:
    cfg, tensors = tm.plan(tm.BuildOptions(kv_scales=True))
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert cfg["kv_lora_rank"] == 512 and cfg["qk_rope_head_dim"] == 64
    total = sum(t.nbytes for t in tensors)
    assert 0.97 * 1200 * tm.MB <= total <= 1.03 * 1200 * tm.MB
    shards = tm.split_shards(tensors, 12)
    assert len(shards) == 12
    for shard in shards:
        assert 0.9 * 100 * tm.MB <= shard.data_bytes <= 1.1 * 100 * tm.MB
    # every tensor lands in exactly one shard, in order
    assert [t for s in shards for t in s.tensors] == tensors


def test_kv_scales_are_f32_scalars_in_every_layer() -> None:
    _, tensors = tm.plan(tm.BuildOptions(shards=2, shard_mb=5, layers=3, kv_scales=True))
    scales = [t for t in tensors if t.name.endswith(("k_scale", "v_scale"))]
    assert [t.name for t in scales] == [
        f"model.layers.{i}.self_attn.{kv}_scale" for i in range(3) for kv in "kv"
    ]
    assert all(t.shape == () and t.dtype == "F32" and t.fill == "ones" for t in scales)
    _, plain = tm.plan(tm.BuildOptions(shards=2, shard_mb=5, layers=3))
    assert not [t for t in plain if "scale" in t.name]


def test_llama_plan_keeps_head_size_at_least_32() -> None:
    cfg, tensors = tm.plan(tm.BuildOptions(arch="llama", shards=4, shard_mb=25))
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    head = cfg["head_dim"]
    assert isinstance(head, int) and head >= 32
    assert cfg["hidden_size"] == head * tm._int(cfg, "num_attention_heads")
    total = sum(t.nbytes for t in tensors)
    assert 0.95 * 100 * tm.MB <= total <= 1.05 * 100 * tm.MB


def test_shard_file_is_valid_safetensors_with_small_finite_bf16(tmp_path: Path) -> None:
    _, tensors = tm.plan(tm.BuildOptions(shards=3, shard_mb=2, layers=2, kv_scales=True))
    shard = tm.split_shards(tensors, 3)[1]
    path = tmp_path / shard.file_name
    size = tm.write_shard(path, shard, tm._Filler(7))
    n, header = read_header(path)
    assert n % 8 == 0
    assert size == path.stat().st_size == 8 + n + shard.data_bytes
    pos = 0
    for t in shard.tensors:
        entry = header[t.name]
        assert entry["dtype"] == t.dtype and entry["shape"] == list(t.shape)
        assert entry["data_offsets"] == [pos, pos + t.nbytes]
        pos += t.nbytes
    raw = path.read_bytes()[8 + n :]
    for t in shard.tensors:
        start, end = header[t.name]["data_offsets"]
        data = raw[start:end][:4096]
        if t.dtype == "F32":
            assert struct.unpack("<f", data[:4])[0] == (1.0 if t.fill == "ones" else 0.0)
        elif t.fill == "ones":
            assert set(bf16_values(data)) == {1.0}
        else:
            values = bf16_values(data)
            assert all(2**-9 <= abs(v) < 2**-5 for v in values)
            assert any(v < 0 for v in values) and any(v > 0 for v in values)


def test_filler_is_deterministic_per_seed() -> None:
    spec = tm.TensorSpec("w", (64, 1024))
    a, b, c = tm._Filler(1), tm._Filler(1), tm._Filler(2)
    first = a.data(spec)
    assert first == b.data(spec)
    assert first != c.data(spec)
    assert a.data(spec) != first  # the next tensor reads another rotation of the pool


@pytest.mark.realvllm
def test_cli_builds_a_complete_deterministic_checkpoint(tmp_path: Path) -> None:
    python = vllm_python()
    if not python.is_file():
        pytest.skip(f"no vLLM environment at {python}")
    args = ["--layers", "2", "--shards", "3", "--shard-mb", "2", "--kv-scales", "--fp8-kv-decl"]
    for out in (tmp_path / "a", tmp_path / "b"):
        subprocess.run(
            [str(python), str(HERE / "tinymodel.py"), str(out), *args],
            check=True,
            capture_output=True,
            timeout=120,
        )
    a = tmp_path / "a"
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(
        [
            "config.json",
            "generation_config.json",
            "hf_quant_config.json",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            *(f"model-{i:05d}-of-00003.safetensors" for i in (1, 2, 3)),
        ]
    )
    for name in names:
        assert (a / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    index = json.loads((a / "model.safetensors.index.json").read_text())
    seen: dict[str, str] = {}
    total = 0
    for shard in sorted(a.glob("*.safetensors")):
        _, header = read_header(shard)
        for name, entry in header.items():
            seen[name] = shard.name
            start, end = entry["data_offsets"]
            total += end - start
    assert index["weight_map"] == seen
    assert index["metadata"]["total_size"] == total
    assert "model.layers.1.self_attn.v_scale" in seen
    quant = json.loads((a / "hf_quant_config.json").read_text())
    assert quant["producer"]["name"] == "modelopt"
    assert quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    config = json.loads((a / "config.json").read_text())
    vocab = json.loads((a / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) <= config["vocab_size"]
    assert json.loads((a / "tokenizer_config.json").read_text())["bos_token"] in vocab
