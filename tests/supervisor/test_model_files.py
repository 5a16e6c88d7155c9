"""A model directory is downloaded data: its JSON files and safetensors headers are read within
bounds (regular files only, a size cap per kind, a nesting depth, numbers in range), files named
by the index or linked from the directory stay inside it, and what is out of bounds is one line
(`ModelFileError`), never a traceback, a hang or a read of a file elsewhere."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.sources.model.modelfiles import MAX_BYTES, ModelFileError, read_json

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def _model(root: Path, config_text: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(config_text or json.dumps(CONFIG))
    return root


def _refused(model: Path, *words: str) -> str:
    with pytest.raises(ModelFileError) as caught:
        read_model_dir(model, tensor_bytes=True)
    line = str(caught.value)
    assert "\n" not in line and len(line) < 400, line
    for w in words:
        assert w in line, line
    return line


def test_deep_json_is_refused_in_one_line(tmp_path: Path) -> None:
    # Before: json's C scanner recursed until RecursionError, which stopped the daemon's task.
    model = _model(tmp_path / "m", "[" * 100_000 + "]" * 100_000)
    _refused(model, "config.json", "nested deeper than")
    # Brackets inside strings are text, not nesting (chat templates are full of them).
    text = json.dumps({**CONFIG, "chat_template": "{{[" * 5000})
    assert read_model_dir(_model(tmp_path / "ok", text)).num_layers == 2


@pytest.mark.parametrize("digits", [400, 5000])
def test_huge_integers_are_refused(tmp_path: Path, digits: int) -> None:
    # 400 digits passed json and overflowed a float in the memory plan; 5000 passed neither.
    text = json.dumps(CONFIG)[:-1] + ', "head_dim": 1' + "0" * digits + "}"
    model = _model(tmp_path / "m", text)
    _refused(model, "config.json", "integer", "out of range")


def test_int64_is_the_range(tmp_path: Path) -> None:
    ok = _model(tmp_path / "ok", json.dumps({**CONFIG, "vocab_size": 2**63 - 1}))
    assert read_model_dir(ok).geometry is not None
    over = _model(tmp_path / "over", json.dumps({**CONFIG, "vocab_size": 2**63}))
    _refused(over, "out of range")


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_nan_and_infinity_are_refused(tmp_path: Path, number: str) -> None:
    model = _model(tmp_path / "m", json.dumps(CONFIG)[:-1] + f', "rope_theta": {number}}}')
    _refused(model, "config.json", "not a finite number")


def test_a_fifo_config_is_refused_at_once(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    fifo = model / "config.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_model_dir(model)
            outcome.append(None)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    try:
        assert not reader.is_alive(), "reading a FIFO config.json blocked"
    finally:
        if reader.is_alive():  # (the old reader blocks in open(): a writer lets it go)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    (exc,) = outcome
    assert isinstance(exc, ModelFileError) and "not a regular file" in str(exc)


def test_a_directory_named_config_json_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "config.json").mkdir(parents=True)
    _refused(model, "config.json", "not a regular file")


def test_an_oversized_config_is_refused_unread(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    with open(model / "config.json", "wb") as f:
        f.truncate(300 * 2**20)  # sparse: 300 MiB that take no disk
    t0 = time.monotonic()
    _refused(model, "config.json", "over the", "cap")
    assert time.monotonic() - t0 < 1.0  # not read through


def test_each_kind_has_its_own_cap(tmp_path: Path) -> None:
    """The index lists every tensor: it may be far larger than any config."""
    assert MAX_BYTES["model.safetensors.index.json"] > MAX_BYTES["config.json"]
    model = _model(tmp_path / "m")
    big = {"weight_map": {f"t{i:07d}" + "x" * 40: "model.safetensors" for i in range(200_000)}}
    (model / "model.safetensors.index.json").write_text(json.dumps(big))
    assert (model / "model.safetensors.index.json").stat().st_size > MAX_BYTES["config.json"]
    (model / "model.safetensors").write_bytes(b"")
    info = read_model_dir(model)
    assert [s.name for s in info.shards] == ["model.safetensors"]


def test_config_linked_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(CONFIG))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").symlink_to(outside)
    _refused(model, "config.json", "outside the model directory")


def test_the_hugging_face_cache_layout_still_reads(tmp_path: Path) -> None:
    """A snapshot's files link to the repository's blobs, outside the snapshot directory but
    inside the repository folder: that is where the files are meant to be."""
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "c0ffee").write_text(json.dumps(CONFIG))
    (blobs / "beef01").write_bytes(b"w" * 10)
    (snap / "config.json").symlink_to("../../blobs/c0ffee")
    (snap / "model.safetensors").symlink_to("../../blobs/beef01")
    info = read_model_dir(snap)
    assert info.errors == () and info.num_layers == 2
    assert [(s.name, s.size_bytes) for s in info.shards] == [("model.safetensors", 10)]


def test_index_entries_outside_the_directory_are_ignored_with_a_note(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    (tmp_path / "outside.safetensors").write_bytes(b"o" * 1000)
    (model / "good.safetensors").write_bytes(b"g" * 10)
    (model / "link.safetensors").symlink_to(tmp_path / "outside.safetensors")
    index = {
        "weight_map": {
            "a": "good.safetensors",
            "b": "../outside.safetensors",
            "c": "/etc/passwd",
            "d": "link.safetensors",
            "e": "sub/../../outside.safetensors",
        }
    }
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    info = read_model_dir(model, tensor_bytes=True)
    assert [(s.name, s.size_bytes) for s in info.shards] == [("good.safetensors", 10)]
    (note,) = (e for e in info.errors if e.startswith("model.safetensors.index.json"))
    assert note.startswith("model.safetensors.index.json: 4 entries name files outside")
    assert "ignored" in note and "\n" not in note
    # the link sits at the top level too, where the loader's glob finds it: said there as well
    assert any(e.startswith("link.safetensors: a link") for e in info.errors)


def test_a_top_level_shard_linked_out_is_ignored_with_a_note(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    (tmp_path / "secret.bin").write_bytes(b"s" * 77)
    (model / "model-1.safetensors").symlink_to(tmp_path / "secret.bin")
    (model / "model-2.safetensors").write_bytes(b"w" * 5)
    info = read_model_dir(model)
    assert [s.name for s in info.shards] == ["model-2.safetensors"]
    assert any("model-1.safetensors" in e and "outside" in e for e in info.errors)


# -- safetensors headers ------------------------------------------------------------------------


def _shard(path: Path, offsets: dict[str, list[object]], data_bytes: int) -> None:
    header = {
        name: {"dtype": "BF16", "shape": [1], "data_offsets": offs}
        for name, offs in offsets.items()
    }
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + data_bytes)


def test_a_valid_header_gives_exact_group_bytes(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    _shard(
        model / "model.safetensors",
        {"model.embed_tokens.weight": [0, 100], "model.layers.0.mlp.up.weight": [100, 160]},
        160,
    )
    info = read_model_dir(model, tensor_bytes=True)
    assert info.errors == ()
    assert info.geometry is not None
    assert dict(info.geometry.family_bytes) == {"embed_tokens": 100, "all": 160}


@pytest.mark.parametrize(
    ("offsets", "data_bytes", "words"),
    [
        ({"a.weight": [0, 100], "b.weight": [100, 5000]}, 200, "past the end"),
        ({"a.weight": [0, 120], "b.weight": [100, 200]}, 200, "overlap"),
        ({"a.weight": [-50, 10]}, 200, "negative"),
        ({"a.weight": [20, 10]}, 200, "ends before it begins"),
        ({"a.weight": ["zero", "ten"]}, 200, "two integers"),
        ({"a.weight": [0, 1e3]}, 2000, "two integers"),
    ],
)
def test_bad_header_offsets_fall_back_to_the_estimate_with_a_note(
    tmp_path: Path, offsets: dict[str, list[object]], data_bytes: int, words: str
) -> None:
    model = _model(tmp_path / "m")
    _shard(model / "model.safetensors", offsets, data_bytes)
    info = read_model_dir(model, tensor_bytes=True)
    assert info.geometry is not None and info.geometry.family_bytes == ()
    (note,) = info.errors
    assert note.startswith("model.safetensors: ") and words in note and "\n" not in note
    assert info.total_bytes == (model / "model.safetensors").stat().st_size


def test_a_header_longer_than_the_cap_is_not_read(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    claimed = 200 * 2**20
    with open(model / "model.safetensors", "wb") as f:
        f.write(claimed.to_bytes(8, "little") + b"{")
        f.truncate(8 + claimed + 10)  # sparse
    t0 = time.monotonic()
    info = read_model_dir(model, tensor_bytes=True)
    assert time.monotonic() - t0 < 1.0
    assert info.geometry is not None and info.geometry.family_bytes == ()
    (note,) = info.errors
    assert "header" in note and "cap" in note


def test_a_stand_in_without_a_header_falls_back_silently(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(10_000)  # zeros: no header at all (the demo's sparse shards)
    info = read_model_dir(model, tensor_bytes=True)
    assert info.errors == () and info.geometry is not None and info.geometry.family_bytes == ()


def test_read_json_refuses_a_fifo_of_any_kind(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "tokenizer_config.json")
    with pytest.raises(ModelFileError, match="not a regular file"):
        read_json(tmp_path, "tokenizer_config.json")


def test_an_absurd_layer_count_is_read_quickly(tmp_path: Path) -> None:
    """In range for JSON, absurd for a model: 2**62 sliding-window layers once built a tuple
    with an entry per layer while reading the shapes."""
    config = {**CONFIG, "num_hidden_layers": 2**62, "sliding_window": 4096}
    model = _model(tmp_path / "m", json.dumps(config))
    t0 = time.monotonic()
    info = read_model_dir(model)
    assert time.monotonic() - t0 < 1.0
    assert info.geometry is not None and info.geometry.num_layers is None
