"""The demo's simulated vLLM prints the KV-cache figures a real vLLM of its model would: the
memory plan of the demo's checkpoint, over the budget the log states, gives the tokens the log
says (Kimi-K2.5's MLA latent of 576 values per token and layer, 61 layers, blocks of 16)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main
from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.tools.demo import make_model_dir


def test_the_simulated_kv_cache_is_as_the_plan_computes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model_dir(tmp_path, fp8_kv=False, shards=12, total_bytes=12 * 10**9)
    log = tmp_path / "vllm.log"
    shape = Shape(model=str(model), shards=12)
    log.write_text("".join(startup(random.Random(1), SyntheticClock(), shape)))
    main(["analyze", str(log), "--model-dir", str(model), "--json"])
    plan = json.loads(capsys.readouterr().out)["sessions"][-1]["memory_plan"]
    assert plan["actual_vs_plan"] == "as_planned", plan["explain"]
    assert plan["actual_tokens"] == plan["expected_tokens"] == 207_952
    assert "207,952 tokens" in log.read_text() and "0.79x" in log.read_text()
