"""The command line at the conventions operators know: `--version`, usage errors that exit 64 on
stderr in one line, help text and defaults on every option, no traceback for any user input.
Each runs the installed `loadwatch` console script, as an operator would."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon import cli

LOADWATCH = Path(sys.executable).with_name("loadwatch")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOADWATCH), *args], capture_output=True, text=True, timeout=60, check=False
    )


def usage_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 64, (r.returncode, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("loadwatch"), r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_version_comes_from_the_installed_metadata() -> None:
    r = run("--version")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == f"loadwatch {importlib.metadata.version('loadwatch')}\n"


def test_bare_command_prints_help_on_stderr_and_exits_64() -> None:
    r = run()
    assert r.returncode == 64 and r.stdout == ""
    assert "usage: loadwatch" in r.stderr and "exit codes:" in r.stderr


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--bogus",), ("unrecognized arguments: --bogus",)),
        (("analyze",), ("the following arguments are required: LOG",)),
        (("demo", "--speed", "0"), ("--speed", "must be a number above 0")),
        (("demo", "--speed", "-5"), ("--speed", "must be a number above 0")),
        (("demo", "--speed", "fast"), ("--speed", "is not a number")),
        (("demo", "--listen", "127.0.0.1:99999"), ("--listen", "port must be 0..65535")),
        (("run", "--listen", "nowhere"), ("--listen", "expected HOST:PORT")),
        (
            ("preflight", "/tmp", "--kv-cache-dtype", "bogus"),
            ("--kv-cache-dtype", "'bogus' is not a KV-cache dtype vLLM accepts", "fp8_e4m3"),
        ),
        (("patch-model", "/tmp"), ("one of the arguments --drop-fp8-kv-cache --revert",)),
        (("status", "--watch", "--interval", "0"), ("--interval",)),
    ],
)
def test_usage_errors_exit_64_in_one_line(args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    usage_error(run(*args), *needles)


def _actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [(f"{name} {a.dest}", a) for a in sub._actions]
        else:
            out.append((action.dest, action))
    return out


def test_every_option_has_help_text() -> None:
    missing = [
        name
        for name, a in _actions(cli._parser())
        if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
    ]
    assert missing == []


@pytest.mark.parametrize(
    ("command", "needles"),
    [
        ("analyze", ("(default: 65536)", "exit codes: 0 ready, 1 failed, 2 incomplete")),
        ("events", ("(default: 65536)", "example:")),
        ("demo", ("(default: success)", "(default: 15.0)", "(default: 127.0.0.1:9321)")),
        ("status", ("(default: http://127.0.0.1:9321)", "(default: 1.0)", "q or Ctrl-C")),
        ("preflight", ("--kv-cache-dtype DTYPE", "exit codes: 0 ok, 1 will fail")),
        ("patch-model", ("--revert", "byte-exact backups")),
        ("run", ("--state-dir DIR", "exits 78")),
    ],
)
def test_help_shows_defaults_and_examples(command: str, needles: tuple[str, ...]) -> None:
    r = run(command, "--help")
    assert r.returncode == 0 and r.stderr == ""
    flat = " ".join(r.stdout.split())  # argparse wraps at the terminal's width
    for n in needles:
        assert n in flat, (n, r.stdout)


def test_each_default_shows_once_and_none_is_not_a_default() -> None:
    """A help string that names its default is not given a second `(default: None)`."""
    env = {**os.environ, "COLUMNS": "1000"}  # one option's help on one line
    names = next(
        a.choices for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    for command in names:
        r = subprocess.run(
            [str(LOADWATCH), command, "--help"], capture_output=True, text=True, env=env
        )
        assert r.returncode == 0, r.stderr
        for line in r.stdout.splitlines():
            assert line.count("(default:") <= 1, (command, line)
            assert "(default: None)" not in line, (command, line)


def test_preflight_of_a_missing_directory_is_one_line_and_exit_66(tmp_path: Path) -> None:
    r = run("preflight", str(tmp_path / "nonexistent"))
    assert r.returncode == 66 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("loadwatch: "), r.stderr
    assert "nonexistent" in r.stderr and "Traceback" not in r.stderr


def test_patch_model_errors_carry_the_command_prefix(tmp_path: Path) -> None:
    r = run("patch-model", str(tmp_path / "nonexistent"), "--drop-fp8-kv-cache")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("loadwatch: patch-model: ") and r.stderr.count("\n") == 1, r.stderr


@pytest.fixture(scope="module")
def fp8_kimi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from loadwatch.daemon.tools.demo import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("kimi"), fp8_kv=True)


def test_gpu_model_gives_the_compute_capability(fp8_kimi: Path) -> None:
    """`--gpu-model "RTX PRO 6000"` is an SM120 GPU: the FP8 MLA KV cache fails there, as it
    does with `--gpu-cc 12.0`, not a warning that the compute capability is unknown."""
    plan = ["--tensor-parallel-size", "8", "--json"]
    named = run("preflight", str(fp8_kimi), "--gpu-model", "RTX PRO 6000", *plan)
    given = run("preflight", str(fp8_kimi), "--gpu-cc", "12.0", "--gpu-memory-gib", "95.6", *plan)
    assert (named.returncode, given.returncode) == (1, 1), (named.stdout, named.stderr)
    doc = json.loads(named.stdout)
    assert doc["gpu_cc"] == "12.0"
    (backend,) = [c for c in doc["checks"] if c["name"] == "attention_backend"]
    assert backend["status"] == "fail" and "TRITON_MLA" in backend["message"]
    hopper = run("preflight", str(fp8_kimi), "--gpu-model", "H200", *plan)
    assert hopper.returncode == 0 and json.loads(hopper.stdout)["gpu_cc"] == "9.0"
    # --gpu-cc still wins over the model's
    told = run("preflight", str(fp8_kimi), "--gpu-model", "H200", "--gpu-cc", "12.0", *plan)
    assert told.returncode == 1 and json.loads(told.stdout)["gpu_cc"] == "12.0"


def test_every_gpu_model_of_the_table_has_a_compute_capability() -> None:
    from loadwatch.daemon.state.memplan_inputs import GPU_MODELS_MIB
    from loadwatch.daemon.tools.plan_args import gpu_model_cc

    expected = {"rtx pro 6000": (12, 0), "rtx 5090": (12, 0), "b200": (10, 0), "h200": (9, 0)}
    expected |= {"h100": (9, 0), "h20": (9, 0), "a100-40": (8, 0), "a100": (8, 0)}
    expected |= {"l40s": (8, 9), "rtx 4090": (8, 9)}
    got = {fragment: gpu_model_cc(f"NVIDIA {fragment.upper()}") for fragment, _ in GPU_MODELS_MIB}
    assert got == expected
    assert gpu_model_cc("NVIDIA H20") == (9, 0) and gpu_model_cc("Voodoo 2") is None
