"""One GPU as NVML answers for it: its handle, the facts read once, and the hot fields read each
poll, every call through `Device.call`, which turns NVML errors into "not available" (None)
plus this GPU's health, and raises only for a lost GPU or a library that went away."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadwatch.daemon.sources.gpu.nvml_abi import (
    HOT_FIELDS,
    LOST,
    NEVER,
    NOT_NOW,
    PROCS_EVERY_POLLS,
    PROCS_MOVE_BYTES,
    PSTATE_UNKNOWN,
    REINIT,
    GpuLost,
    Reinit,
    describe,
    text,
)
from loadwatch.daemon.sources.inputs import GpuHealth, GpuProcess, GpuSample


@dataclass(slots=True)
class Static:
    """Facts that do not change while a device handle lives."""

    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    power_limit_watts: float | None = None
    memory_total_bytes: int | None = None


@dataclass(slots=True)
class Gpu:
    index: int
    handle: Any = None
    static: Static | None = None
    never: set[str] = field(default_factory=set)  # calls that answered "not supported"
    errors: list[str] = field(default_factory=list)  # this poll's unexpected failures
    last_static: Static = field(default_factory=Static)
    plan: list[Callable[[], Any] | None] | None = None  # the hot calls, bound; see _read_careful
    procs: Any = None  # the last process list read, and the memory in use when it was read
    procs_used: int | None = None
    procs_age: int = 0  # polls since it was read


class Device:
    """Reads GPUs through one NVML binding (pynvml, or a stand-in with its functions)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml

    def call(self, gpu: Gpu, key: str, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``nvml.<fn_name>``; NVML faults become ``None`` plus this GPU's health.

        Raises ``GpuLost`` (this GPU is gone) or ``Reinit`` (the library or driver is).
        """
        if key in gpu.never:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:  # an older binding without this function
            gpu.never.add(key)
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if not isinstance(code, int):
                if isinstance(exc, TypeError | AttributeError):
                    gpu.never.add(key)  # a binding that cannot take these arguments
                    return None
                gpu.errors.append(f"{fn_name}: {describe(exc)}")
                return None
            if code in NEVER:
                gpu.never.add(key)
                return None
            if code in NOT_NOW:
                return None
            if code in LOST:
                raise GpuLost(f"{fn_name}: {describe(exc)}") from None
            if code in REINIT:
                raise Reinit(f"{fn_name}: {describe(exc)}") from None
            gpu.errors.append(f"{fn_name}: {describe(exc)}")
            return None

    def sample(self, gpu: Gpu, now: float) -> GpuSample:
        gpu.errors.clear()
        try:
            if gpu.handle is None:
                gpu.handle = self.call(gpu, "handle", "nvmlDeviceGetHandleByIndex", gpu.index)
                if gpu.handle is None:
                    if not gpu.errors:
                        gpu.errors.append("nvmlDeviceGetHandleByIndex: no handle for this GPU")
                    return self._failed(gpu, now, "error")
            static = gpu.static if gpu.static is not None else self._read_static(gpu)
            return self._read_hot(gpu, static, now)
        except GpuLost as exc:
            gpu.errors.append(str(exc))
            return self._failed(gpu, now, "lost")

    def _failed(self, gpu: Gpu, now: float, health: GpuHealth) -> GpuSample:
        st = gpu.last_static
        return GpuSample(
            index=gpu.index,
            health=health,
            uuid=st.uuid,
            name=st.name,
            pci_bus_id=st.pci_bus_id,
            compute_capability=st.compute_capability,
            memory_total_bytes=st.memory_total_bytes,
            power_limit_watts=st.power_limit_watts,
            sampled_at=now,
            error="; ".join(gpu.errors) or health,
        )

    def _read_static(self, gpu: Gpu) -> Static:
        h = gpu.handle
        pci = self.call(gpu, "pci", "nvmlDeviceGetPciInfo", h)
        cc = self.call(gpu, "cc", "nvmlDeviceGetCudaComputeCapability", h)
        limit_mw = self.call(gpu, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        static = Static(
            uuid=text(self.call(gpu, "uuid", "nvmlDeviceGetUUID", h)),
            name=text(self.call(gpu, "name", "nvmlDeviceGetName", h)),
            pci_bus_id=text(getattr(pci, "busId", None)) if pci is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            power_limit_watts=limit_mw / 1000.0 if limit_mw is not None else None,
            memory_total_bytes=gpu.last_static.memory_total_bytes,
        )
        gpu.last_static = static
        if not gpu.errors:  # a transient failure is read again next poll, not cached as absent
            gpu.static = static
        return static

    def _read_hot(self, gpu: Gpu, st: Static, now: float) -> GpuSample:
        values: list[Any] | None = None
        if gpu.plan is not None:
            # Every call answered last time: run them bare. Any fault at all drops to the
            # careful path, which makes the same calls again one by one and sorts the fault out.
            try:
                values = [None if f is None else f() for f in gpu.plan[:-1]]
                values.append(self._processes_bare(gpu, values[0], gpu.plan[-1]))
            except Exception:
                gpu.plan = None
        if values is None:
            values = self._read_careful(gpu)
            gpu.procs, gpu.procs_age = values[-1], 0
            gpu.procs_used = int(values[0].used) if values[0] is not None else None
        mem, util, temp, power_mw, pstate, reasons, ecc, procs = values
        if mem is not None and st.memory_total_bytes is None:
            st.memory_total_bytes = int(mem.total)
        reserved = getattr(mem, "reserved", None)  # only the v2 structure has it
        return GpuSample(
            index=gpu.index,
            health="error" if gpu.errors else "ok",
            uuid=st.uuid,
            name=st.name,
            pci_bus_id=st.pci_bus_id,
            compute_capability=st.compute_capability,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=st.memory_total_bytes,
            memory_reserved_bytes=int(reserved) if reserved is not None else None,
            utilization_ratio=util.gpu / 100.0 if util is not None else None,
            memory_utilization_ratio=util.memory / 100.0 if util is not None else None,
            temperature_celsius=float(temp) if temp is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            power_limit_watts=st.power_limit_watts,
            pstate=pstate if pstate is not None and pstate != PSTATE_UNKNOWN else None,
            clock_event_reasons=int(reasons) if reasons is not None else None,
            ecc_uncorrected_total=int(ecc) if ecc is not None else None,
            processes=processes(procs),
            sampled_at=now,
            error="; ".join(gpu.errors) if gpu.errors else None,
        )

    @staticmethod
    def _processes_bare(gpu: Gpu, mem: Any, call: Callable[[], Any] | None) -> Any:
        """The process list costs more than every other hot call together (about 35 us of a
        45 us poll on an H200), and it only changes when memory does: read it again when the
        memory in use moved, or every few polls, and reuse it otherwise."""
        used = int(mem.used) if mem is not None else None
        moved = (
            used is None or gpu.procs_used is None or abs(used - gpu.procs_used) >= PROCS_MOVE_BYTES
        )
        if call is not None and (moved or gpu.procs_age >= PROCS_EVERY_POLLS):
            gpu.procs, gpu.procs_used, gpu.procs_age = call(), used, 0
        else:
            gpu.procs_age += 1
        return gpu.procs

    def _read_careful(self, gpu: Gpu) -> list[Any]:
        """Each hot field through ``_call``, trying older equivalents where the newer is absent.

        When every field answered (or is known absent), leaves ``gpu.plan``: the calls that
        answered, bound to this handle, for the next polls to run bare.
        """
        h = gpu.handle
        values: list[Any] = []
        plan: list[Callable[[], Any] | None] = []
        clean = True
        for alternatives in HOT_FIELDS:
            value: Any = None
            bound: Callable[[], Any] | None = None
            for key, fn_name, args, kwargs in alternatives:
                if key in gpu.never:
                    continue
                value = self.call(gpu, key, fn_name, h, *args, **kwargs)
                if value is not None:
                    bound = functools.partial(getattr(self._nvml, fn_name), h, *args, **kwargs)
                    break
                if key not in gpu.never:
                    clean = False  # failed for now; not a reason to try the older call
                    break
            values.append(value)
            plan.append(bound)
        gpu.plan = plan if clean and not gpu.errors else None
        return values


def processes(procs: Any) -> tuple[GpuProcess, ...]:
    if not procs:
        return ()
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(pid=int(p.pid), used_bytes=int(used) if used is not None else None))
    return tuple(out)
