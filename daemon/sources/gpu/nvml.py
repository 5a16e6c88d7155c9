"""The NVML GPU source: the one module that imports ``pynvml`` (from ``nvidia-ml-py``).

Every NVML call goes through ``Device.call`` (nvml_device.py), which turns NVML errors into "not available"
(``None``) and a per-GPU health: a lost GPU reads ``lost`` and the others go on; an error that
means the library or driver went away takes the whole source down and re-initialises NVML with
backoff. Static facts are read once per device handle. Xid critical errors arrive through an NVML
event set on a thread of their own (nvml_xid.py) and are handed out with the next reading. The
codes and constants of NVML's ABI are in nvml_abi.py. Only this module imports the binding.

This module does not guard against a call that hangs; ``loadwatch.daemon.sources.gpu.guard.GuardedGpuSource``
does, around it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from loadwatch.daemon.sources.gpu.nvml_abi import PROCS_EVERY_POLLS as PROCS_EVERY_POLLS
from loadwatch.daemon.sources.gpu.nvml_abi import REINIT, GpuLost, Reinit, describe, text
from loadwatch.daemon.sources.gpu.nvml_device import Device, Gpu
from loadwatch.daemon.sources.gpu.nvml_xid import XidWatcher
from loadwatch.daemon.sources.inputs import GpuReading, GpuSample, XidEvent

log = logging.getLogger("loadwatch.gpu")


def _import_pynvml() -> Any:
    return importlib.import_module("pynvml")


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
        self._gpus: list[Gpu] = []
        self._error: str | None = "not initialised yet"
        self._backoff_s = backoff_initial_s
        self._next_attempt = float("-inf")
        self._logged_error: str | None = None
        self._init_attempts = 0
        self._device: Device | None = None
        self._xid = XidWatcher(wait_ms=xid_wait_ms, clock=clock, logger=self._log)

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
        return self._xid.status

    def poll(self) -> GpuReading:
        with self._lock:
            start = self._monotonic()
            now = self._clock()
            if self._closed:
                return self._down(now, start, "GPU source closed")
            if not self._up and not self._try_init(start):
                return self._down(now, start, self._error)
            try:
                device = self._device
                assert device is not None  # set with the library, before the source is up
                samples = tuple([device.sample(gpu, now) for gpu in self._gpus])
            except Reinit as exc:
                self._go_down(str(exc), start)
                return self._down(now, start, self._error)
            # Only a poll that got through resets the backoff: a driver that comes up and falls
            # over again at once keeps backing off instead of flapping every second.
            self._backoff_s = self._backoff_initial_s
            if self._logged_error is not None:
                self._log(f"GPU source up again: NVML sees {len(self._gpus)} GPU(s)")
                self._logged_error = None
            self._xid.restart_if_ended()
            return GpuReading(
                ts=now,
                samples=samples,
                xids=self.drain_xids(),
                source_up=True,
                poll_seconds=self._monotonic() - start,
            )

    def drain_xids(self) -> tuple[XidEvent, ...]:
        """Xid events received since the last reading (also safe while a poll is hung)."""
        return self._xid.drain()

    def parent_uuid(self, mig_uuid: str) -> str | None:
        """The UUID of the GPU a MIG device is a slice of; None while NVML does not answer."""
        with self._lock:
            if not self._up:
                return None
            nv = self._nvml
            try:
                mig = nv.nvmlDeviceGetHandleByUUID(mig_uuid)
                parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
                return text(nv.nvmlDeviceGetUUID(parent))
            except Exception:
                return None

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """Xid events seen since start, by (GPU index, Xid code); never reset."""
        return self._xid.counts()

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
        self._device = Device(nv)
        try:
            nv.nvmlInit()
            self._initialized = True
            count = int(nv.nvmlDeviceGetCount())
            gpus = [self._open_gpu(i) for i in range(count)]
        except (Reinit, GpuLost) as exc:
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
            self._xid.start(nv, gpus)
        return True

    def _open_gpu(self, index: int) -> Gpu:
        gpu = Gpu(index)
        try:
            gpu.handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            code = getattr(exc, "value", None)
            if code in REINIT:
                raise Reinit(describe(exc)) from None
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
        self._xid.stop()
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
