"""A simulated GPU source for tests and the demo: N GPUs whose memory follows a scripted load.

Memory grows from the CUDA context to each GPU's final figure as ``progress()`` goes 0 -> 1.
Faults come on demand: lose a GPU, hang the next polls, raise an Xid, make the library missing.
Real processes can be shown holding memory (``hold``); like NVML, the source goes on listing one
for ``exit_linger_s`` after it exits (gone from /proc, or a zombie).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadwatch.daemon.sources.inputs import GpuProcess, GpuReading, GpuSample, XidEvent

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What one simulated GPU model reports (approximate figures, for realism not accuracy)."""

    name: str
    compute_capability: tuple[int, int]
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_watts: float
    idle_power_watts: float
    load_power_watts: float


RTX_PRO_6000_BLACKWELL = GpuModel(
    name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    compute_capability=(12, 0),
    memory_total_bytes=96 * GIB,
    memory_reserved_bytes=512 * MIB,
    power_limit_watts=600.0,
    idle_power_watts=75.0,
    load_power_watts=220.0,
)

H200 = GpuModel(
    name="NVIDIA H200",
    compute_capability=(9, 0),
    memory_total_bytes=141 * 10**9,
    memory_reserved_bytes=512 * MIB,
    power_limit_watts=700.0,
    idle_power_watts=90.0,
    load_power_watts=250.0,
)

LIBRARY_MISSING = "NVML init failed: NVML Shared Library Not Found (NVML error 12)"


