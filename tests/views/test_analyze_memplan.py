"""analyze shows the memory plan against what vLLM reported: a log real vLLM 0.32 wrote on the
CPU (tests/fixtures/real-v0.32-llama.log) with a model directory holding that model's config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main
from tests.realvllm.tinymodel import BuildOptions, plan

LOG = Path(__file__).resolve().parent.parent / "fixtures" / "real-v0.32-llama.log"


def _model_dir(root: Path, layers: int | None = None) -> Path:
    config, _ = plan(BuildOptions(arch="llama", layers=layers))
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(b"\0" * 1000)
    return root


def test_analyze_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model_dir(tmp_path / "m")
    main(["analyze", str(LOG), "--model-dir", str(model)])
    out = " ".join(capsys.readouterr().out.split())  # the report wraps long lines
    assert "KV vs plan as_planned: 524,288 tokens as planned for 1.00 GiB (+0.0%)" in out
    # (the log's `non-default args` give max_model_len 512, and no parallel size: TP 1, PP 1)
    assert "launch arguments as vLLM logged them at start" in out
    main(["analyze", str(LOG), "--model-dir", str(model), "--json"])
    plan_doc = json.loads(capsys.readouterr().out)["sessions"][-1]["memory_plan"]
    assert plan_doc["actual_tokens"] == plan_doc["expected_tokens"] == 524_288
    assert plan_doc["kv_bytes_per_token"] == 2048


def test_analyze_says_when_vllm_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model_dir(tmp_path / "m", layers=2)  # a config that is not the one vLLM ran
    main(["analyze", str(LOG), "--model-dir", str(model)])
    out = " ".join(capsys.readouterr().out.split())
    assert "KV vs plan differs: vLLM holds 524,288 tokens" in out
