"""Files the daemon writes: atomic, and closed to other users whatever the umask.

- the state directory, its checkpoints, the emit mark, the event log file and the vLLM log the
  supervisor writes, after a real run under a umask of 000 (nothing may then rely on the umask)
  and of 022;
- `patch-model`: the patched files and their backups keep the original's mode (a private config
  stays private); symlinks that leave the model directory are refused however they get there
  (a chain of links, a linked subdirectory, a planted backup link), and nothing outside is
  touched; a write that fails half way (a file-size limit) leaves the directory as it was, with
  no temporary file behind.
"""

from __future__ import annotations

import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
    VllmConfig,
)
from loadwatch.daemon.tools.demo import free_port, make_model_dir
from loadwatch.daemon.tools.patch import BACKUP_SUFFIX, drop_fp8_kv_cache, revert_model
from tests.daemon.harness import running
from tests.reliability.proc import REPO
from tests.supervisor.modeldirs import copy_model


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def _tree(d: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.mark.parametrize("umask", [0o000, 0o022], ids=["umask-000", "umask-022"])
def test_state_files_are_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    model = make_model_dir(tmp_path / "models", fp8_kv=False, shards=4, total_bytes=4 * 10**9)
    state = tmp_path / "state"
    argv = (
        sys.executable, "-m", "loadwatch.daemon.sim.vllm_server", "--model", str(model),
        "--speed", "1000", "--tensor-parallel-size", "2", "--layers", "4", "--port", str(free_port()),
    )  # fmt: skip
    cfg = Config(
        log=LogConfig(poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        forecast=ForecastConfig(stall_floor_s=86400),
        vllm=VllmConfig(
            argv=argv, preflight="off", stop_grace_s=5.0, log_max_bytes=8192, log_keep=2
        ),
        state_dir=state,
        events_file=state / "events" / "events.jsonl",
    )
    cfg = Config(
        **{**cfg.__dict__, "log": LogConfig(path=state / "vllm.log", poll_interval_s=0.05)}
    )
    old = os.umask(umask)
    try:
        with running(cfg) as d:
            d.wait(lambda: d.status()["phase"] == "ready", "vLLM ready", 60)
    finally:
        os.umask(old)
    assert d.code == 0
    files = sorted(p for p in state.rglob("*"))
    kinds = {p.name for p in files}
    assert {"follower", "vllm.log", "vllm.log.1", "events.jsonl"} <= kinds, kinds
    assert any(p.name.startswith("follower-") for p in files)  # the checkpoint
    assert any(p.name.startswith("events-") for p in files)  # the emit mark
    loose = {
        str(p.relative_to(tmp_path)): oct(_mode(p)) for p in [state, *files] if _mode(p) & 0o027
    }
    assert loose == {}, f"open to others (umask {umask:03o}): {loose}"
    assert not [p for p in files if p.name.endswith(".tmp")]


def test_patch_keeps_each_file_mode_and_its_backup_private(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    os.chmod(d / "config.json", 0o600)
    os.chmod(d / "hf_quant_config.json", 0o640)
    old = os.umask(0)
    try:
        text, code = drop_fp8_kv_cache(d)
    finally:
        os.umask(old)
    assert code == 0, text
    assert _mode(d / "hf_quant_config.json") == 0o640
    assert _mode(d / ("hf_quant_config.json" + BACKUP_SUFFIX)) == 0o640
    assert _mode(d / "config.json") == 0o600
    assert not [p.name for p in d.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".")]
    _, code = revert_model(d)
    assert code == 0 and _mode(d / "hf_quant_config.json") == 0o640


def _escape_case(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A model directory whose hf_quant_config.json leads outside it, `how`; the outside dir."""
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    outside = tmp_path / "outside"
    outside.mkdir()
    real = d / "hf_quant_config.json"
    if how == "chain":  # in -> in -> out
        real.rename(outside / "hfq.json")
        (d / "hop").symlink_to(outside / "hfq.json")
        (d / "hop2").symlink_to("hop")
        real.symlink_to("hop2")
    elif how == "linked subdirectory":
        real.rename(outside / "hfq.json")
        (d / "sub").symlink_to(outside)
        real.symlink_to("sub/hfq.json")
    elif how == "dot-dot":
        real.rename(outside / "hfq.json")
        real.symlink_to("../outside/hfq.json")
    elif how == "planted backup":  # the backup name links outside: a patch would write there
        (outside / "victim").write_text("do not touch\n")
        (d / ("hf_quant_config.json" + BACKUP_SUFFIX)).symlink_to(outside / "victim")
    else:
        raise AssertionError(how)
    return d, outside


@pytest.mark.parametrize("how", ["chain", "linked subdirectory", "dot-dot", "planted backup"])
def test_patch_refuses_every_way_out_of_the_model_directory(tmp_path: Path, how: str) -> None:
    d, outside = _escape_case(tmp_path, how)
    before = _tree(d) | {f"out/{k}": v for k, v in _tree(outside).items()}
    links = {p.name: os.readlink(p) for p in d.iterdir() if p.is_symlink()}
    text, code = drop_fp8_kv_cache(d)
    assert code == 1 and text.count("\n") == 1 and "nothing changed" in text, text
    assert _tree(d) | {f"out/{k}": v for k, v in _tree(outside).items()} == before
    assert {p.name: os.readlink(p) for p in d.iterdir() if p.is_symlink()} == links
    text, code = revert_model(d)
    assert _tree(d) | {f"out/{k}": v for k, v in _tree(outside).items()} == before


def test_patch_interrupted_by_a_write_failure_changes_nothing(tmp_path: Path) -> None:
    d = copy_model("kimi-k25-nvfp4", tmp_path, shard_bytes=None)
    before = _tree(d)
    limit = min(len(v) for v in before.values() if v) - 1  # every file is bigger: writes fail

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadwatch.daemon.cli",
            "patch-model",
            str(d),
            "--drop-fp8-kv-cache",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        preexec_fn=small_files,
        timeout=60,
    )
    assert out.returncode == 1, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0] and "Traceback" not in out.stderr
    assert _tree(d) == before
    assert sorted(p.name for p in d.iterdir()) == sorted(before)
