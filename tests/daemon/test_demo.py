"""`loadwatch demo`: each scenario behaves as named (fast, no screen)."""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from pathlib import Path

import pytest

from loadwatch.daemon.tools.demo import demo_command, free_port

# scenario: (the verdict it ends in, a line it must show, the exit code: the verdict's)
EXPECT = {
    "success": ("Verdict: ready", None, 0),
    "stall": ("incomplete: loading_weights", "transition.stall_raised", 2),
    "oom": ("failed: cuda_oom", "forecast=oom_predicted", 1),
    "crash-loop": ("failed: nccl", None, 1),
    "fp8-kv-on-sm120": ("Verdict: ready", "failed: fp8_kv_unsupported", 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(EXPECT))
def test_demo_scenario(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        scenario=scenario,
        speed=40.0 if scenario == "oom" else 150.0,  # the OOM forecast needs a few GPU polls
        real=False,
        listen=f"127.0.0.1:{free_port()}",
        no_screen=True,
        keep=scenario == "stall",
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = demo_command(args)
    text = out.getvalue() + capsys.readouterr().out
    verdict, extra, exit_code = EXPECT[scenario]
    assert code == exit_code, text
    assert verdict in text, text
    if extra is not None:
        assert extra in text, text
    kept = [line for line in text.splitlines() if line.startswith("kept: ")]
    if scenario == "stall":  # --keep: the log and the event log stay for a look afterwards
        root = Path(kept[0].split()[1])
        assert (root / "vllm.log").stat().st_size > 0 and (root / "events.jsonl").exists()
        shutil.rmtree(root)
    else:
        assert kept == [] and "--keep keeps it" in text
