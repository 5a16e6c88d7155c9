"""NvmlSource against the hand-written fake pynvml: values, units, and every error path."""

from __future__ import annotations

import threading
import time

import pytest

from loadwatch.daemon.sources.gpu.nvml import NvmlSource
from loadwatch.daemon.sources.inputs import GpuReading
from tests.gpu import fake_pynvml as fk
from tests.gpu.fake_pynvml import GIB, MIB, FakeDevice, FakeNvml
from tests.helpers import wait_for


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(
    nvml: FakeNvml | None = None, *, n: int = 2, xid: bool = False, **kw: object
) -> tuple[NvmlSource, FakeNvml, Clock, list[str]]:
    fake = nvml if nvml is not None else FakeNvml(fk.devices(n))
    mono = Clock(0.0)
    logs: list[str] = []
    src = NvmlSource(
        fake,
        clock=Clock(5000.0),
        monotonic=mono,
        xid_events=xid,
        xid_wait_ms=20,
        logger=logs.append,
        **kw,  # type: ignore[arg-type]
    )
    return src, fake, mono, logs


def test_healthy_poll_maps_every_field_in_base_units() -> None:
    dev = FakeDevice(
        uuid=b"GPU-abc",  # older bindings hand back bytes
        name="NVIDIA H200",
        bus_id="00000000:18:00.0",
        cc=(9, 0),
        total=141 * GIB,
        reserved=600 * MIB,
        used=10 * GIB,
        util_gpu=37,
        util_mem=12,
        temp_c=41,
        power_mw=123_456,
        limit_mw=700_000,
        pstate=2,
        reasons=0x4,
        ecc=3,
        processes=[(4242, 9 * GIB), (4243, None)],
    )
    src, _, _, logs = make(FakeNvml([dev]))
    r = src.poll()
    assert r.source_up and r.error is None and r.ts == 5000.0
    (s,) = r.samples
    assert s.health == "ok" and s.up and s.error is None
    assert (s.index, s.uuid, s.name, s.pci_bus_id) == (0, "GPU-abc", "NVIDIA H200", dev.bus_id)
    assert s.compute_capability == (9, 0)
    assert s.memory_used_bytes == 10 * GIB
    assert s.memory_total_bytes == 141 * GIB
    assert s.memory_reserved_bytes == 600 * MIB
    assert s.utilization_ratio == pytest.approx(0.37)
    assert s.memory_utilization_ratio == pytest.approx(0.12)
    assert s.temperature_celsius == 41.0
    assert s.power_watts == pytest.approx(123.456)
    assert s.power_limit_watts == pytest.approx(700.0)
    assert s.pstate == 2
    assert s.clock_event_reasons == 0x4
    assert s.ecc_uncorrected_total == 3
    assert [(p.pid, p.used_bytes) for p in s.processes] == [(4242, 9 * GIB), (4243, None)]
    assert s.sampled_at == 5000.0
    assert logs == []


def test_static_facts_are_read_once_per_handle() -> None:
    src, fake, _, _ = make()
    for _ in range(5):
        src.poll()
    for static in (
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetEnforcedPowerLimit",
    ):
        assert fake.count(static) == 2, static  # once per GPU
    assert fake.count("nvmlDeviceGetMemoryInfo_v2") == 10  # hot: every poll, every GPU
    assert fake.count("nvmlDeviceGetHandleByIndex") == 2


def test_memory_follows_the_device_between_polls() -> None:
    src, fake, _, _ = make(n=1)
    assert src.poll().samples[0].memory_used_bytes == 1 * GIB
    fake.devices[0].used = 7 * GIB
    fake.devices[0].processes = [(1000, 6 * GIB)]
    s = src.poll().samples[0]
    assert s.memory_used_bytes == 7 * GIB
    assert s.processes[0].used_bytes == 6 * GIB


