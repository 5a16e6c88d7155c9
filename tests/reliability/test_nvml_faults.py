"""NVML misbehaves under the real daemon: the log goes on, the other GPUs go on, health is true.

The daemon runs in-process (`run_daemon` on a thread) with its GPU source built as in production,
`GuardedGpuSource(NvmlSource(...))`, over the hand-written fake binding of tests/gpu (NVML cannot
run here). One load is followed while, in turn:

- the binding is missing (ImportError), then appears;
- the driver goes away under live handles, and the re-initialisation fails, then succeeds
  (a driver reload: NVML is initialised again with fresh handles);
- one GPU is lost mid-load (NVML's GPU_IS_LOST, and an Xid 79 event);
- a call hangs (a wedged GPU), past the guard's deadline, then returns.

After each, /metrics and /status are checked against what the fake says: `loadwatch_source_up`
for the GPU source, `loadwatch_gpu_up` per GPU, the error counters, the Xid counter; and the
load's progress moves on in between. A second test runs the real `pynvml` on this machine, where
the library is there but no driver is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from loadwatch.daemon.config import Config, ForecastConfig, GpuConfig, HttpConfig, LogConfig
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
from loadwatch.daemon.sources.gpu.nvml import NvmlSource
from tests.daemon.harness import Running, running
from tests.gpu import fake_pynvml as fk
from tests.helpers import append as _append
from tests.reliability.faults import load_steps

SHARDS = 12
GPUS = 4
DEADLINE_S = 0.3


def _config(tmp: Path) -> Config:
    return Config(
        log=LogConfig(path=tmp / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="nvml", poll_interval_s=0.1, deadline_s=DEADLINE_S),
        forecast=ForecastConfig(stall_floor_s=86400),
        state_dir=tmp / "state",
    )


class Binding:
    """The import of pynvml, which fails until the library is 'installed'."""

    def __init__(self, fake: fk.FakeNvml) -> None:
        self.fake = fake
        self.installed = False

    def __call__(self) -> fk.FakeNvml:
        if not self.installed:
            raise ImportError("No module named 'pynvml'")
        return self.fake


class View:
    def __init__(self, d: Running) -> None:
        self.d = d

    def source_up(self) -> float:
        return self.d.metrics()['loadwatch_source_up{source="gpu"}']

    def errors(self) -> float:
        return self.d.metrics()['loadwatch_source_errors_total{source="gpu"}']

    def gpu_up(self) -> dict[int, float]:
        out = {}
        for key, value in self.d.metrics().items():
            if key.startswith("loadwatch_gpu_up{"):
                out[int(key.split('gpu="')[1].split('"')[0])] = value
        return out

    def shards(self) -> int:
        return int(self.d.status()["session"]["progress"]["shards_done"])

    def scrape_s(self) -> float:
        t0 = time.monotonic()
        assert self.d.get("/metrics")[0] == 200
        return time.monotonic() - t0


@pytest.mark.slow  # bounded: see the module docstring
def test_nvml_faults_leave_the_log_and_the_other_gpus_going(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    log = cfg.log.path
    assert log is not None
    steps = load_steps("/models/m", SHARDS, 5, [2, 4, 6, 8])
    _append(log, steps[0])
    fake = fk.FakeNvml(fk.devices(GPUS))
    binding = Binding(fake)
    logs: list[str] = []

    def gpu_factory(progress: Callable[[], float]) -> GuardedGpuSource:
        inner = NvmlSource(
            loader=binding,
            xid_wait_ms=50,
            backoff_initial_s=0.1,
            backoff_max_s=0.4,
            logger=logs.append,
        )
        return GuardedGpuSource(inner, deadline_s=DEADLINE_S)

    faults = 0
    with running(cfg, gpu_factory=gpu_factory) as d:
        v = View(d)

        # the binding is missing: the GPU source is down, the log is read all the same
        d.wait(lambda: v.shards() == 2, "the log read without NVML")
        d.wait(lambda: v.source_up() == 0.0 and v.errors() >= 2, "the GPU source down")
        s = d.status()
        assert s["gpu_source_up"] is False and "pynvml" in s["gpu_error"]
        assert v.gpu_up() == {}
        faults += 1
        binding.installed = True
        d.wait(lambda: v.gpu_up() == dict.fromkeys(range(GPUS), 1.0), "all GPUs up")
        assert v.source_up() == 1.0

        # the driver goes away; initialising again fails for a while, then works
        fake.driver_error = fk.DRIVER_NOT_LOADED
        d.wait(lambda: v.source_up() == 0.0, "the GPU source down with the driver")
        # the GPUs it knew read down (their identity kept), not vanished
        d.wait(lambda: v.gpu_up() == dict.fromkeys(range(GPUS), 0.0), "every GPU down")
        fake.driver_error, fake.refcount = None, 0
        fake.init_error = fk.DRIVER_NOT_LOADED
        inits = fake.init_calls
        d.wait(lambda: fake.init_calls >= inits + 2, "re-initialisation retried")
        assert v.source_up() == 0.0
        _append(log, steps[1])
        d.wait(lambda: v.shards() == 4, "the log read while NVML is down")
        faults += 1
        fake.init_error = None
        d.wait(lambda: v.gpu_up() == dict.fromkeys(range(GPUS), 1.0), "every GPU up again")
        assert v.source_up() == 1.0

        # one GPU is lost mid-load: it reads down, the others and the log go on
        fake.devices[2].lost = True
        fake.emit(2, 79)
        d.wait(lambda: v.gpu_up() == {0: 1.0, 1: 1.0, 2: 0.0, 3: 1.0}, "GPU 2 down, the others up")
        d.wait(
            lambda: any(
                k.startswith("loadwatch_gpu_xid_errors_total{")
                and 'gpu="2"' in k
                and 'xid="79"' in k
                for k in d.metrics()
            ),
            "the Xid counted",
        )
        gpus = {g["index"]: g for g in d.status()["gpus"]}
        assert gpus[2]["health"] == "lost" and gpus[0]["health"] == "ok"
        assert gpus[2]["uuid"] == fake.devices[2].uuid
        _append(log, steps[2])
        d.wait(lambda: v.shards() == 6, "the log read with a GPU lost")
        faults += 1

        # a call hangs: the guard answers stale within its deadline, nothing piles up
        hang = threading.Event()
        fake.devices[0].hang = hang
        try:
            d.wait(lambda: v.source_up() == 0.0, "the GPU source stale")
            d.wait(lambda: v.gpu_up() == dict.fromkeys(range(GPUS), 0.0), "every GPU stale")
            assert {g["health"] for g in d.status()["gpus"]} == {"stale", "lost"}
            errors = v.errors()
            _append(log, steps[3])
            d.wait(lambda: v.shards() == 8, "the log read while NVML hangs")
            d.wait(lambda: v.errors() >= errors + 3, "overruns counted")
            workers = [t for t in threading.enumerate() if t.name == "loadwatch-gpu-poll"]
            assert len(workers) == 1, "one poll thread, however long the hang"
            worst = max(v.scrape_s() for _ in range(10))
            assert worst < 1.0, f"a scrape took {worst:.3f} s during the hang"
            faults += 1
        finally:
            fake.devices[0].hang = None
            hang.set()
        d.wait(lambda: v.source_up() == 1.0, "fresh readings again")
        assert v.gpu_up() == {0: 1.0, 1: 1.0, 2: 0.0, 3: 1.0}

        _append(log, steps[4])
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        problems = [e["error"] for e in d.events() if e["event"] == "daemon.problem"]
        assert problems and all("\n" not in p for p in problems)
    assert d.code == 0
    print(f"\nNVML faults injected={faults} recovered={faults} problems={len(problems)}")


def test_real_pynvml_without_a_driver_is_a_down_source_not_a_crash(tmp_path: Path) -> None:
    cfg = replace(_config(tmp_path), gpu=GpuConfig(source="nvml", poll_interval_s=0.1))
    _append(cfg.log.path, load_steps("/models/m", SHARDS, 5, [3])[0])  # type: ignore[arg-type]
    with running(cfg) as d:
        v = View(d)
        d.wait(lambda: v.shards() == 3, "the log read")
        d.wait(lambda: v.errors() >= 1, "the GPU source's failure counted")
        if v.source_up() == 1.0:
            pytest.skip("this machine has an NVIDIA driver: NVML works")
        d.wait(lambda: d.status()["gpu_source_up"] is False, "the reading applied")
        s = d.status()
        assert s["gpu_source_up"] is False and s["gpu_error"]
        assert "\n" not in s["gpu_error"]
    assert d.code == 0
