"""The command line at the conventions operators know: `--version`, usage errors that exit 64 on
stderr in one line, help text and defaults on every option, no traceback for any user input.
Each runs the installed `loadwatch` console script, as an operator would."""

from __future__ import annotations

import argparse
import importlib.metadata
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