def _per_gpu(value: int | Sequence[int], count: int, what: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * count
    values = tuple(value)
    if len(values) != count:
        raise ValueError(f"{what}: {len(values)} values for {count} GPUs")
    return values


class SimulatedGpuSource:
    """Implements ``GpuSource`` (``poll() -> GpuReading``) plus fault injection.

    ``pids`` are the processes shown holding each GPU's memory (one pid for all GPUs, or one per
    GPU); without them no process is listed.
    """

    def __init__(
        self,
        count: int = 8,
        *,
        progress: Callable[[], float] = lambda: 0.0,
        final_used_bytes: int | Sequence[int] = 88 * GIB,
        model: GpuModel = RTX_PRO_6000_BLACKWELL,
        context_bytes: int = 500 * MIB,
        pids: int | Sequence[int] | None = None,
        clock: Callable[[], float] = time.time,
        exit_linger_s: float = 0.0,
        proc_root: Path = Path("/proc"),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._count = count
        self._progress = progress
        self._final = _per_gpu(final_used_bytes, count, "final_used_bytes")
        usable = model.memory_total_bytes - model.memory_reserved_bytes
        for i, final in enumerate(self._final):
            # A final figure above what the GPU holds is a load that runs out of memory: the
            # readings stop at the capacity, as a real device's do, while the trend heads past it.
            if not context_bytes <= final <= 2 * usable:
                raise ValueError(
                    f"final_used_bytes[{i}]={final} is outside {context_bytes}..{2 * usable}"
                )
        self._usable = usable
        self._model = model
        self._context = context_bytes
        self._pids = None if pids is None else _per_gpu(pids, count, "pids")
        self._clock = clock
        self._monotonic = monotonic  # (for the linger after an exit)
        self._lock = threading.Lock()
        self._lost: set[int] = set()
        self._library_missing = False
        self._pending_xids: list[XidEvent] = []
        self._xid_counts: dict[tuple[int, int], int] = {}
        self._released = threading.Event()
        self._released.set()
        self._linger_s = exit_linger_s
        self._proc_root = proc_root
        self._held: dict[tuple[int, int], int] = {}  # (gpu, pid) -> bytes, for hold()
        self._gone_at: dict[int, float] = {}  # pid -> monotonic time its exit was first seen
        self.polls = 0

    @property
    def count(self) -> int:
        return self._count

    def uuid(self, index: int) -> str:
        return f"GPU-5a5a{index:04x}-0000-4000-8000-{index:012x}"

    # -- faults -------------------------------------------------------------------------------

    def lose_gpu(self, index: int) -> None:
        self._check_index(index)
        with self._lock:
            self._lost.add(index)

    def restore_gpu(self, index: int) -> None:
        with self._lock:
            self._lost.discard(index)

    def hang(self) -> None:
        """Every poll from now on blocks (as a wedged driver call does) until ``unhang()``."""
        self._released.clear()

    def unhang(self) -> None:
        self._released.set()

    def raise_xid(self, index: int, xid: int) -> None:
        self._check_index(index)
        event = XidEvent(gpu_index=index, xid=xid, ts=self._clock(), uuid=self.uuid(index))
        with self._lock:
            self._pending_xids.append(event)
            key = (index, xid)
            self._xid_counts[key] = self._xid_counts.get(key, 0) + 1

    def hold(self, index: int, pid: int, used_bytes: int) -> None:
        """Show process ``pid`` holding ``used_bytes`` on GPU ``index`` until it exits."""
        self._check_index(index)
        with self._lock:
            self._held[(index, pid)] = used_bytes

    def set_library_missing(self, missing: bool = True) -> None:
        with self._lock:
            self._library_missing = missing

    def close(self) -> None:
        self.unhang()  # a poll blocked in a simulated hang returns

    # -- GpuSource ----------------------------------------------------------------------------

    def poll(self) -> GpuReading:
        self._released.wait()
        with self._lock:
            self.polls += 1
            now = self._clock()
            if self._library_missing:
                return GpuReading(ts=now, source_up=False, error=LIBRARY_MISSING, poll_seconds=0.0)
            p = self._progress_now()
            self._drop_exited()
            samples = tuple(self._sample(i, p, now) for i in range(self._count))
            xids = tuple(self._pending_xids)
            self._pending_xids.clear()
            return GpuReading(ts=now, samples=samples, xids=xids, source_up=True, poll_seconds=0.0)

    def drain_xids(self) -> tuple[XidEvent, ...]:
        with self._lock:
            xids = tuple(self._pending_xids)
            self._pending_xids.clear()
            return xids

    def xid_counts(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return dict(self._xid_counts)

    def set_final_used_bytes(self, final_used_bytes: int | Sequence[int]) -> None:
        """A different load from now on (the next vLLM start loads something that fits)."""
        finals = _per_gpu(final_used_bytes, self._count, "final_used_bytes")
        with self._lock:
            self._final = finals

    def used_bytes(self, index: int, progress: float) -> int:
        """Memory in use on GPU ``index`` at ``progress`` (the figure a poll reports)."""
        p = min(max(progress, 0.0), 1.0)
        return min(self._usable, self._context + round(p * (self._final[index] - self._context)))

    # -- internals ----------------------------------------------------------------------------

    def _progress_now(self) -> float:
        p = float(self._progress())
        return 0.0 if math.isnan(p) else min(max(p, 0.0), 1.0)

    def _drop_exited(self) -> None:
        """Holders that exited stop being listed ``exit_linger_s`` after the exit was seen."""
        now = self._monotonic()
        for gpu, pid in list(self._held):
            try:
                stat = (self._proc_root / str(pid) / "stat").read_text(errors="replace")
                gone = stat.rpartition(")")[2].split()[:1] == ["Z"]
            except OSError:
                gone = True
            if not gone:
                continue
            since = self._gone_at.setdefault(pid, now)
            if now - since >= self._linger_s:
                del self._held[(gpu, pid)]
                self._gone_at.pop(pid, None)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self._count:
            raise IndexError(f"no simulated GPU {index} (have {self._count})")

    def _sample(self, i: int, p: float, now: float) -> GpuSample:
        m = self._model
        base = GpuSample(
            index=i,
            uuid=self.uuid(i),
            name=m.name,
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            compute_capability=m.compute_capability,
            memory_total_bytes=m.memory_total_bytes,
            power_limit_watts=m.power_limit_watts,
            sampled_at=now,
        )
        if i in self._lost:
            return dataclasses.replace(base, health="lost", error="GPU is lost (NVML error 15)")
        used = self.used_bytes(i, p)
        loading = 0.0 < p < 1.0
        procs: tuple[GpuProcess, ...] = ()
        if self._pids is not None:
            procs = (GpuProcess(pid=self._pids[i], used_bytes=used),)
        held = [(pid, b) for (gpu, pid), b in self._held.items() if gpu == i]
        procs += tuple(GpuProcess(pid=pid, used_bytes=b) for pid, b in held)
        used = min(self._usable, used + sum(b for _, b in held))
        return dataclasses.replace(
            base,
            health="ok",
            memory_used_bytes=used,
            memory_reserved_bytes=m.memory_reserved_bytes,
            utilization_ratio=0.15 if loading else (0.0 if p == 0.0 else 0.02),
            memory_utilization_ratio=0.3 if loading else 0.0,
            temperature_celsius=round(32.0 + 18.0 * p, 1),
            power_watts=round(
                m.idle_power_watts + (m.load_power_watts - m.idle_power_watts) * p, 1
            ),
            pstate=0,
            clock_event_reasons=0,
            ecc_uncorrected_total=0,
            processes=procs,
        )
