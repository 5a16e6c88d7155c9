"""The simulated GPUs: memory follows the scripted load, faults come on demand."""

from __future__ import annotations

import pytest

from loadwatch.daemon.sim.gpus import (
    GIB,
    H200,
    LIBRARY_MISSING,
    MIB,
    RTX_PRO_6000_BLACKWELL,
    SimulatedGpuSource,
)


class Progress:
    def __init__(self) -> None:
        self.p = 0.0

    def __call__(self) -> float:
        return self.p


def test_defaults_are_eight_blackwell_gpus() -> None:
    sim = SimulatedGpuSource()
    r = sim.poll()
    assert r.source_up and len(r.samples) == 8
    assert {s.name for s in r.samples} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {s.compute_capability for s in r.samples} == {(12, 0)}
    assert {s.memory_total_bytes for s in r.samples} == {96 * GIB}
    assert len({s.uuid for s in r.samples}) == 8
    assert len({s.pci_bus_id for s in r.samples}) == 8
    assert [s.index for s in r.samples] == list(range(8))


def test_memory_grows_with_progress_to_each_final_figure() -> None:
    progress = Progress()
    finals = [80 * GIB, 60 * GIB]
    sim = SimulatedGpuSource(
        2, progress=progress, final_used_bytes=finals, context_bytes=500 * MIB, clock=lambda: 3.0
    )
    seen: list[list[int]] = []
    for p in [0.0, 0.1, 0.25, 0.5, 0.9, 1.0]:
        progress.p = p
        seen.append([s.memory_used_bytes or 0 for s in sim.poll().samples])
    assert seen[0] == [500 * MIB, 500 * MIB]
    assert seen[-1] == finals
    for gpu in (0, 1):
        column = [row[gpu] for row in seen]
        assert column == sorted(column) and len(set(column)) == len(column)
    assert seen[3][0] == 500 * MIB + (80 * GIB - 500 * MIB) // 2
    progress.p = 1.5  # past the end (or NaN) is clamped, not extrapolated
    assert [s.memory_used_bytes for s in sim.poll().samples] == finals
    progress.p = float("nan")
    assert [s.memory_used_bytes for s in sim.poll().samples] == [500 * MIB] * 2


def test_processes_hold_the_used_memory_when_pids_are_given() -> None:
    progress = Progress()
    progress.p = 0.5
    sim = SimulatedGpuSource(3, progress=progress, pids=[11, 12, 13])
    r = sim.poll()
    assert [(s.processes[0].pid, s.processes[0].used_bytes) for s in r.samples] == [
        (11 + i, s.memory_used_bytes) for i, s in enumerate(r.samples)
    ]
    assert SimulatedGpuSource(1).poll().samples[0].processes == ()


def test_other_model() -> None:
    sim = SimulatedGpuSource(2, model=H200, final_used_bytes=120 * GIB)
    s = sim.poll().samples[0]
    assert (s.name, s.compute_capability, s.power_limit_watts) == ("NVIDIA H200", (9, 0), 700.0)


def test_lose_and_restore_a_gpu() -> None:
    sim = SimulatedGpuSource(3)
    sim.lose_gpu(1)
    r = sim.poll()
    assert r.source_up
    assert [s.health for s in r.samples] == ["ok", "lost", "ok"]
    assert r.samples[1].memory_used_bytes is None and r.samples[1].uuid == sim.uuid(1)
    sim.restore_gpu(1)
    assert all(s.up for s in sim.poll().samples)
    with pytest.raises(IndexError):
        sim.lose_gpu(3)


def test_library_missing() -> None:
    sim = SimulatedGpuSource(2)
    sim.set_library_missing()
    r = sim.poll()
    assert not r.source_up and r.samples == () and r.error == LIBRARY_MISSING
    sim.set_library_missing(False)
    assert sim.poll().source_up


def test_xids_are_reported_once_and_counted() -> None:
    sim = SimulatedGpuSource(2, clock=lambda: 8.0)
    sim.raise_xid(1, 79)
    sim.raise_xid(1, 79)
    sim.raise_xid(0, 94)
    r = sim.poll()
    assert [(x.gpu_index, x.xid, x.ts, x.uuid) for x in r.xids] == [
        (1, 79, 8.0, sim.uuid(1)),
        (1, 79, 8.0, sim.uuid(1)),
        (0, 94, 8.0, sim.uuid(0)),
    ]
    assert sim.poll().xids == ()
    assert sim.xid_counts() == {(1, 79): 2, (0, 94): 1}


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        SimulatedGpuSource(1, final_used_bytes=3 * RTX_PRO_6000_BLACKWELL.memory_total_bytes)
    with pytest.raises(ValueError, match="outside"):
        SimulatedGpuSource(1, final_used_bytes=1)  # less than the CUDA context
    with pytest.raises(ValueError, match="2 values for 3 GPUs"):
        SimulatedGpuSource(3, final_used_bytes=[GIB, GIB])
    with pytest.raises(ValueError, match="count"):
        SimulatedGpuSource(-1)


def test_a_load_past_capacity_reads_full_not_more() -> None:
    model = RTX_PRO_6000_BLACKWELL
    usable = model.memory_total_bytes - model.memory_reserved_bytes
    src = SimulatedGpuSource(1, final_used_bytes=int(usable * 1.2))
    assert src.used_bytes(0, 0.5) < usable
    assert src.used_bytes(0, 0.95) == usable == src.used_bytes(0, 1.0)