def test_library_missing_is_a_down_source_with_one_log_line_and_backoff() -> None:
    attempts: list[float] = []
    mono = Clock(0.0)

    def loader() -> object:
        attempts.append(mono.t)
        raise ImportError("No module named 'pynvml'")

    logs: list[str] = []
    src = NvmlSource(
        clock=Clock(7.0),
        monotonic=mono,
        loader=loader,
        xid_events=False,
        backoff_initial_s=1.0,
        backoff_max_s=4.0,
        logger=logs.append,
    )
    for t in [0.0, 0.5, 0.99, 1.0, 2.0, 2.9, 3.0, 6.9, 7.0, 10.0, 11.0, 15.0]:
        mono.t = t
        r = src.poll()
        assert not r.source_up and r.samples == ()
        assert r.error is not None and "pynvml" in r.error
    # 1, 2, 4, then capped at 4
    assert attempts == [0.0, 1.0, 3.0, 7.0, 11.0, 15.0]
    assert len(logs) == 1
    assert logs[0].startswith("GPU source down: NVML Python binding not importable")
    assert "\n" not in logs[0]


def test_binding_appearing_later_brings_the_source_up() -> None:
    fake = FakeNvml(fk.devices(1))
    state = {"fail": True}

    def loader() -> object:
        if state["fail"]:
            raise ImportError("No module named 'pynvml'")
        return fake

    logs: list[str] = []
    mono = Clock(0.0)
    src = NvmlSource(monotonic=mono, loader=loader, xid_events=False, logger=logs.append)
    assert not src.poll().source_up
    state["fail"] = False
    mono.t = 1.0
    r = src.poll()
    assert r.source_up and r.samples[0].up
    assert logs[-1] == "GPU source up again: NVML sees 1 GPU(s)"


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (fk.LIBRARY_NOT_FOUND, "NVML Shared Library Not Found (NVML error 12)"),
        (fk.DRIVER_NOT_LOADED, "Driver Not Loaded (NVML error 9)"),
        (fk.NO_PERMISSION, "Insufficient Permissions (NVML error 4)"),
    ],
)
def test_init_failure_is_down_then_retried(code: int, text: str) -> None:
    src, fake, mono, logs = make(n=1)
    fake.init_error = code
    r = src.poll()
    assert not r.source_up
    assert r.error == f"NVML init failed: {text}"
    assert logs == [
        f"GPU source down: NVML init failed: {text}; retrying in 1 s (backing off to 60 s)"
    ]
    mono.t = 0.5
    src.poll()
    assert fake.init_calls == 1  # inside the backoff: no attempt
    fake.init_error = None
    mono.t = 1.0
    assert src.poll().source_up
    assert fake.init_calls == 2


def test_failure_after_init_shuts_nvml_down_again() -> None:
    fake = FakeNvml(fk.devices(2))
    fake.devices[1].fail["nvmlDeviceGetHandleByIndex"] = fk.DRIVER_NOT_LOADED
    src, _, _, _ = make(fake)
    r = src.poll()
    assert not r.source_up and "Driver Not Loaded" in (r.error or "")
    assert fake.refcount == 0 and fake.shutdown_calls == 1


def test_gpu_lost_mid_run_reads_lost_and_the_others_go_on() -> None:
    src, fake, _, _ = make(n=3)
    first = src.poll()
    assert all(s.up for s in first.samples)
    fake.devices[1].lost = True
    r = src.poll()
    assert r.source_up
    assert [s.health for s in r.samples] == ["ok", "lost", "ok"]
    lost = r.samples[1]
    assert not lost.up
    assert lost.uuid == first.samples[1].uuid  # identity kept so the lost GPU can be named
    assert lost.memory_total_bytes == 141 * GIB
    assert lost.memory_used_bytes is None and lost.processes == ()
    assert lost.error is not None and "GPU is lost (NVML error 15)" in lost.error
    assert r.samples[2].memory_used_bytes == 3 * GIB
    fake.devices[1].lost = False  # came back (e.g. after a reset)
    assert src.poll().samples[1].health == "ok"


def test_gpu_lost_before_first_read_has_no_identity_but_does_not_stop_the_rest() -> None:
    fake = FakeNvml(fk.devices(2))
    fake.devices[0].lost = True
    src, _, _, _ = make(fake)
    r = src.poll()
    assert r.source_up
    assert r.samples[0].health == "lost" and r.samples[0].uuid is None
    assert r.samples[1].up


