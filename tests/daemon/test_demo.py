"""`loadwatch demo`: each scenario behaves as named (fast, no screen). Success plays two starts
of the model: the second one's ETA to ready, from its first line, is within 15% of the time it
took."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.tools.demo import demo_command
from loadwatch.daemon.tools.ports import EPHEMERAL_RANGE, free_port

pytestmark = pytest.mark.waits

# scenario: (the verdict it ends in, a line it must show, the exit code: the verdict's)
EXPECT = {
    "success": ("Verdict: ready", None, 0),
    "stall": ("incomplete: loading_weights", "transition.stall_raised", 2),
    "oom": ("failed: cuda_oom", "forecast=oom_predicted", 1),
    "crash-loop": ("failed: nccl", None, 1),
    "fp8-kv-on-sm120": ("Verdict: ready", "failed: fp8_kv_unsupported", 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("remedy", ["patch", "flag"])
def test_fp8_kv_on_sm120_is_remedied_by_the_supervisor(
    remedy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The remedy, not the demo, fixes the start: announced with the KV tokens it costs, the
    restart reaches ready; the patch is put back byte for byte by `patch-model --revert`."""
    args = argparse.Namespace(
        scenario="fp8-kv-on-sm120",
        speed=150.0,
        real=False,
        listen=f"127.0.0.1:{free_port()}",
        no_screen=True,
        keep=False,
        remedy_fp8=remedy,
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = demo_command(args)
    text = out.getvalue() + capsys.readouterr().out
    assert code == 0 and "Verdict: ready" in text, text
    # the event line, and the demo's own line of the remedy, with the KV capacity it costs
    assert "vllm.remedy remedy=fp8_kv_unsupported outcome=applied" in text, text
    assert "vllm.remedy remedy=fp8_kv_unsupported outcome=helped" in text, text
    # (the plan may give a range, low-high: its first number is compared)
    cost = re.search(
        r"KV tokens per GPU: with FP8 ([\d,]+)\S*, with the model dtype ([\d,]+)", text
    )
    assert cost is not None, text
    fp8, bf16 = (int(n.replace(",", "")) for n in cost.groups())
    assert 0 < bf16 < fp8, text  # the model-dtype cache holds fewer tokens
    assert re.search(r"^remedy fp8_kv_unsupported (applied|helped): ", text, re.M), text
    if remedy == "patch":
        assert "hf_quant_config.json" in text and "kv_cache_quant_algo" in text, text
        assert "restored from hf_quant_config.json.loadwatch-orig" in text, text
        assert "the checkpoint's files are byte for byte as before the patch" in text, text
    else:
        assert "+ --kv-cache-dtype bfloat16" in text, text
        assert "patch-model --revert" not in text, text


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(EXPECT))
def test_demo_scenario(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        scenario=scenario,
        # The OOM forecast needs a few GPU polls; success's two starts are timed against each
        # other, so the simulated vLLM's own start (a Python process, not sped up) is kept small
        # beside them.
        speed={"oom": 40.0, "success": 80.0}.get(scenario, 150.0),
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
    if scenario == "success":
        said = re.search(
            r"second start: .*the ETA to ready said .* it took \S+ \(([+-][\d.]+)%\)", text
        )
        assert said is not None, text
        print(said.group(0))
        assert abs(float(said.group(1))) <= 15.0, said.group(0)
        assert text.count("Verdict: ready") == 1 and "2 sessions" in text, text
    kept = [line for line in text.splitlines() if line.startswith("kept: ")]
    if scenario == "stall":  # --keep: the log and the event log stay for a look afterwards
        root = Path(kept[0].split()[1])
        assert (root / "vllm.log").stat().st_size > 0 and (root / "events.jsonl").exists()
        shutil.rmtree(root)
    else:
        assert kept == [] and "--keep keeps it" in text


@pytest.mark.slow
def test_demo_on_a_pipe_prints_plain_status_lines_as_it_goes() -> None:
    """`loadwatch demo | tee f`: no live screen to redraw, so a plain line per update, written
    as the load goes (the loading phase is seen before it is over), with no cursor codes."""
    loadwatch = Path(sys.executable).with_name("loadwatch")
    proc = subprocess.Popen(
        [str(loadwatch), "demo", "--speed", "150", "--listen", f"127.0.0.1:{free_port()}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if "post-mortem" in line:
            break
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    before = [line for line in seen if "post-mortem" not in line]
    phases = [line.split()[1] if len(line.split()) > 1 else "" for line in before]
    loading = [i for i, phase in enumerate(phases) if phase == "loading_weights"]
    ready = [i for i, phase in enumerate(phases) if phase == "ready"]
    assert loading and ready and loading[0] < ready[0], "".join(before)
    assert any("/119 shards" in before[i] for i in loading), "".join(before)
    assert "\x1b" not in "".join(seen) + rest


def test_a_free_port_lies_below_the_kernels_ephemeral_range() -> None:
    # a port of that range can go to any outgoing connection before the server binds it (a
    # real vLLM once lost its port so to a test beside it: "Address already in use")
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports) and len(ports) > 10  # random, so side by side
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free, as said
