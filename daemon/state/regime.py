"""The speed model of the time-left estimator (forecast.py): a bar's progress as segments
between its updates, and a *regime*, a stretch of constant speed, fitted to them.

A segment's duration is modelled as `a * files + b * units` (a per-file cost and a per-byte
cost), fitted by least squares from running sums, so adding a segment costs the same however
many came before. A two-sided CUSUM on each new segment's residual finds where the speed really
changed (`change_point` places the new regime's start within the run that gave it away).

Functions rather than methods where a bar update calls them: compiled, a call of a function is
a C call, while a named tuple's method is looked up and called as Python's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from loadwatch.daemon.state.records import CompiledRecord, new_tuple

Cusum = tuple[float, float, int, int]  # (upward sum, downward sum, where each run began)


@dataclass(frozen=True, slots=True)
class EtaConfig(CompiledRecord):
    """The time-left estimator's settings: its segments, its regime's fit, and the CUSUM that
    ends a regime."""

    min_segment_s: float = 0.5  # shorter segments are merged with the next
    window: int = 24  # recent segments kept (to restart a regime at a change point)
    prior_sigma: float = 0.25  # log-duration noise assumed before the data says otherwise
    prior_weight: float = 3.0  # how many segments' worth that assumption counts for
    min_sigma: float = 0.05
    ridge: float = 0.002  # pull on the per-file cost: with equal files it is not identifiable
    cusum_k: float = 0.75  # slack per segment, in sigmas
    cusum_h: float = 5.0  # alarm level, in sigmas
    range_z: float = 1.64  # the low/high range is about a 90% interval


class Segment(NamedTuple):
    """Progress between two bar updates: `items` files and `x1 - x0` units in `t1 - t0` s.
    `resid` is log(actual / predicted duration) against the regime it was tested on."""

    serial: int
    t0: float
    t1: float
    x0: float
    x1: float
    items: int
    resid: float = 0.0

    @property
    def dt(self) -> float:
        return self.t1 - self.t0

    @property
    def dx(self) -> float:
        return self.x1 - self.x0


class Regime(NamedTuple):
    """A stretch of constant speed. Durations are modelled as `a * files + b * units` (a
    per-file cost and a per-byte cost), fitted by least squares from running sums."""

    n: int = 0
    s_nn: float = 0.0
    s_nx: float = 0.0
    s_xx: float = 0.0
    s_nt: float = 0.0
    s_xt: float = 0.0
    t_sum: float = 0.0
    x_sum: float = 0.0
    r2_sum: float = 0.0  # sum of squared residuals (log actual/predicted)
    sigma_prior: float = 0.25
    cusum_pos: float = 0.0
    cusum_neg: float = 0.0
    pos_from: int = 0  # serial of the first segment of the current upward run
    neg_from: int = 0
    tested_from: int = 0  # segments from this serial on were tested against this regime

    def add(self, seg: Segment, resid: float | None = None, cusum: Cusum | None = None) -> Regime:
        """The regime with `seg` in its sums (with the residual `resid` in place of its own),
        and the CUSUM's state `cusum` when given. (A load adds a segment per bar update.)"""
        return regime_add(self, seg, resid, cusum)

    def coef(self, cfg: EtaConfig) -> tuple[float, float]:
        """(seconds per file, seconds per unit)."""
        return regime_coef(self, cfg)

    def predict(self, items: float, units: float, cfg: EtaConfig) -> float:
        return regime_predict(self, items, units, cfg)

    @property
    def rate(self) -> float:
        """Units per second over the regime."""
        return self.x_sum / self.t_sum

    def sigma(self, cfg: EtaConfig) -> float:
        return regime_sigma(self, cfg)


def regime_add(r: Regime, seg: Segment, resid: float | None, cusum: Cusum | None) -> Regime:
    """`Regime.add` (a function: compiled, a call of it is a C call, not a method lookup)."""
    n, x, t = float(seg.items), seg.x1 - seg.x0, seg.t1 - seg.t0
    e = seg.resid if resid is None else resid
    pos, neg, pos_from, neg_from = (
        cusum if cusum is not None else (r.cusum_pos, r.cusum_neg, r.pos_from, r.neg_from)
    )
    return new_tuple(
        Regime,
        (
            r.n + 1,
            r.s_nn + n * n,
            r.s_nx + n * x,
            r.s_xx + x * x,
            r.s_nt + n * t,
            r.s_xt + x * t,
            r.t_sum + t,
            r.x_sum + x,
            r.r2_sum + e * e,
            r.sigma_prior,
            pos,
            neg,
            pos_from,
            neg_from,
            r.tested_from,
        ),
    )


def regime_coef(r: Regime, cfg: EtaConfig) -> tuple[float, float]:
    """`Regime.coef`: (seconds per file, seconds per unit)."""
    ratio = (0.0, r.t_sum / r.x_sum)
    if r.n < 3:
        return ratio
    a11 = r.s_nn * (1.0 + cfg.ridge)
    det = a11 * r.s_xx - r.s_nx * r.s_nx
    if det <= 0.0:
        return ratio
    a = (r.s_nt * r.s_xx - r.s_nx * r.s_xt) / det
    b = (a11 * r.s_xt - r.s_nx * r.s_nt) / det
    if a < 0.0 or b <= 0.0:
        return ratio
    return a, b


def regime_predict(r: Regime, items: float, units: float, cfg: EtaConfig) -> float:
    a, b = regime_coef(r, cfg)
    return a * items + b * units


def regime_sigma(r: Regime, cfg: EtaConfig) -> float:
    w = cfg.prior_weight
    var = (w * r.sigma_prior**2 + r.r2_sum) / (w + r.n)
    return max(cfg.min_sigma, math.sqrt(var))


def change_point(run: tuple[Segment, ...]) -> int:
    """Where in `run` the new speed most likely began: the suffix whose residuals depart most
    from the old regime, weighted by its length (the likelihood ratio of a shift). CUSUM's own
    start of the run can lie a few noisy segments too early."""
    best, best_score = 0, -1.0
    total = 0.0
    for j in range(len(run) - 1, -1, -1):
        total += run[j].resid
        score = total * total / (len(run) - j)
        if score > best_score:
            best, best_score = j, score
    return best


def regime_from(segments: tuple[Segment, ...], sigma_prior: float) -> Regime:
    r = Regime(sigma_prior=sigma_prior)
    for seg in segments:
        r = r.add(seg, resid=0.0)
    nxt = segments[-1].serial + 1
    return r._replace(pos_from=nxt, neg_from=nxt, tested_from=nxt)