def test_handle_refused_for_one_gpu_is_retried_each_poll() -> None:
    fake = FakeNvml(fk.devices(2))
    fake.devices[0].fail["nvmlDeviceGetHandleByIndex"] = fk.UNKNOWN
    src, _, _, _ = make(fake)
    r = src.poll()
    assert r.source_up
    assert r.samples[0].health == "error"
    assert "Unknown Error (NVML error 999)" in (r.samples[0].error or "")
    assert r.samples[1].up
    del fake.devices[0].fail["nvmlDeviceGetHandleByIndex"]
    assert src.poll().samples[0].up


def test_not_supported_fields_are_none_and_not_asked_again() -> None:
    dev = FakeDevice(
        fail={
            "nvmlDeviceGetTotalEccErrors": fk.NOT_SUPPORTED,
            "nvmlDeviceGetPowerUsage": fk.NOT_SUPPORTED,
            "nvmlDeviceGetComputeRunningProcesses": fk.NO_PERMISSION,
            "nvmlDeviceGetCudaComputeCapability": fk.NOT_SUPPORTED,
        },
        processes=[(1, 1)],
    )
    src, fake, _, _ = make(FakeNvml([dev]))
    for _ in range(3):
        s = src.poll().samples[0]
        assert s.health == "ok" and s.error is None
        assert s.ecc_uncorrected_total is None
        assert s.power_watts is None
        assert s.processes == ()
        assert s.compute_capability is None
        assert s.memory_used_bytes == dev.used  # the rest still read
    assert fake.count("nvmlDeviceGetTotalEccErrors") == 1
    assert fake.count("nvmlDeviceGetPowerUsage") == 1
    assert fake.count("nvmlDeviceGetComputeRunningProcesses") == 1


def test_transient_no_data_is_none_and_asked_again() -> None:
    dev = FakeDevice(fail={"nvmlDeviceGetUtilizationRates": fk.NO_DATA})
    src, fake, _, _ = make(FakeNvml([dev]))
    s = src.poll().samples[0]
    assert s.health == "ok" and s.utilization_ratio is None
    del dev.fail["nvmlDeviceGetUtilizationRates"]
    assert src.poll().samples[0].utilization_ratio == pytest.approx(0.37)
    assert fake.count("nvmlDeviceGetUtilizationRates") == 2


def test_unexpected_error_marks_the_gpu_error_keeps_other_fields_and_recovers() -> None:
    dev = FakeDevice(fail={"nvmlDeviceGetTemperature": fk.UNKNOWN})
    src, _, _, _ = make(FakeNvml([dev]))
    s = src.poll().samples[0]
    assert s.health == "error" and not s.up
    assert s.error == "nvmlDeviceGetTemperature: Unknown Error (NVML error 999)"
    assert s.temperature_celsius is None
    assert s.memory_used_bytes == dev.used
    del dev.fail["nvmlDeviceGetTemperature"]
    s = src.poll().samples[0]
    assert s.health == "ok" and s.temperature_celsius == 41.0


def test_transient_error_in_a_static_fact_is_read_again() -> None:
    dev = FakeDevice(fail={"nvmlDeviceGetName": fk.UNKNOWN})
    src, fake, _, _ = make(FakeNvml([dev]))
    assert src.poll().samples[0].name is None
    del dev.fail["nvmlDeviceGetName"]
    assert src.poll().samples[0].name == "NVIDIA H200"
    src.poll()
    assert fake.count("nvmlDeviceGetName") == 2


def test_memory_v1_when_v2_is_missing() -> None:
    dev = FakeDevice(memory_v2=False, used=4 * GIB, reserved=512 * MIB)
    src, fake, _, _ = make(FakeNvml([dev]))
    for _ in range(2):
        s = src.poll().samples[0]
        assert s.health == "ok"
        assert s.memory_reserved_bytes is None
        assert s.memory_used_bytes == 4 * GIB + 512 * MIB  # v1 counts the reserve as used
    assert fake.count("nvmlDeviceGetMemoryInfo_v2") == 1
    assert fake.count("nvmlDeviceGetMemoryInfo") == 2


def test_older_binding_without_newer_functions_uses_the_older_ones() -> None:
    fake = FakeNvml(
        [FakeDevice(reasons=0x20)],
        missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlEventSetWait_v2"},
    )
    src, _, _, _ = make(fake)
    s = src.poll().samples[0]
    assert s.clock_event_reasons == 0x20
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons") == 1


