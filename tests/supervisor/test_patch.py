from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.tools.patch import (
    BACKUP_SUFFIX,
    detect_style,
    drop_fp8_kv_cache,
    patch_model_cli,
    revert_model,
)
from tests.supervisor.modeldirs import MODELS, copy_model

FILES = ("config.json", "hf_quant_config.json")


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.mark.parametrize("model", ["kimi-k25-nvfp4", "deepseek-v3-nvfp4-legacy", "llama-fp8kv"])
def test_drop_then_revert_is_byte_exact(tmp_path: Path, model: str) -> None:
    d = copy_model(model, tmp_path, shard_bytes=None)
    before = _snapshot(d)
    modes = {n: stat.S_IMODE((d / n).stat().st_mode) for n in FILES if (d / n).exists()}
    os.chmod(d / "config.json", 0o640)
    modes["config.json"] = 0o640

    text, code = drop_fp8_kv_cache(d)
    assert code == 0, text
    assert "--- a/config.json" in text or "--- a/hf_quant_config.json" in text
    info = read_model_dir(d)
    assert info.checkpoint_kv_dtype is None and info.kv_sources == ()
    for name, mode in modes.items():
        assert stat.S_IMODE((d / name).stat().st_mode) == mode
        backup = d / (name + BACKUP_SUFFIX)
        if backup.exists():
            assert backup.read_bytes() == before[name]

    text, code = revert_model(d)
    assert code == 0, text
    assert _snapshot(d) == before  # originals back byte for byte, backups gone
    assert stat.S_IMODE((d / "config.json").stat().st_mode) == 0o640


