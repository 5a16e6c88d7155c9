"""Which GPUs this loadwatch watches: `[gpu] devices`, or the supervised vLLM's CUDA_VISIBLE_DEVICES.

Two vLLMs on one host (TP4 x 2, or MIG slices) each get a loadwatch of their own; each must poll,
forecast and report only the GPUs its vLLM uses. `ScopedGpuSource` sits between a source and
the deadline guard and keeps, of each reading, the samples and Xid events of the selected GPUs.
A GPU keeps its host index (the one `nvidia-smi` shows), so two instances' metrics never collide.

A selector is an NVML index (`0`), a GPU UUID (`GPU-5a5a...`) or a MIG device UUID (`MIG-...`).
A MIG UUID selects the GPU it is a slice of: NVML reports memory, power and Xid errors per GPU,
so that GPU's figures are what the instance sees (say so when two slices of one GPU are watched
apart). The parent is asked of the source (`parent_uuid`, NVML's
`nvmlDeviceGetDeviceHandleFromMigDeviceHandle`) once per MIG UUID, while it answers.

CUDA_VISIBLE_DEVICES uses CUDA's own order, which is the PCI order NVML uses only under
`CUDA_DEVICE_ORDER=PCI_BUS_ID`; UUIDs in it are exact whatever the order (docs/kubernetes.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from loadwatch.daemon.sources.inputs import GpuReading, GpuSample, GpuSource, XidEvent

Selector = int | str


@runtime_checkable
class MigAware(Protocol):
    def parent_uuid(self, mig_uuid: str) -> str | None: ...


def parse_selector(text: str) -> Selector:
    """One entry of a device list; ValueError names what is wrong."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    if t.startswith(("GPU-", "MIG-")) and len(t) > 4:
        return t
    raise ValueError(f"{text!r} is neither a GPU index, a GPU-... UUID nor a MIG-... UUID")


def from_cuda_visible_devices(value: str) -> tuple[Selector, ...] | None:
    """The selectors CUDA_VISIBLE_DEVICES names; None when it does not restrict (unset). CUDA
    stops at the first entry it cannot read, and so do we; an empty value selects no GPU."""
    out: list[Selector] = []
    for part in value.split(","):
        try:
            out.append(parse_selector(part))
        except ValueError:
            break
    return tuple(out)


def devices_from_env(env: Mapping[str, str]) -> tuple[Selector, ...] | None:
    value = env.get("CUDA_VISIBLE_DEVICES")
    return None if value is None else from_cuda_visible_devices(value)


class ScopedGpuSource:
    """`inner`'s readings with only the selected GPUs' samples and Xid events."""

    def __init__(self, inner: GpuSource, devices: Sequence[Selector]) -> None:
        self._inner = inner
        self.devices = tuple(devices)
        self._indices = {d for d in self.devices if isinstance(d, int)}
        self._uuids = {d for d in self.devices if isinstance(d, str) and d.startswith("GPU-")}
        self._migs: dict[str, str | None] = {
            d: None for d in self.devices if isinstance(d, str) and d.startswith("MIG-")
        }
        self._kept: set[int] = set(self._indices)  # the indices the last reading kept

    @property
    def inner(self) -> GpuSource:
        return self._inner

    def poll(self) -> GpuReading:
        reading = self._inner.poll()
        self._resolve_migs()
        keep = [s for s in reading.samples if self._selected(s)]
        if reading.source_up:
            self._kept = {s.index for s in keep}
        xids = tuple(x for x in reading.xids if x.gpu_index in self._kept)
        return dataclasses.replace(reading, samples=tuple(keep), xids=xids)

    def _selected(self, s: GpuSample) -> bool:
        if s.index in self._indices:
            return True
        return s.uuid is not None and (s.uuid in self._uuids or s.uuid in self._migs.values())

    def _resolve_migs(self) -> None:
        parent: Callable[[str], str | None] | None = (
            self._inner.parent_uuid if isinstance(self._inner, MigAware) else None
        )
        if parent is None:
            return
        for mig, known in self._migs.items():
            if known is None:
                self._migs[mig] = parent(mig)

    def drain_xids(self) -> tuple[XidEvent, ...]:
        """Xid events taken between polls (a hung poll): those of the GPUs the last poll kept."""
        drain = getattr(self._inner, "drain_xids", None)
        if drain is None:
            return ()
        events: tuple[XidEvent, ...] = drain()
        return tuple(x for x in events if x.gpu_index in self._kept)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()
