"""The NVML GPU source: the one module that imports ``pynvml`` (from ``nvidia-ml-py``).

Every NVML call goes through ``NvmlSource._call``, which turns NVML errors into "not available"
(``None``) and a per-GPU health: a lost GPU reads ``lost`` and the others go on; an error that
means the library or driver went away takes the whole source down and re-initialises NVML with
backoff. Static facts are read once per device handle. Xid critical errors arrive through an NVML
event set on a thread of their own and are handed out with the next reading.

This module does not guard against a call that hangs; ``loadwatch.daemon.sources.gpu.guard.GuardedGpuSource``
does, around it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from loadwatch.daemon.sources.inputs import GpuHealth, GpuProcess, GpuReading, GpuSample, XidEvent

# NVML return codes and constants, from nvml.h: part of the library's ABI, stable across drivers.
ERROR_UNINITIALIZED: Final = 1
ERROR_INVALID_ARGUMENT: Final = 2
ERROR_NOT_SUPPORTED: Final = 3
ERROR_NO_PERMISSION: Final = 4
ERROR_NOT_FOUND: Final = 6
ERROR_DRIVER_NOT_LOADED: Final = 9
ERROR_TIMEOUT: Final = 10
ERROR_LIBRARY_NOT_FOUND: Final = 12
ERROR_FUNCTION_NOT_FOUND: Final = 13
ERROR_GPU_IS_LOST: Final = 15
ERROR_RESET_REQUIRED: Final = 16
ERROR_LIB_RM_VERSION_MISMATCH: Final = 18
ERROR_NO_DATA: Final = 21
ERROR_ARGUMENT_VERSION_MISMATCH: Final = 25
ERROR_DEPRECATED: Final = 26
ERROR_NOT_READY: Final = 27
ERROR_GPU_NOT_FOUND: Final = 28
ERROR_UNKNOWN: Final = 999

TEMPERATURE_GPU: Final = 0
MEMORY_ERROR_TYPE_UNCORRECTED: Final = 1
VOLATILE_ECC: Final = 0
MEMORY_INFO_V2: Final = 0x02000028  # nvmlMemory_v2: sizeof(nvmlMemory_v2_t) | 2 << 24
EVENT_TYPE_XID_CRITICAL_ERROR: Final = 0x8
PSTATE_UNKNOWN: Final = 32

# The field is not there on this GPU, driver or binding, and will not be: stop asking.
_NEVER: Final = frozenset(
    {
        ERROR_NOT_SUPPORTED,
        ERROR_NO_PERMISSION,
        ERROR_FUNCTION_NOT_FOUND,
        ERROR_ARGUMENT_VERSION_MISMATCH,
        ERROR_DEPRECATED,
        ERROR_INVALID_ARGUMENT,
    }
)
# Not available just now; ask again next poll, health unaffected.
_NOT_NOW: Final = frozenset({ERROR_NO_DATA, ERROR_NOT_READY, ERROR_NOT_FOUND})
_LOST: Final = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED, ERROR_GPU_NOT_FOUND})
# The library or driver went away (driver reload, unload, version mismatch): start over.
_REINIT: Final = frozenset(
    {
        ERROR_UNINITIALIZED,
        ERROR_DRIVER_NOT_LOADED,
        ERROR_LIB_RM_VERSION_MISMATCH,
        ERROR_LIBRARY_NOT_FOUND,
    }
)

_Alt = tuple[str, str, tuple[Any, ...], dict[str, Any]]  # key, function, args after handle, kwargs
# What one poll reads per GPU, in the order _read_hot unpacks it; equivalents newest-first,
# except temperature, where the plain call is cheaper and stays until drivers drop it.
_HOT_FIELDS: Final[tuple[tuple[_Alt, ...], ...]] = (
    (
        ("mem2", "nvmlDeviceGetMemoryInfo", (), {"version": MEMORY_INFO_V2}),
        ("mem1", "nvmlDeviceGetMemoryInfo", (), {}),
    ),
    (("util", "nvmlDeviceGetUtilizationRates", (), {}),),
    (
        ("temp", "nvmlDeviceGetTemperature", (TEMPERATURE_GPU,), {}),
        ("tempv", "nvmlDeviceGetTemperatureV", (TEMPERATURE_GPU,), {}),
    ),
    (("power", "nvmlDeviceGetPowerUsage", (), {}),),
    (("pstate", "nvmlDeviceGetPerformanceState", (), {}),),
    (
        ("reasons", "nvmlDeviceGetCurrentClocksEventReasons", (), {}),
        ("throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", (), {}),
    ),
    (
        (
            "ecc",
            "nvmlDeviceGetTotalEccErrors",
            (MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC),
            {},
        ),
    ),
    (("procs", "nvmlDeviceGetComputeRunningProcesses", (), {}),),
)

# The process list is read again when device memory moved by this much, or after this many polls.
PROCS_MOVE_BYTES: Final = 16 << 20
PROCS_EVERY_POLLS: Final = 5

log = logging.getLogger("loadwatch.gpu")


def _import_pynvml() -> Any:
    return importlib.import_module("pynvml")


class _GpuLost(Exception):
    pass


class _Reinit(Exception):
    pass


@dataclass(slots=True)
class _Static:
    """Facts that do not change while a device handle lives."""

    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    power_limit_watts: float | None = None
    memory_total_bytes: int | None = None


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any = None
    static: _Static | None = None
    never: set[str] = field(default_factory=set)  # calls that answered "not supported"
    errors: list[str] = field(default_factory=list)  # this poll's unexpected failures
    last_static: _Static = field(default_factory=_Static)
    plan: list[Callable[[], Any] | None] | None = None  # the hot calls, bound; see _read_careful
    procs: Any = None  # the last process list read, and the memory in use when it was read
    procs_used: int | None = None
    procs_age: int = 0  # polls since it was read


def describe(exc: BaseException) -> str:
    """One line for an NVML error (or any other exception from the binding)."""
    code = getattr(exc, "value", None)
    try:
        text = " ".join(str(exc).split())
    except Exception:
        text = ""
    if isinstance(code, int):
        return f"{text or 'NVML error'} (NVML error {code})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class NvmlSource:
    """Polls every GPU NVML can see; ``poll()`` never raises for NVML faults.

    ``nvml`` is a module-like object with pynvml's functions (default: ``pynvml``, imported on the
    first poll so that a missing binding is a down source, not an import error).
    """

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        loader: Callable[[], Any] = _import_pynvml,
        xid_events: bool = True,
        xid_wait_ms: int = 500,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        logger: Callable[[str], None] | None = None,
    ) -> None:
        self._nvml: Any = nvml
        self._clock = clock
        self._monotonic = monotonic
        self._loader = loader
        self._xid_enabled = xid_events
        self._xid_wait_ms = xid_wait_ms
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._log = logger if logger is not None else log.warning
        self._lock = threading.Lock()  # one poll at a time; close() waits for it briefly
        self._up = False
        self._initialized = False
        self._closed = False
        self._gpus: list[_Gpu] = []
        self._error: str | None = "not initialised yet"
        self._backoff_s = backoff_initial_s
        self._next_attempt = float("-inf")
        self._logged_error: str | None = None
        self._init_attempts = 0
        self._xid_lock = threading.Lock()
        self._xid_pending: list[XidEvent] = []
        self._xid_counts: dict[tuple[int, int], int] = {}
        self._xid_thread: threading.Thread | None = None
        self._xid_stop: threading.Event | None = None
        self._xid_set: Any = None
        self._xid_status: str | None = None

    # -- public -------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self._up

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def init_attempts(self) -> int:
        return self._init_attempts

    @property
    def xid_status(self) -> str | None:
        """``None`` while Xid events are watched; otherwise one line saying why not."""
        return self._xid_status

    def poll(self) -> GpuReading:
        with self._lock:
            start = self._monotonic()
            now = self._clock()
            if self._closed:
                return self._down(now, start, "GPU source closed")
            if not self._up and not self._try_init(start):
                return self._down(now, start, self._error)
            try:
                samples = tuple([self._sample(gpu, now) for gpu in self._gpus])
            except _Reinit as exc:
                self._go_down(str(exc), start)
                return self._down(now, start, self._error)
            # Only a poll that got through resets the backoff: a driver that comes up and falls
            # over again at once keeps backing off instead of flapping every second.
            self._backoff_s = self._backoff_initial_s
            if self._logged_error is not None:
                self._log(f"GPU source up again: NVML sees {len(self._gpus)} GPU(s)")
                self._logged_error = None
            thread = self._xid_thread
            if thread is not None and not thread.is_alive():
                self._stop_xid()  # the Xid thread ended on an error: free its set, start anew
                self._start_xid()
            return GpuReading(
                ts=now,
                samples=samples,
                xids=self.drain_xids(),
                source_up=True,
                poll_seconds=self._monotonic() - start,
            )

    def drain_xids(self) -> tuple[XidEvent, ...]:
        """Xid events received since the last reading (also safe while a poll is hung)."""
        with self._xid_lock:
            if not self._xid_pending:
                return ()
            events = tuple(self._xid_pending)
            self._xid_pending.clear()
            return events

    def parent_uuid(self, mig_uuid: str) -> str | None:
        """The UUID of the GPU a MIG device is a slice of; None while NVML does not answer."""
        with self._lock:
            if not self._up:
                return None
            nv = self._nvml
            try:
                mig = nv.nvmlDeviceGetHandleByUUID(mig_uuid)
                parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
                return _text(nv.nvmlDeviceGetUUID(parent))
            except Exception:
                return None

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """Xid events seen since start, by (GPU index, Xid code); never reset."""
        with self._xid_lock:
            return dict(self._xid_counts)

    def close(self) -> None:
        # A poll hung in the driver holds the lock; then only stop the Xid thread and leave.
        got = self._lock.acquire(timeout=1.0)
        try:
            self._closed = True
            self._teardown(shutdown=got)
        finally:
            if got:
                self._lock.release()

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- init, backoff, teardown --------------------------------------------------------------

    def _try_init(self, now_mono: float) -> bool:
        if now_mono < self._next_attempt:
            return False
        self._init_attempts += 1
        if self._nvml is None:
            try:
                self._nvml = self._loader()
            except Exception as exc:  # ImportError, or a binding that fails to load
                self._fail(f"NVML Python binding not importable: {describe(exc)}", now_mono)
                return False
        nv = self._nvml
        try:
            nv.nvmlInit()
            self._initialized = True
            count = int(nv.nvmlDeviceGetCount())
            gpus = [self._open_gpu(i) for i in range(count)]
        except (_Reinit, _GpuLost) as exc:
            self._teardown(shutdown=True)
            self._fail(f"NVML init failed: {exc}", now_mono)
            return False
        except Exception as exc:
            self._teardown(shutdown=True)
            self._fail(f"NVML init failed: {describe(exc)}", now_mono)
            return False
        self._gpus = gpus
        self._up = True
        self._error = None
        if self._xid_enabled:
            self._start_xid()
        return True

    def _open_gpu(self, index: int) -> _Gpu:
        gpu = _Gpu(index)
        try:
            gpu.handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code in _REINIT:
                raise _Reinit(describe(exc)) from None
            # Lost or refused: this GPU reads down and is retried each poll; the others go on.
            gpu.errors.append(f"nvmlDeviceGetHandleByIndex: {describe(exc)}")
        return gpu

    def _fail(self, error: str, now_mono: float) -> None:
        self._up = False
        self._error = error
        self._next_attempt = now_mono + self._backoff_s
        if error != self._logged_error:
            self._log(
                f"GPU source down: {error}; retrying in {self._backoff_s:g} s "
                f"(backing off to {self._backoff_max_s:g} s)"
            )
            self._logged_error = error
        self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)

    def _go_down(self, error: str, now_mono: float) -> None:
        self._teardown(shutdown=True)
        self._fail(f"NVML stopped answering: {error}", now_mono)

    def _teardown(self, *, shutdown: bool) -> None:
        self._stop_xid()
        if shutdown and self._initialized and self._nvml is not None:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass  # the driver is already gone; nothing to release
        self._up = False

    def _down(self, now: float, start: float, error: str | None) -> GpuReading:
        # GPUs known before the fault read as errored, so each one's up goes to 0.
        err = error or "GPU source down"
        samples = tuple(
            GpuSample(
                index=g.index,
                health="error",
                uuid=g.last_static.uuid,
                name=g.last_static.name,
                pci_bus_id=g.last_static.pci_bus_id,
                compute_capability=g.last_static.compute_capability,
                memory_total_bytes=g.last_static.memory_total_bytes,
                power_limit_watts=g.last_static.power_limit_watts,
                sampled_at=now,
                error=err,
            )
            for g in self._gpus
        )
        return GpuReading(
            ts=now,
            samples=samples,
            xids=self.drain_xids(),
            source_up=False,
            error=err,
            poll_seconds=self._monotonic() - start,
        )

    # -- the one wrapper ----------------------------------------------------------------------

    def _call(self, gpu: _Gpu, key: str, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``nvml.<fn_name>``; NVML faults become ``None`` plus this GPU's health.

        Raises ``_GpuLost`` (this GPU is gone) or ``_Reinit`` (the library or driver is).
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
            if code in _NEVER:
                gpu.never.add(key)
                return None
            if code in _NOT_NOW:
                return None
            if code in _LOST:
                raise _GpuLost(f"{fn_name}: {describe(exc)}") from None
            if code in _REINIT:
                raise _Reinit(f"{fn_name}: {describe(exc)}") from None
            gpu.errors.append(f"{fn_name}: {describe(exc)}")
            return None

    # -- one GPU ------------------------------------------------------------------------------

    def _sample(self, gpu: _Gpu, now: float) -> GpuSample:
        gpu.errors.clear()
        try:
            if gpu.handle is None:
                gpu.handle = self._call(gpu, "handle", "nvmlDeviceGetHandleByIndex", gpu.index)
                if gpu.handle is None:
                    if not gpu.errors:
                        gpu.errors.append("nvmlDeviceGetHandleByIndex: no handle for this GPU")
                    return self._failed(gpu, now, "error")
            static = gpu.static if gpu.static is not None else self._read_static(gpu)
            return self._read_hot(gpu, static, now)
        except _GpuLost as exc:
            gpu.errors.append(str(exc))
            return self._failed(gpu, now, "lost")

    def _failed(self, gpu: _Gpu, now: float, health: GpuHealth) -> GpuSample:
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

    def _read_static(self, gpu: _Gpu) -> _Static:
        h = gpu.handle
        pci = self._call(gpu, "pci", "nvmlDeviceGetPciInfo", h)
        cc = self._call(gpu, "cc", "nvmlDeviceGetCudaComputeCapability", h)
        limit_mw = self._call(gpu, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
        static = _Static(
            uuid=_text(self._call(gpu, "uuid", "nvmlDeviceGetUUID", h)),
            name=_text(self._call(gpu, "name", "nvmlDeviceGetName", h)),
            pci_bus_id=_text(getattr(pci, "busId", None)) if pci is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            power_limit_watts=limit_mw / 1000.0 if limit_mw is not None else None,
            memory_total_bytes=gpu.last_static.memory_total_bytes,
        )
        gpu.last_static = static
        if not gpu.errors:  # a transient failure is read again next poll, not cached as absent
            gpu.static = static
        return static

    def _read_hot(self, gpu: _Gpu, st: _Static, now: float) -> GpuSample:
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
            processes=_processes(procs),
            sampled_at=now,
            error="; ".join(gpu.errors) if gpu.errors else None,
        )

    @staticmethod
    def _processes_bare(gpu: _Gpu, mem: Any, call: Callable[[], Any] | None) -> Any:
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

    def _read_careful(self, gpu: _Gpu) -> list[Any]:
        """Each hot field through ``_call``, trying older equivalents where the newer is absent.

        When every field answered (or is known absent), leaves ``gpu.plan``: the calls that
        answered, bound to this handle, for the next polls to run bare.
        """
        h = gpu.handle
        values: list[Any] = []
        plan: list[Callable[[], Any] | None] = []
        clean = True
        for alternatives in _HOT_FIELDS:
            value: Any = None
            bound: Callable[[], Any] | None = None
            for key, fn_name, args, kwargs in alternatives:
                if key in gpu.never:
                    continue
                value = self._call(gpu, key, fn_name, h, *args, **kwargs)
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

    # -- Xid events ---------------------------------------------------------------------------

    def _start_xid(self) -> None:
        nv = self._nvml
        try:
            event_set = nv.nvmlEventSetCreate()
        except Exception as exc:
            self._xid_off(f"Xid events not watched: nvmlEventSetCreate: {describe(exc)}")
            return
        registered = 0
        last_error = "no GPUs"
        for gpu in self._gpus:
            if gpu.handle is None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(gpu.handle, EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
                registered += 1
            except Exception as exc:
                last_error = f"nvmlDeviceRegisterEvents: {describe(exc)}"
        if registered == 0:
            _free_quietly(nv, event_set)
            self._xid_off(f"Xid events not watched: {last_error}")
            return
        self._xid_status = None
        stop = threading.Event()
        thread = threading.Thread(
            target=self._xid_loop,
            args=(nv, event_set, stop),
            name="loadwatch-nvml-xid",
            daemon=True,
        )
        self._xid_set, self._xid_stop, self._xid_thread = event_set, stop, thread
        thread.start()

    def _xid_off(self, status: str) -> None:
        if status != self._xid_status:
            self._log(status)
        self._xid_status = status

    def _stop_xid(self) -> None:
        thread, stop, event_set = self._xid_thread, self._xid_stop, self._xid_set
        self._xid_thread = self._xid_stop = self._xid_set = None
        if thread is None or stop is None:
            return
        stop.set()
        thread.join(timeout=self._xid_wait_ms / 1000.0 + 1.0)
        if not thread.is_alive():  # freeing a set that a thread still waits on is unsafe
            _free_quietly(self._nvml, event_set)

    def _xid_loop(self, nv: Any, event_set: Any, stop: threading.Event) -> None:
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        pause_s = self._xid_wait_ms / 1000.0
        while not stop.is_set():
            try:
                data = wait(event_set, self._xid_wait_ms)
            except Exception as exc:
                code = getattr(exc, "value", None)
                if code == ERROR_TIMEOUT:
                    self._xid_status = None
                    continue
                self._xid_status = f"Xid events: wait failed: {describe(exc)}"
                if code in _REINIT:
                    return  # the next poll starts a new thread, re-initialising NVML if need be
                stop.wait(pause_s)  # no tight loop on a persistent fault
                continue
            self._xid_status = None
            if int(getattr(data, "eventType", 0)) & EVENT_TYPE_XID_CRITICAL_ERROR:
                self._record_xid(nv, data)

    def _record_xid(self, nv: Any, data: Any) -> None:
        index = -1
        uuid: str | None = None
        try:
            index = int(nv.nvmlDeviceGetIndex(data.device))
        except Exception:
            pass  # a lost GPU may not answer; the Xid still counts, under index -1
        for gpu in self._gpus:
            if gpu.index == index:
                uuid = gpu.last_static.uuid
        event = XidEvent(gpu_index=index, xid=int(data.eventData), ts=self._clock(), uuid=uuid)
        with self._xid_lock:
            self._xid_pending.append(event)
            key = (event.gpu_index, event.xid)
            self._xid_counts[key] = self._xid_counts.get(key, 0) + 1


def _processes(procs: Any) -> tuple[GpuProcess, ...]:
    if not procs:
        return ()
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(pid=int(p.pid), used_bytes=int(used) if used is not None else None))
    return tuple(out)


def _free_quietly(nv: Any, event_set: Any) -> None:
    try:
        nv.nvmlEventSetFree(event_set)
    except Exception:
        pass
