"""What the watch-mode docs tell an operator about vLLM's log: loadwatch's `/health` probes show
up there (uvicorn logs every request), so systemd/README.md and the watch-mode example config
name vLLM's `--disable-uvicorn-access-log` and the longer `[vllm] health_interval_s`, and the
quiet floor's key; the supervise example starts vLLM with the flag. The flag is checked against the installed vLLM 0.32 itself (`make vllm`)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from loadwatch.daemon.config import parse_config
from tests.realvllm.vllmproc import vllm_python

from .common import SYSTEMD

EXAMPLE = SYSTEMD / "loadwatch.toml.example"
FLAG = "--disable-uvicorn-access-log"


def test_the_watch_docs_say_how_to_keep_the_probes_out_of_vllms_log() -> None:
    example, readme = EXAMPLE.read_text(), (SYSTEMD / "README.md").read_text()
    for text in (example, readme):
        assert FLAG in text
        assert "health_interval_s" in text and "quiet_stall_s" in text
    data = tomllib.loads(example)
    interval = data["vllm"]["health_interval_s"]
    # the figure the example gives is its own interval's: one access line a probe
    assert f"{round(3600 / interval)} lines an hour at {interval} s" in example
    assert data["forecast"]["quiet_stall_s"] == parse_config({}).forecast.quiet_stall_s
    assert "vLLM's log in watch mode" in (SYSTEMD.parent / "docs" / "usage.md").read_text()
    # supervise mode captures the same lines: its example starts vLLM with the flag
    supervise = tomllib.loads((SYSTEMD / "loadwatch-supervise.toml.example").read_text())
    assert FLAG in supervise["vllm"]["argv"]


@pytest.mark.realvllm
def test_the_flag_is_vllms_own_and_turns_the_access_log_off() -> None:
    python = vllm_python()
    if not python.is_file():
        pytest.fail(f"no vLLM at {python}: run `make vllm`")
    found = subprocess.run(  # where vllm is, without importing it (torch takes seconds)
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('vllm').origin)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    root = Path(found.stdout.strip()).parent / "entrypoints" / "launchers"
    # vLLM's parser takes each field of its args dataclass as --the-field-name
    assert "disable_uvicorn_access_log: bool = False" in (root / "cli_args.py").read_text()
    entry = (root / "api_server" / "entry.py").read_text()
    assert "access_log=not args.disable_uvicorn_access_log" in entry
