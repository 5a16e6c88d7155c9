"""A hostile checkpoint through the real command line: `preflight`, `run --model-dir`,
`patch-model` and `analyze --model-dir` end in one `loadwatch:` line and exit 65 (bad input
data), never a traceback; a FIFO for config.json never blocks them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.proc import REPO

EX_DATAERR = 65

CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4}


def _hostile(root: Path, how: str) -> Path:
    model = root / "model"
    model.mkdir()
    config = model / "config.json"
    if how == "deep":
        config.write_text("[" * 100_000 + "]" * 100_000)
    elif how == "huge int":
        config.write_text(json.dumps(CONFIG)[:-1] + ', "head_dim": 1' + "0" * 5000 + "}")
    elif how == "fifo":
        os.mkfifo(config)
    elif how == "deep quant":
        config.write_text(json.dumps(CONFIG))
        (model / "hf_quant_config.json").write_text('{"a":' * 50_000 + "1" + "}" * 50_000)
    else:
        raise AssertionError(how)
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(1000)
    return model


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _one_line(out: subprocess.CompletedProcess[str], *words: str) -> str:
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert out.returncode == EX_DATAERR, (out.returncode, out.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("loadwatch: "), out.stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


HOW = ["deep", "huge int", "fifo", "deep quant"]
WORDS = {
    "deep": "nested deeper than",
    "huge int": "out of range",
    "fifo": "not a regular file",
    "deep quant": "hf_quant_config.json",
}


@pytest.mark.parametrize("how", HOW)
def test_preflight_exits_65_in_one_line(tmp_path: Path, how: str) -> None:
    model = _hostile(tmp_path, how)
    out = _cli("preflight", str(model), "--gpu-cc", "9.0", "--gpu-memory-gib", "80")
    _one_line(out, str(model), WORDS[how])


def test_run_with_a_hostile_model_dir_exits_65_in_one_line(tmp_path: Path) -> None:
    model = _hostile(tmp_path, "deep")
    log = tmp_path / "vllm.log"
    log.write_text("")
    out = _cli(
        "run", "--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
        "--listen", "127.0.0.1:0", "--model-dir", str(model),
    )  # fmt: skip
    _one_line(out, "[model] dir", str(model), "nested deeper than")


def test_patch_model_exits_65_in_one_line(tmp_path: Path) -> None:
    model = _hostile(tmp_path, "huge int")
    before = (model / "config.json").read_bytes()
    out = _cli("patch-model", str(model), "--drop-fp8-kv-cache")
    _one_line(out, "out of range")
    assert (model / "config.json").read_bytes() == before


def test_analyze_with_a_hostile_model_dir_exits_65_in_one_line(tmp_path: Path) -> None:
    model = _hostile(tmp_path, "fifo")
    log = tmp_path / "vllm.log"
    log.write_text("")
    out = _cli("analyze", str(log), "--model-dir", str(model))
    _one_line(out, "--model-dir", "not a regular file")


def test_preflight_help_names_exit_65() -> None:
    out = _cli("preflight", "--help")
    assert out.returncode == 0 and "65" in out.stdout
