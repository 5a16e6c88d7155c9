"""A small hand-written stand-in for the ``pynvml`` functions ``NvmlSource`` calls.

It keeps state (devices, initialisation, event sets) rather than scripting call sequences: a test
sets a device's memory or marks it lost, and the fake answers as NVML would. Error codes are
NVML's own numbers.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

ERROR_STRINGS = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    18: "RM has detected an NVML/RM version mismatch.",
    21: "No data",
    999: "Unknown Error",
}

UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
DRIVER_NOT_LOADED = 9
TIMEOUT = 10
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
NO_DATA = 21
UNKNOWN = 999

GIB = 1 << 30
MIB = 1 << 20


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


@dataclass(frozen=True)
class Handle:
    index: int


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class MemoryV2:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass
class Utilization:
    gpu: int
    memory: int


@dataclass
class PciInfo:
    busId: str


@dataclass
class ProcessInfo:
    pid: int
    usedGpuMemory: int | None


@dataclass
class EventData:
    device: Handle
    eventType: int
    eventData: int


@dataclass
class FakeDevice:
    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    name: str | bytes = "NVIDIA H200"
    bus_id: str = "00000000:18:00.0"
    cc: tuple[int, int] = (9, 0)
    total: int = 141 * GIB
    reserved: int = 512 * MIB
    used: int = 1 * GIB
    util_gpu: int = 37
    util_mem: int = 12
    temp_c: int = 41
    power_mw: int = 123_456
    limit_mw: int = 700_000
    pstate: int = 0
    reasons: int = 0x4
    ecc: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    memory_v2: bool = True
    lost: bool = False
    fail: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    hang: threading.Event | None = None  # calls block until it is set


class EventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue[EventData | int] = queue.Queue()
        self.devices: set[int] = set()
        self.freed = False


class FakeNvml:
    """Module-like: ``NvmlSource(nvml=FakeNvml(...))``."""

    NVMLError = NVMLError

    def __init__(self, devices: list[FakeDevice], *, missing: set[str] | None = None) -> None:
        self.devices = devices
        self.missing = set(missing or ())  # functions this "binding" does not have
        self.init_error: int | None = None
        self.driver_error: int | None = None  # every device call fails so (driver went away)
        self.refcount = 0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: dict[str, int] = {}
        self.event_sets: list[EventSet] = []
        self.register_error: int | None = None
        self.migs: dict[str, int] = {}  # MIG device UUID -> the index of the GPU it is a slice of
        self._lock = threading.Lock()

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- helpers for tests --------------------------------------------------------------------

    def emit(self, index: int, xid: int) -> None:
        for es in self.event_sets:
            if index in es.devices:
                es.queue.put(EventData(device=Handle(index), eventType=0x8, eventData=xid))

    def fail_wait(self, code: int) -> None:
        for es in self.event_sets:
            es.queue.put(code)

    def count(self, name: str) -> int:
        return self.calls.get(name, 0)

    def _enter(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        if self.driver_error is not None:
            raise NVMLError(self.driver_error)
        if self.refcount <= 0:
            raise NVMLError(UNINITIALIZED)

    def _dev(self, name: str, handle: Handle) -> FakeDevice:
        self._enter(name)
        dev = self.devices[handle.index]
        if dev.hang is not None:
            dev.hang.wait(timeout=30)
        if dev.lost:
            raise NVMLError(GPU_IS_LOST)
        if name in dev.fail:
            raise NVMLError(dev.fail[name])
        return dev

    # -- the pynvml surface -------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        if self.refcount <= 0:
            raise NVMLError(UNINITIALIZED)
        self.refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        dev = self.devices[index]
        code = dev.fail.get("nvmlDeviceGetHandleByIndex")
        if code is not None:
            raise NVMLError(code)
        if dev.lost:
            raise NVMLError(GPU_IS_LOST)
        return Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        self._enter("nvmlDeviceGetHandleByUUID")
        if uuid in self.migs:
            return Handle(-1 - self.migs[uuid])  # a MIG device's handle: not a GPU's index
        for i, dev in enumerate(self.devices):
            if dev.uuid == uuid:
                return Handle(i)
        raise NVMLError(NOT_FOUND)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Handle) -> Handle:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if handle.index >= 0:
            raise NVMLError(INVALID_ARGUMENT)  # not a MIG device
        return Handle(-1 - handle.index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetUUID(self, handle: Handle) -> str | bytes:
        return self._dev("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str | bytes:
        return self._dev("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> PciInfo:
        return PciInfo(busId=self._dev("nvmlDeviceGetPciInfo", handle).bus_id)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Handle) -> tuple[int, int]:
        return self._dev("nvmlDeviceGetCudaComputeCapability", handle).cc

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", handle).limit_mw

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        if version is None:
            d = self._dev("nvmlDeviceGetMemoryInfo", handle)
            return Memory(
                total=d.total, free=d.total - d.used - d.reserved, used=d.used + d.reserved
            )
        d = self._dev("nvmlDeviceGetMemoryInfo_v2", handle)
        if not d.memory_v2:
            raise NVMLError(FUNCTION_NOT_FOUND)
        assert version == 0x02000028, version
        return MemoryV2(
            version=version,
            total=d.total,
            reserved=d.reserved,
            free=d.total - d.used - d.reserved,
            used=d.used,
        )

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Utilization:
        d = self._dev("nvmlDeviceGetUtilizationRates", handle)
        return Utilization(gpu=d.util_gpu, memory=d.util_mem)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == 0
        return self._dev("nvmlDeviceGetTemperature", handle).temp_c

    def nvmlDeviceGetTemperatureV(self, handle: Handle, sensor: int) -> int:
        assert sensor == 0
        return self._dev("nvmlDeviceGetTemperatureV", handle).temp_c

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._dev("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetPerformanceState(self, handle: Handle) -> int:
        return self._dev("nvmlDeviceGetPerformanceState", handle).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", handle).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        return self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", handle).reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)
        return self._dev("nvmlDeviceGetTotalEccErrors", handle).ecc

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[ProcessInfo]:
        d = self._dev("nvmlDeviceGetComputeRunningProcesses", handle)
        return [ProcessInfo(pid=pid, usedGpuMemory=used) for pid, used in d.processes]

    def nvmlEventSetCreate(self) -> EventSet:
        self._enter("nvmlEventSetCreate")
        es = EventSet()
        self.event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, es: EventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        assert types == 0x8
        if self.register_error is not None:
            raise NVMLError(self.register_error)
        es.devices.add(handle.index)

    def nvmlEventSetWait_v2(self, es: EventSet, timeout_ms: int) -> EventData:
        with self._lock:
            self.calls["nvmlEventSetWait_v2"] = self.calls.get("nvmlEventSetWait_v2", 0) + 1
        try:
            item = es.queue.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise NVMLError(TIMEOUT) from None
        if isinstance(item, int):
            raise NVMLError(item)
        return item

    def nvmlEventSetFree(self, es: EventSet) -> None:
        es.freed = True


def devices(n: int) -> list[FakeDevice]:
    """``n`` healthy H200-like devices with distinct identities."""
    return [
        FakeDevice(
            uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}",
            bus_id=f"00000000:{0x18 + i:02X}:00.0",
            used=(i + 1) * GIB,
            processes=[(1000 + i, (i + 1) * GIB)],
        )
        for i in range(n)
    ]
