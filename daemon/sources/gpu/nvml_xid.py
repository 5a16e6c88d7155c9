"""Xid critical errors from NVML: an event set on a thread of its own, its events handed out with
the next reading and counted since start."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from loadwatch.daemon.sources.gpu.nvml_abi import (
    ERROR_TIMEOUT,
    EVENT_TYPE_XID_CRITICAL_ERROR,
    REINIT,
    describe,
)
from loadwatch.daemon.sources.gpu.nvml_device import Gpu
from loadwatch.daemon.sources.inputs import XidEvent


class XidWatcher:
    def __init__(
        self,
        *,
        wait_ms: int,
        clock: Callable[[], float] = time.time,
        logger: Callable[[str], None],
    ) -> None:
        self._xid_wait_ms = wait_ms
        self._clock = clock
        self._log = logger
        self._nvml: Any = None
        self._gpus: Sequence[Gpu] = ()
        self._xid_lock = threading.Lock()
        self._xid_pending: list[XidEvent] = []
        self._xid_counts: dict[tuple[int, int], int] = {}
        self._xid_thread: threading.Thread | None = None
        self._xid_stop: threading.Event | None = None
        self._xid_set: Any = None
        self.status: str | None = None

    def start(self, nvml: Any, gpus: Sequence[Gpu]) -> None:
        self._nvml, self._gpus = nvml, gpus
        self._start_xid()

    def restart_if_ended(self) -> None:
        """The thread ended on an error: free its set and start anew."""
        thread = self._xid_thread
        if thread is not None and not thread.is_alive():
            self.stop()
            self._start_xid()

    def stop(self) -> None:
        self._stop_xid()

    def drain(self) -> tuple[XidEvent, ...]:
        """Xid events received since the last reading (also safe while a poll is hung)."""
        with self._xid_lock:
            if not self._xid_pending:
                return ()
            events = tuple(self._xid_pending)
            self._xid_pending.clear()
            return events

    def counts(self) -> dict[tuple[int, int], int]:
        """Xid events seen since start, by (GPU index, Xid code); never reset."""
        with self._xid_lock:
            return dict(self._xid_counts)

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
        self.status = None
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
        if status != self.status:
            self._log(status)
        self.status = status

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
                    self.status = None
                    continue
                self.status = f"Xid events: wait failed: {describe(exc)}"
                if code in REINIT:
                    return  # the next poll starts a new thread, re-initialising NVML if need be
                stop.wait(pause_s)  # no tight loop on a persistent fault
                continue
            self.status = None
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


def _free_quietly(nv: Any, event_set: Any) -> None:
    try:
        nv.nvmlEventSetFree(event_set)
    except Exception:
        pass