def test_driver_without_the_plain_temperature_call_uses_the_versioned_one() -> None:
    dev = FakeDevice(temp_c=55, fail={"nvmlDeviceGetTemperature": fk.FUNCTION_NOT_FOUND})
    src, fake, _, _ = make(FakeNvml([dev]))
    assert src.poll().samples[0].temperature_celsius == 55.0
    assert src.poll().samples[0].temperature_celsius == 55.0
    assert fake.count("nvmlDeviceGetTemperature") == 1
    assert fake.count("nvmlDeviceGetTemperatureV") == 2


def test_unknown_pstate_is_none() -> None:
    src, _, _, _ = make(FakeNvml([FakeDevice(pstate=32)]))
    assert src.poll().samples[0].pstate is None


@pytest.mark.parametrize("code", [fk.UNINITIALIZED, fk.DRIVER_NOT_LOADED])
def test_driver_reload_goes_down_and_reinitialises_with_backoff(code: int) -> None:
    src, fake, mono, logs = make(n=2)
    before = src.poll()
    assert before.source_up and fake.init_calls == 1
    fake.driver_error = code  # the driver went away under a live handle
    mono.t = 10.0
    r = src.poll()
    assert not r.source_up
    assert r.error is not None and r.error.startswith("NVML stopped answering: ")
    # known GPUs read down (up=0), keeping their identity
    assert [(s.index, s.health, s.uuid) for s in r.samples] == [
        (0, "error", before.samples[0].uuid),
        (1, "error", before.samples[1].uuid),
    ]
    assert fake.shutdown_calls == 1
    assert len(logs) == 1 and "retrying in 1 s" in logs[0]
    # driver back: nothing before the backoff ends, then a fresh init with fresh handles
    fake.driver_error = None
    fake.refcount = 0  # a reloaded driver knows nothing of the old init
    mono.t = 10.5
    assert not src.poll().source_up
    assert fake.init_calls == 1
    mono.t = 11.0
    r = src.poll()
    assert r.source_up and all(s.up for s in r.samples)
    assert fake.init_calls == 2
    assert fake.count("nvmlDeviceGetHandleByIndex") == 4
    assert logs[-1] == "GPU source up again: NVML sees 2 GPU(s)"


def test_repeated_failures_back_off_to_the_cap_and_reset_after_success() -> None:
    src, fake, mono, _ = make(n=1, backoff_initial_s=2.0, backoff_max_s=8.0)
    fake.init_error = fk.DRIVER_NOT_LOADED
    seen = []
    for t in range(0, 40):
        mono.t = float(t)
        src.poll()
        seen.append(fake.init_calls)
    starts = [t for t in range(40) if seen[t] != (seen[t - 1] if t else 0)]
    assert starts == [0, 2, 6, 14, 22, 30, 38]
    fake.init_error = None
    mono.t = 46.0
    assert src.poll().source_up
    fake.driver_error = fk.UNINITIALIZED
    mono.t = 50.0
    src.poll()
    fake.driver_error = None
    fake.refcount = 0
    mono.t = 52.0  # backoff started again from 2 s
    assert src.poll().source_up


def test_poll_seconds_comes_from_the_monotonic_clock() -> None:
    fake = FakeNvml(fk.devices(1))
    ticks = iter([0.0, 0.25, 10.0, 10.125])
    src = NvmlSource(fake, monotonic=lambda: next(ticks), xid_events=False)
    assert src.poll().poll_seconds == pytest.approx(0.25)
    assert src.poll().poll_seconds == pytest.approx(0.125)


def test_closed_source_reads_down_and_shuts_nvml_down() -> None:
    src, fake, _, _ = make(n=1)
    src.poll()
    src.close()
    assert fake.refcount == 0
    r = src.poll()
    assert not r.source_up and r.error == "GPU source closed"
    src.close()  # twice is fine


