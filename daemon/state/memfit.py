"""The final GPU memory of a weight load (`MemoryFit`).

Memory used on each GPU is fitted against the fraction of checkpoint bytes loaded, not against
time (speed changes would bend a time fit) and not from the first sample (the first shard may
carry replicated embeddings, a step that is not part of the slope). Samples are binned by
fraction; the fit uses the recent part of the load only and projects memory at 100%. Pure:
immutable values in, new immutable values out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loadwatch.daemon.state.records import evolve


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    bins: int = 64
    min_fraction: float = 0.08  # no projection before this much of the load
    min_bins: int = 6
    min_span: float = 0.05  # fraction of the load the fitted points must span
    recent_share: float = 0.6  # fit the most recent 60% of the progress so far
    z: float = 2.5
    raise_ratio: float = 1.03  # raise when even the low projection exceeds the GPU by this
    clear_ratio: float = 0.98  # an OOM forecast clears when the projection falls below this


@dataclass(frozen=True, slots=True)
class MemoryProjection:
    final_bytes: float
    low_bytes: float
    high_bytes: float
    slope_bytes: float  # bytes per whole load
    points: int
    fraction: float  # progress when projected


@dataclass(frozen=True)
class MemoryFit:
    """Samples of memory used, binned by the fraction of the checkpoint loaded."""

    bins: tuple[tuple[float, float, int], ...] = ()  # per bin: (sum of f, sum of used, n)
    skip_below: float = 0.0  # the first shard's end: its step is not part of the slope
    last_fraction: float = 0.0
    last_used: float = 0.0
    max_used: float = 0.0
    cfg: MemoryConfig = MemoryConfig()

    def add(self, fraction: float, used_bytes: float) -> MemoryFit:
        f = min(max(fraction, 0.0), 1.0)
        nb = self.cfg.bins
        bins = self.bins or ((0.0, 0.0, 0),) * nb
        i = min(int(f * nb), nb - 1)
        sf, su, n = bins[i]
        bins = (*bins[:i], (sf + f, su + used_bytes, n + 1), *bins[i + 1 :])
        return evolve(
            self,
            bins=bins,
            last_fraction=f,
            last_used=used_bytes,
            max_used=max(self.max_used, used_bytes),
        )

    def project(self) -> MemoryProjection | None:
        cfg = self.cfg
        f_now = self.last_fraction
        if f_now < cfg.min_fraction or not self.bins:
            return None
        lo = max(self.skip_below, f_now * (1.0 - cfg.recent_share))
        pts = [(sf / n, su / n) for sf, su, n in self.bins if n and sf / n > lo]
        if len(pts) < cfg.min_bins:
            return None
        fs = [p[0] for p in pts]
        if max(fs) - min(fs) < cfg.min_span:
            return None
        k = len(pts)
        fm = sum(fs) / k
        um = sum(p[1] for p in pts) / k
        sff = sum((f - fm) ** 2 for f in fs)
        if sff <= 0:
            return None
        slope = sum((f - fm) * (u - um) for f, u in pts) / sff
        slope = max(slope, 0.0)  # loading weights does not free memory
        final = um + slope * (1.0 - fm)
        resid = sum((u - (um + slope * (f - fm))) ** 2 for f, u in pts)
        s = math.sqrt(resid / (k - 2)) if k > 2 else 0.0
        se = s * math.sqrt(1.0 / k + (1.0 - fm) ** 2 / sff)
        final = max(final, self.max_used)
        low = max(final - cfg.z * se, self.max_used)
        return MemoryProjection(final, low, final + cfg.z * se, slope, k, f_now)


# -- stalls ------------------------------------------------------------------------------------
