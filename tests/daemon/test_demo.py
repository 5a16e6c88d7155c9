"""`loadwatch demo`: each scenario behaves as named (fast, no screen)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from loadwatch.daemon.tools.demo import demo_command, free_port

EXPECT = {
    "success": ("Verdict: ready", None),
    "stall": ("incomplete: loading_weights", "transition.stall_raised"),
    "oom": ("failed: cuda_oom", "forecast=oom_predicted"),
    "crash-loop": ("failed: nccl", None),
    "fp8-kv-on-sm120": ("Verdict: ready", "failed: fp8_kv_unsupported"),
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
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = demo_command(args)
    text = out.getvalue() + capsys.readouterr().out
    verdict, extra = EXPECT[scenario]
    assert code == 0, text
    assert verdict in text, text
    if extra is not None:
        assert extra in text, text
