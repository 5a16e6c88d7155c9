"""`loadwatch preflight -- COMMAND` prints the command it would run: supervise mode's remedies
(supervise/remedies.py) for the failure it predicts, secrets redacted, with the diff; `--json`
carries it. Run as the installed console script, on the demo's Kimi-K2.5-NVFP4 checkpoint."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.tools.demo import make_model_dir

LOADWATCH = Path(sys.executable).with_name("loadwatch")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOADWATCH), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The checkpoint with its FP8 KV declaration, and without."""
    return (
        make_model_dir(tmp_path_factory.mktemp("fp8"), fp8_kv=True),
        make_model_dir(tmp_path_factory.mktemp("plain"), fp8_kv=False),
    )


def test_fp8_kv_unsupported_on_sm120_would_run_with_the_model_dtype(
    kimi: tuple[Path, Path],
) -> None:
    m = str(kimi[0])
    cmd = ["vllm", "serve", m, "--tensor-parallel-size", "8", "--api-key", "sk-secret123"]
    r = run("preflight", "--gpu-model", "RTX PRO 6000", "--", *cmd)
    assert r.returncode == 1, r.stderr
    assert "sk-secret123" not in r.stdout
    want = shlex.join([*cmd[:-1], "***", "--kv-cache-dtype", "bfloat16"])
    assert f"would run: {want}\n" in r.stdout
    assert "  remedy fp8_kv_unsupported: fp8_kv_unsupported: the attention backend" in r.stdout
    assert "    + --kv-cache-dtype bfloat16\n" in r.stdout
    doc = json.loads(run("preflight", "--gpu-model", "RTX PRO 6000", "--json", "--", *cmd).stdout)
    would = doc["would_run"]
    assert would["remedy"] == "fp8_kv_unsupported" and would["would_run"] == want
    assert would["argv"][-2:] == ["--kv-cache-dtype", "bfloat16"]
    assert would["diff"] == ["+ --kv-cache-dtype bfloat16"]
    assert "sk-secret123" not in json.dumps(doc)


def test_a_max_model_len_that_does_not_fit_would_run_with_the_estimate(
    kimi: tuple[Path, Path],
) -> None:
    cmd = ["vllm", "serve", str(kimi[1]), "--tensor-parallel-size", "8"]
    cmd += ["--max-model-len", "2000000"]
    r = run("preflight", "--gpu-model", "H200", "--json", "--", *cmd)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    memory = next(c for c in doc["checks"] if c["name"] == "memory")
    assert memory["status"] == "fail" and doc["memory"]["max_model_len"] == 2000000
    would = doc["would_run"]
    assert would["remedy"] == "max_model_len"
    fits = int(would["argv"][-1])
    assert (
        2048 <= fits < 2000000
        and f"estimated maximum model length is {fits}" in (memory["message"])
    )
    assert would["diff"] == ["- --max-model-len 2000000", f"+ --max-model-len {fits}"]


def test_a_command_that_fits_would_run_as_given(kimi: tuple[Path, Path]) -> None:
    cmd = ["vllm", "serve", str(kimi[1]), "--tensor-parallel-size", "8"]
    cmd += ["--max-model-len", "8192"]
    r = run("preflight", "--gpu-model", "H200", "--", *cmd)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip("\n").endswith(f"would run: {shlex.join(cmd)}")
    assert "remedy" not in r.stdout
    # a directory alone: the report as ever, no command to run
    alone = run("preflight", str(kimi[1]), "--gpu-model", "H200", "--tensor-parallel-size", "8")
    assert alone.returncode == 0 and "would run" not in alone.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--tensor-parallel-size", "8", "--", "vllm", "serve", "/m"), "give vLLM's flags in the"),
        (("--kv-cache-dtype", "fp8", "--", "vllm", "serve", "/m"), "give vLLM's flags in the"),
        (("--", "vllm", "serve"), "names no model"),
    ],
)
def test_usage_errors_are_one_line_and_exit_64(args: tuple[str, ...], needle: str) -> None:
    r = run("preflight", "--gpu-model", "H200", *args)
    assert r.returncode == 64 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and needle in r.stderr, r.stderr