def test_default_binding_on_a_machine_without_the_driver_is_down_not_a_crash() -> None:
    """The real nvidia-ml-py binding, with no libnvidia-ml here: a clean down state."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    logs: list[str] = []
    src = NvmlSource(logger=logs.append)
    r = src.poll()
    src.close()
    assert not r.source_up and r.samples == ()
    assert r.error is not None and r.error.startswith("NVML init failed: ")
    assert "NVML error" in r.error
    assert len(logs) == 1


# -- Xid events ---------------------------------------------------------------------------------


def test_xid_events_are_reported_once_and_counted_per_gpu_and_code() -> None:
    src, fake, _, _ = make(n=3, xid=True)
    assert src.poll().xids == ()
    assert src.xid_status is None
    fake.emit(2, 79)
    fake.emit(2, 79)
    fake.emit(0, 48)
    wait_for(lambda: sum(src.xid_counts().values()) == 3, "three Xids counted", 5)
    r = src.poll()
    assert sorted((x.gpu_index, x.xid) for x in r.xids) == [(0, 48), (2, 79), (2, 79)]
    assert {x.uuid for x in r.xids if x.gpu_index == 2} == {
        "GPU-00000002-aaaa-bbbb-cccc-000000000002"
    }
    assert all(x.ts == 5000.0 for x in r.xids)
    assert src.poll().xids == ()  # handed out once
    fake.emit(2, 79)
    wait_for(lambda: src.xid_counts().get((2, 79)) == 3, "three Xid 79 on GPU 2", 5)
    assert src.xid_counts() == {(2, 79): 3, (0, 48): 1}  # counters, never reset
    src.close()
    assert fake.event_sets[0].freed
    assert not any(t.name == "loadwatch-nvml-xid" for t in threading.enumerate())


def test_xid_registration_refused_leaves_polling_working() -> None:
    fake = FakeNvml(fk.devices(2))
    fake.register_error = fk.NOT_SUPPORTED
    src, _, _, logs = make(fake, xid=True)
    r = src.poll()
    assert r.source_up and all(s.up for s in r.samples)
    assert src.xid_status == (
        "Xid events not watched: nvmlDeviceRegisterEvents: Not Supported (NVML error 3)"
    )
    assert logs == [src.xid_status]
    assert fake.event_sets[0].freed
    src.close()


def test_xid_thread_ending_on_a_driver_error_is_restarted_by_the_next_poll() -> None:
    src, fake, _, _ = make(n=1, xid=True)
    src.poll()
    fake.fail_wait(fk.UNINITIALIZED)
    wait_for(lambda: src.xid_status is not None, "the failed wait said", 5)
    assert "Uninitialized (NVML error 1)" in (src.xid_status or "")
    wait_for(
        lambda: not any(t.name == "loadwatch-nvml-xid" for t in threading.enumerate()),
        "the Xid thread ended",
        5,
    )
    src.poll()
    assert len(fake.event_sets) == 2 and fake.event_sets[0].freed
    fake.emit(0, 31)
    wait_for(lambda: src.xid_counts() == {(0, 31): 1}, "Xid 31 counted", 5)
    src.close()


def test_xid_wait_error_other_than_timeout_does_not_spin() -> None:
    src, fake, _, _ = make(n=1, xid=True)
    src.poll()
    waits = fake.count("nvmlEventSetWait_v2")
    fake.fail_wait(fk.UNKNOWN)
    wait_for(lambda: src.xid_status is not None, "the failed wait said", 5)
    time.sleep(0.1)  # (real: the calls the thread makes in wall time are what is counted)
    # 20 ms waits: a pause after the error, then back to timeouts; no busy loop
    assert fake.count("nvmlEventSetWait_v2") - waits < 15
    fake.emit(0, 13)
    wait_for(lambda: src.xid_counts() == {(0, 13): 1}, "Xid 13 counted", 5)
    wait_for(lambda: src.xid_status is None, "the Xid status clear again", 5)
    src.close()


def test_xids_survive_the_source_going_down() -> None:
    src, fake, _, _ = make(n=1, xid=True)
    src.poll()
    fake.emit(0, 79)
    wait_for(lambda: src.xid_counts() == {(0, 79): 1}, "Xid 79 counted", 5)
    fake.driver_error = fk.UNINITIALIZED
    r: GpuReading = src.poll()
    assert not r.source_up
    assert [(x.gpu_index, x.xid) for x in r.xids] == [(0, 79)]


def test_close_while_a_poll_hangs_returns_and_stops_the_xid_thread() -> None:
    release = threading.Event()
    fake = FakeNvml(fk.devices(1))
    src, _, _, _ = make(fake, xid=True)
    src.poll()
    fake.devices[0].hang = release
    poller = threading.Thread(target=src.poll, daemon=True)
    poller.start()
    wait_for(lambda: fake.count("nvmlDeviceGetMemoryInfo_v2") == 2, "the second poll under way", 5)
    t0 = time.monotonic()
    src.close()
    assert time.monotonic() - t0 < 3.0
    assert not any(t.name == "loadwatch-nvml-xid" for t in threading.enumerate())
    release.set()
    poller.join(timeout=5)


def test_bare_and_careful_paths_read_the_same_sample() -> None:
    fake = FakeNvml(
        [FakeDevice(reasons=0x40, processes=[(5, 7 * GIB)])], missing={"nvmlDeviceGetTemperature"}
    )
    src, _, _, _ = make(fake)
    first = src.poll().samples[0]  # careful: finds out what this GPU answers
    second = src.poll().samples[0]  # bare: the bound calls that answered
    assert first == second
    assert second.temperature_celsius == 41.0  # via the versioned call
    assert fake.count("nvmlDeviceGetTemperatureV") == 2


@pytest.mark.parametrize(
    ("code", "health", "asked_again"),
    [(fk.NOT_SUPPORTED, "ok", False), (fk.NO_DATA, "ok", True), (fk.UNKNOWN, "error", True)],
)
def test_a_fault_after_clean_polls_is_sorted_out_as_on_a_first_poll(
    code: int, health: str, asked_again: bool
) -> None:
    dev = FakeDevice()
    src, fake, _, _ = make(FakeNvml([dev]))
    src.poll()
    src.poll()
    dev.fail["nvmlDeviceGetPowerUsage"] = code
    s = src.poll().samples[0]
    assert s.health == health and s.power_watts is None
    assert s.memory_used_bytes == dev.used and s.temperature_celsius == 41.0
    del dev.fail["nvmlDeviceGetPowerUsage"]
    before = fake.count("nvmlDeviceGetPowerUsage")
    s = src.poll().samples[0]
    assert s.health == "ok"
    assert (s.power_watts is not None) == asked_again
    assert (fake.count("nvmlDeviceGetPowerUsage") > before) == asked_again


def test_a_driver_that_falls_over_right_after_init_keeps_backing_off() -> None:
    fake = FakeNvml(fk.devices(1))
    fake.devices[0].fail["nvmlDeviceGetUUID"] = fk.UNINITIALIZED  # init works, every poll fails
    src, _, mono, logs = make(fake)
    attempts = []
    for t in range(0, 20):
        mono.t = float(t)
        before = fake.init_calls
        src.poll()
        if fake.init_calls != before:
            attempts.append(t)
        fake.refcount = 0
    assert attempts == [0, 1, 3, 7, 15]
    assert len(logs) == 1  # the same fault: one line, not one per attempt


def test_process_list_is_reread_when_memory_moves_or_every_few_polls() -> None:
    from loadwatch.daemon.sources.gpu.nvml import PROCS_EVERY_POLLS

    src, fake, _, _ = make(n=1)
    dev = fake.devices[0]
    dev.processes = [(1000, 1 * GIB)]
    src.poll()  # careful path: reads the list
    base = fake.count("nvmlDeviceGetComputeRunningProcesses")
    for _ in range(PROCS_EVERY_POLLS):  # bare path from here on
        assert src.poll().samples[0].processes[0].used_bytes == 1 * GIB
    assert fake.count("nvmlDeviceGetComputeRunningProcesses") == base  # memory still: reused
    src.poll()
    assert fake.count("nvmlDeviceGetComputeRunningProcesses") == base + 1  # aged out: read again
    dev.used += 2 * GIB
    dev.processes = [(1000, 3 * GIB), (2000, 1 * GIB)]
    s = src.poll().samples[0]  # memory moved: read at once, not a few polls later
    assert [(p.pid, p.used_bytes) for p in s.processes] == [(1000, 3 * GIB), (2000, 1 * GIB)]