def test_kimi_diff_is_minimal_and_style_kept(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    old_cfg = (d / "config.json").read_text()
    old_hfq = (d / "hf_quant_config.json").read_text()
    text, code = drop_fp8_kv_cache(d)
    assert code == 0
    removed = [ln for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    # Only the KV lines go (the scheme dict spans 5 lines at indent 2); nothing else moves.
    assert [ln[1:].strip() for ln in removed] == [
        '"kv_cache_scheme": {',
        '"dynamic": false,',
        '"num_bits": 8,',
        '"type": "float"',
        "},",
        '"kv_cache_quant_algo": "FP8",',
    ]
    assert added == []
    new_cfg = (d / "config.json").read_text()
    new_hfq = (d / "hf_quant_config.json").read_text()
    assert new_cfg.endswith("}\n") and not new_hfq.endswith("\n")  # trailing newline as before
    assert "kv_cache_scheme" not in new_cfg and "kv_cache_quant_algo" not in new_hfq
    assert list(json.loads(new_cfg)) == list(json.loads(old_cfg))  # key order kept
    assert new_hfq.count("\n    ") == old_hfq.count("\n    ") - 1  # indent 4 kept, one line less
    assert (
        "config.json: removed quantization_config.kv_cache_scheme (original kept as config.json.loadwatch-orig)"
        in text
    )
    assert "hf_quant_config.json: removed quantization.kv_cache_quant_algo" in text


def test_second_run_changes_nothing_and_says_so(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    drop_fp8_kv_cache(d)
    after_first = _snapshot(d)
    mtimes = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    text, code = drop_fp8_kv_cache(d)
    assert code == 0
    assert text.startswith("nothing to change: no FP8 KV-cache declaration")
    assert _snapshot(d) == after_first
    assert {p.name: p.stat().st_mtime_ns for p in d.iterdir()} == mtimes


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    d = copy_model("deepseek-v3-nvfp4-legacy", tmp_path, shard_bytes=None)
    before = _snapshot(d)
    text, code = drop_fp8_kv_cache(d, dry_run=True)
    assert code == 0
    assert '-        "kv_cache_quant_algo": "FP8",' in text
    assert "would remove quantization.kv_cache_quant_algo" in text
    assert text.rstrip().endswith("dry run: nothing written")
    assert _snapshot(d) == before


def test_revert_dry_run_and_nothing_to_revert(tmp_path: Path) -> None:
    d = copy_model("llama-fp8kv", tmp_path, shard_bytes=None)
    text, code = revert_model(d)
    assert code == 0 and text.startswith("nothing to revert")
    drop_fp8_kv_cache(d)
    patched = _snapshot(d)
    text, code = revert_model(d, dry_run=True)
    assert code == 0 and '+\t\t\t"kv_cache_quant_algo": "FP8",' in text
    assert _snapshot(d) == patched


def test_read_only_dir_changes_nothing(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    before = _snapshot(d)
    os.chmod(d, 0o555)
    try:
        text, code = drop_fp8_kv_cache(d)
    finally:
        os.chmod(d, 0o755)
    assert code == 1
    assert text == "patch-model: model directory is read-only (mode 0555); nothing changed\n"
    assert _snapshot(d) == before


def test_read_only_file_changes_nothing(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    os.chmod(d / "hf_quant_config.json", 0o444)
    before = _snapshot(d)
    text, code = drop_fp8_kv_cache(d)
    assert code == 1 and "hf_quant_config.json is read-only (mode 0444)" in text
    assert _snapshot(d) == before


def test_a_link_inside_the_dir_is_replaced_and_its_target_left_alone(tmp_path: Path) -> None:
    # Whatever a link points at can have other readers: the link is replaced, never written
    # through (the Hugging Face cache: test_patch_hf_cache.py).
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    (d / "orig").mkdir()
    (d / "hf_quant_config.json").rename(d / "orig" / "hfq.json")
    (d / "hf_quant_config.json").symlink_to("orig/hfq.json")
    original = (d / "orig" / "hfq.json").read_bytes()
    _, code = drop_fp8_kv_cache(d)
    assert code == 0
    assert not (d / "hf_quant_config.json").is_symlink()
    assert b"kv_cache_quant_algo" not in (d / "hf_quant_config.json").read_bytes()
    assert (d / "orig" / "hfq.json").read_bytes() == original
    assert os.readlink(d / ("hf_quant_config.json" + BACKUP_SUFFIX)) == "orig/hfq.json"
    _, code = revert_model(d)
    assert code == 0
    assert os.readlink(d / "hf_quant_config.json") == "orig/hfq.json"
    assert not os.path.lexists(d / ("hf_quant_config.json" + BACKUP_SUFFIX))


def test_a_link_out_of_the_directory_is_refused(tmp_path: Path) -> None:
    # Only a Hugging Face snapshot's links may leave it, and only into its repository's blobs.
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (d / "config.json").rename(elsewhere / "abc123")
    (d / "config.json").symlink_to(elsewhere / "abc123")
    before = _snapshot(elsewhere) | _snapshot(d)
    text, code = drop_fp8_kv_cache(d)
    assert code == 1 and text.count("\n") == 1
    assert "a link to a file outside the model directory" in text, text
    assert _snapshot(elsewhere) | _snapshot(d) == before and (d / "config.json").is_symlink()


def test_revert_of_a_link_an_earlier_version_patched_through(tmp_path: Path) -> None:
    # Before links were replaced, an in-directory link's target was patched and the backup was
    # a copy: the revert still puts the original bytes back there, and keeps the link.
    plain = copy_model("kimi-k25-nvfp4", tmp_path / "plain", shard_bytes=None)
    assert drop_fp8_kv_cache(plain)[1] == 0
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    (d / "orig").mkdir()
    original = (d / "hf_quant_config.json").read_bytes()
    (d / "hf_quant_config.json").rename(d / "orig" / "hfq.json")
    (d / "hf_quant_config.json").symlink_to("orig/hfq.json")
    (d / ("hf_quant_config.json" + BACKUP_SUFFIX)).write_bytes(original)
    (d / "orig" / "hfq.json").write_bytes((plain / "hf_quant_config.json").read_bytes())
    _, code = revert_model(d)
    assert code == 0
    assert os.readlink(d / "hf_quant_config.json") == "orig/hfq.json"
    assert (d / "orig" / "hfq.json").read_bytes() == original


def test_malformed_and_missing(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    (d / "hf_quant_config.json").write_text('{"quantization": {"kv_cache_quant_algo": "FP8",}}')
    before = _snapshot(d)
    text, code = drop_fp8_kv_cache(d)
    assert code == 1
    assert text.startswith("patch-model: hf_quant_config.json: malformed JSON at line 1 column")
    assert text.endswith("; nothing changed\n") and text.count("\n") == 1
    assert _snapshot(d) == before  # config.json untouched too, though it was fine

    text, code = drop_fp8_kv_cache(tmp_path / "absent")
    assert code == 1 and "no such directory" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    text, code = drop_fp8_kv_cache(empty)
    assert code == 1 and text.startswith("patch-model: config.json: missing")


def test_non_fp8_kv_declaration_left_alone(tmp_path: Path) -> None:
    cfg = {
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "kv_cache_scheme": {"type": "float", "num_bits": 4},
        }
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    text, code = drop_fp8_kv_cache(tmp_path)
    assert code == 0
    assert "nothing to change" in text and "left quantization_config.kv_cache_scheme" in text


def test_stale_backup_that_differs_is_not_overwritten(tmp_path: Path) -> None:
    d = copy_model("deepseek-v3-nvfp4-legacy", tmp_path, shard_bytes=None)
    (d / ("hf_quant_config.json" + BACKUP_SUFFIX)).write_bytes(b'{"old": true}')
    before = _snapshot(d)
    text, code = drop_fp8_kv_cache(d)
    assert code == 1 and "differs from hf_quant_config.json" in text
    assert _snapshot(d) == before


def test_unusual_formatting_still_valid_and_flagged(tmp_path: Path) -> None:
    raw = '{ "quantization_config" : { "kv_cache_quant_algo" : "FP8" , "quant_algo": "FP8" }, "a": 1.50 }'
    (tmp_path / "config.json").write_text(raw)
    text, code = drop_fp8_kv_cache(tmp_path)
    assert code == 0
    assert "formatting could not be reproduced exactly" in text
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "quantization_config": {"quant_algo": "FP8"},
        "a": 1.5,
    }
    revert_model(tmp_path)
    assert (tmp_path / "config.json").read_text() == raw


def test_detect_style_round_trips_fixtures() -> None:
    for path in MODELS.glob("*/*.json"):
        text = path.read_text()
        style = detect_style(text, json.loads(text))
        assert style.exact, path
        assert style.dump(json.loads(text)) == text


def test_cli_usage() -> None:
    text, code = patch_model_cli("x")
    assert code == 2 and "exactly one of" in text
    text, code = patch_model_cli("x", drop_fp8=True, revert=True)
    assert code == 2


def test_revert_refuses_to_discard_edits_made_after_the_patch(tmp_path: Path) -> None:
    """Before: --revert put the originals back over whatever the files held by then."""
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    original = _snapshot(d)
    assert drop_fp8_kv_cache(d)[1] == 0
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 131072  # the operator's edit, after the patch
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    edited = _snapshot(d)

    text, code = revert_model(d)
    assert code == 1 and text.count("\n") == 1, text
    assert "config.json changed since the patch" in text and "--force" in text
    assert "hf_quant_config.json" not in text  # that one is as the patch left it
    assert _snapshot(d) == edited  # nothing reverted, not even the unedited file

    text, code = revert_model(d, force=True)
    assert code == 0, text
    assert _snapshot(d) == original


def test_revert_of_a_file_already_put_back_by_hand_is_quiet(tmp_path: Path) -> None:
    d = copy_model("deepseek-v3-nvfp4-legacy", tmp_path, shard_bytes=None)
    original = _snapshot(d)
    assert drop_fp8_kv_cache(d)[1] == 0
    backup = d / ("hf_quant_config.json" + BACKUP_SUFFIX)
    (d / "hf_quant_config.json").write_bytes(backup.read_bytes())  # the original, by hand
    text, code = revert_model(d)
    assert code == 0, text
    assert _snapshot(d) == original


def test_revert_force_through_the_cli(tmp_path: Path) -> None:
    d = copy_model("llama-fp8kv", tmp_path, shard_bytes=None)
    original = _snapshot(d)
    assert drop_fp8_kv_cache(d)[1] == 0
    (d / "config.json").write_text((d / "config.json").read_text() + "\n")
    text, code = patch_model_cli(str(d), revert=True)
    assert code == 1 and "config.json changed since the patch" in text
    text, code = patch_model_cli(str(d), revert=True, force=True)
    assert code == 0 and _snapshot(d) == original
