"""`[gpu] devices`: one loadwatch per vLLM on a shared host watches only its vLLM's GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.app import gpu_devices
from loadwatch.daemon.config import ConfigError, VllmConfig, load_config, parse_config
from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.sources.gpu.scope import ScopedGpuSource, from_cuda_visible_devices
from tests.e2e.realdaemon import DaemonProc, write_config

SIM = SimulatedGpuSource(8)


class MigSim(SimulatedGpuSource):
    """Eight simulated GPUs whose slices are MIG-<n>-<parent index>."""

    def parent_uuid(self, mig_uuid: str) -> str | None:
        return self.uuid(int(mig_uuid.rsplit("-", 1)[1]))


def test_indices_and_uuids_select_gpus_and_their_xids() -> None:
    sim = SimulatedGpuSource(8)
    scoped = ScopedGpuSource(sim, (1, sim.uuid(6)))
    sim.raise_xid(6, 79)
    sim.raise_xid(2, 48)
    reading = scoped.poll()
    assert [s.index for s in reading.samples] == [1, 6]
    assert [(x.gpu_index, x.xid) for x in reading.xids] == [(6, 79)]


def test_a_mig_uuid_selects_the_gpu_it_is_a_slice_of() -> None:
    scoped = ScopedGpuSource(MigSim(8), ("MIG-0-3",))
    assert [s.index for s in scoped.poll().samples] == [3]


def test_cuda_visible_devices_default_for_the_supervised_vllm() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "4,5,GPU-abc"}
    cfg = parse_config({"vllm": {"argv": ["vllm"], "env": env, "inherit_env": False}})
    assert gpu_devices(cfg) == (4, 5, "GPU-abc")
    explicit = parse_config({"gpu": {"devices": [0]}, "vllm": {"argv": ["vllm"], "env": env}})
    assert gpu_devices(explicit) == (0,)
    assert gpu_devices(parse_config({"log": {"path": "/x"}})) is None
    # CUDA stops at the first entry it cannot read; an empty value hides every GPU
    assert from_cuda_visible_devices("0,1,-1,2") == (0, 1)
    assert from_cuda_visible_devices("") == ()
    assert VllmConfig().env == {}


@pytest.mark.parametrize(
    ("devices", "problem"),
    [
        ('"0"', "expected a list"),
        ('["GPU0"]', "neither a GPU index"),
        ("[-1]", "0 or more"),
        ("[true]", "expected a GPU index"),
    ],
)
def test_bad_devices_exit_78_in_one_line(tmp_path: Path, devices: str, problem: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[log]\npath = "{tmp_path}/x.log"\n[gpu]\ndevices = {devices}\n')
    with pytest.raises(ConfigError, match=problem):
        load_config(cfg)
    run = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 78
    assert run.stderr.count("\n") == 1 and "[gpu] devices" in run.stderr, run.stderr


def test_the_gpu_devices_flag_is_the_config_key(tmp_path: Path) -> None:
    from loadwatch.daemon.app import config_from_args
    from loadwatch.daemon.cli import _parser

    args = _parser().parse_args(["run", "--log", "/x.log", "--gpu-devices", "4,GPU-abc,MIG-d"])
    assert config_from_args(args).gpu.devices == (4, "GPU-abc", "MIG-d")
    bad = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--log", str(tmp_path / "x.log"),
         "--state-dir", str(tmp_path), "--gpu-devices", "0,gpu1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 78 and bad.stderr.count("\n") == 1, bad.stderr
    assert "[gpu] devices" in bad.stderr and "'gpu1'" in bad.stderr


def _daemon(work: Path, devices: list[int | str]) -> DaemonProc:
    work.mkdir()
    (work / "vllm.log").write_bytes(b"")
    cfg = write_config(
        work / "loadwatch.toml",
        {"state_dir": work / "state", "events_file": work / "events.jsonl"},
        log={"path": work / "vllm.log", "poll_interval_s": 0.1},
        http={"listen": "127.0.0.1:0"},
        gpu={
            "source": "simulated",
            "simulated_count": 8,
            "devices": devices,
            "poll_interval_s": 0.2,
        },
    )
    return DaemonProc(cfg, work)


def test_two_daemons_on_one_8_gpu_host_each_report_only_their_gpus(tmp_path: Path) -> None:
    first = _daemon(tmp_path / "a", [0, 1, 2, 3])
    second = _daemon(tmp_path / "b", [SIM.uuid(i) for i in (4, 5, 6, 7)])
    try:
        first.start()
        second.start()
        for d, want in ((first, [0, 1, 2, 3]), (second, [4, 5, 6, 7])):
            # (/status answers 503 "starting" until the first state is published)
            d.wait(
                lambda d=d: d.get("/status")[0] == 200 and len(d.status()["gpus"]) == 4,
                "four GPUs",
                30,
            )
            gpus = d.status()["gpus"]
            assert [g["index"] for g in gpus] == want
            assert [g["uuid"] for g in gpus] == [SIM.uuid(i) for i in want]
            labelled = {
                k.split('gpu="')[1].split('"')[0]
                for k in d.metrics()
                if k.startswith("loadwatch_gpu_memory_used_bytes{")
            }
            assert labelled == {str(i) for i in want}
    finally:
        for d in (first, second):
            d.kill()


def test_nvml_a_mig_uuid_selects_its_parent_gpu_and_a_down_nvml_selects_none_yet() -> None:
    from loadwatch.daemon.sources.gpu.nvml import NvmlSource
    from tests.gpu import fake_pynvml as fk

    fake = fk.FakeNvml(fk.devices(4))
    fake.migs = {"MIG-2f2c0e1a-0000-5000-8000-000000000001": 2}
    fake.init_error = fk.DRIVER_NOT_LOADED
    source = NvmlSource(fake, xid_events=False, logger=lambda line: None, backoff_initial_s=0.0)
    scoped = ScopedGpuSource(source, ("MIG-2f2c0e1a-0000-5000-8000-000000000001", 0))
    try:
        down = scoped.poll()  # NVML not up: the MIG device cannot be looked up yet
        assert not down.source_up and down.samples == ()
        fake.init_error = None
        up = scoped.poll()
        assert [s.index for s in up.samples] == [0, 2]
        assert fake.count("nvmlDeviceGetDeviceHandleFromMigDeviceHandle") == 1
        scoped.poll()  # looked up once
        assert fake.count("nvmlDeviceGetDeviceHandleFromMigDeviceHandle") == 1
    finally:
        scoped.close()
