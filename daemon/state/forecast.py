"""Estimators for a weight load: time left, and when silence means a stall.

Everything here is pure: immutable values in, new immutable values out, time passed in. (The
final memory: memfit.py; the speed model of the time left, segments and regimes: regime.py.)

Time left (`EtaState`)
    vLLM loads shard files in a known order, so `done=N` on the weights bar means the first N
    files are in. With the files' sizes the position is known in bytes, which makes shards of
    different sizes (embeddings, expert blocks, a short last file) cost what they weigh instead of
    one tick each. The speed is modelled as piecewise constant: the current *regime* averages
    every segment since the last change point (bytes over seconds), which is far steadier than
    tqdm's per-item moving average while the speed holds. A two-sided CUSUM on the log speed of
    each new segment, measured in units of the regime's own noise, finds the points where the
    speed really changed (page cache turning cold or warm, another job taking the disk); the new
    regime then starts at the beginning of the run that gave it away. Segments shorter than
    `min_segment_s` are merged, so second-resolution timestamps from a replayed log do not turn
    into wild speeds.

Stall threshold (`stall_threshold_s`)
    No progress for longer than max(k x the time the shard in progress should take, a floor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadwatch.parsers.events import ShardProgress

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

from loadwatch.daemon.state.records import CompiledRecord, new_tuple
from loadwatch.daemon.state.regime import (
    EtaConfig,
    Regime,
    Segment,
    change_point,
    regime_add,
    regime_from,
    regime_predict,
    regime_sigma,
)

Units = Literal["bytes", "items"]


# -- time left ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Eta(CompiledRecord):
    """Time left on one weights bar, seen at `at`."""

    at: float
    remaining_s: float
    low_s: float
    high_s: float
    rate_per_s: float  # units per second (bytes or items)
    units: Units
    position: float  # units done at `at` (interpolated between bar updates)
    total: float

    @property
    def finish_at(self) -> float:
        return self.at + self.remaining_s


class EtaState(NamedTuple):
    """The estimator for one weights bar. `cum` maps files done to bytes done (None: count)."""

    total_items: int
    cum: tuple[int, ...] | None
    start_t: float
    start_done: int
    last_t: float
    last_done: int
    open_t: float  # start of the segment being accumulated
    open_done: int
    regime: Regime | None = None
    recent: tuple[Segment, ...] = ()
    serial: int = 0
    changes: int = 0
    finished_at: float | None = None
    cfg: EtaConfig = EtaConfig()

    @staticmethod
    def start(
        t: float,
        done: int,
        total: int,
        cum: tuple[int, ...] | None = None,
        elapsed_s: float | None = None,
        cfg: EtaConfig | None = None,
    ) -> EtaState:
        """A bar seen for the first time at `t` with `done` files. With the bar's own elapsed
        time the start is known even when the log is joined mid-bar."""
        if cum is not None and len(cum) != total + 1:
            cum = None
        if done == 0 or elapsed_s is None:
            t0, d0 = t, done
        else:
            t0, d0 = t - elapsed_s, 0
        return EtaState(
            total_items=total,
            cum=cum,
            start_t=t0,
            start_done=d0,
            last_t=t,
            last_done=done,
            open_t=t0,
            open_done=d0,
            finished_at=t if total > 0 and done >= total else None,
            cfg=cfg or EtaConfig(),
        )

    def with_sizes(self, cum: tuple[int, ...]) -> EtaState:
        """The same bar weighed by bytes, for model information that arrived after the bar
        started: the recent segments (file counts and times) are replayed in bytes."""
        if self.cum is not None or len(cum) != self.total_items + 1:
            return self
        first = self.recent[0] if self.recent else None
        t0 = first.t0 if first is not None else self.start_t
        d0 = int(first.x0) if first is not None else self.start_done
        st = EtaState.start(t0, d0, self.total_items, cum, cfg=self.cfg)
        st = st._replace(start_t=self.start_t, start_done=self.start_done)
        for seg in self.recent:
            st = st.update(seg.t1, int(seg.x1))
        return st.update(self.last_t, self.last_done)

    @property
    def units(self) -> Units:
        return "items" if self.cum is None else "bytes"

    def x(self, done: int) -> float:
        return eta_units(self, done)

    @property
    def total(self) -> float:
        return self.x(self.total_items)

    def update(self, t: float, done: int) -> EtaState:
        """A bar update. Repeats and regressions are ignored (the caller starts a new bar)."""
        return eta_advance(self, t, done)

    # -- reading the estimate -----------------------------------------------------------------

    def rate(self) -> float | None:
        """Units per second of the current regime; before the first full segment, the average
        so far."""
        if self.regime is not None:
            return self.regime.rate
        dt = self.last_t - self.start_t
        dx = self.x(self.last_done) - self.x(self.start_done)
        if dt > 0 and dx > 0:
            return dx / dt
        return None

    def item_seconds(self) -> float | None:
        """Typical seconds per file lately (median over the recent segments)."""
        return item_seconds(self)

    def next_item_seconds(self) -> float | None:
        """How long the file in progress should take: by its size when sizes are known, and
        never less than the typical time per file."""
        return next_item_seconds(self)

    def _in_file(self, now: float, read_bytes_since_update: int | None) -> float:
        """Share of the file in progress done at `now`, from bytes read (bytes mode) or from
        the time spent on it; never the whole file without the bar saying so."""
        if self.finished_at is not None or self.last_done >= self.total_items:
            return 0.0
        size = self.x(self.last_done + 1) - self.x(self.last_done)
        if self.cum is not None and read_bytes_since_update and size > 0:
            share = read_bytes_since_update / size
        else:
            cost = _item_cost(self, self.last_done)
            share = (now - self.last_t) / cost if cost and now > self.last_t else 0.0
        return min(max(share, 0.0), 0.95)

    def position(self, now: float, read_bytes_since_update: int | None = None) -> float:
        """Units done at `now`: the last update plus progress into the file in progress."""
        x_last = self.x(self.last_done)
        if self.finished_at is not None or self.last_done >= self.total_items:
            return x_last
        share = self._in_file(now, read_bytes_since_update)
        return x_last + share * (self.x(self.last_done + 1) - x_last)

    def estimate(self, now: float, read_bytes_since_update: int | None = None) -> Eta | None:
        total = self.total
        if self.finished_at is not None:
            return Eta(now, 0.0, 0.0, 0.0, self.rate() or 0.0, self.units, total, total)
        rate = self.rate()
        if rate is None or rate <= 0:
            return None
        cfg = self.cfg
        r = self.regime
        share = self._in_file(now, read_bytes_since_update)
        x_last = self.x(self.last_done)
        size = self.x(self.last_done + 1) - x_last
        items_left = self.total_items - self.last_done - share
        units_left = max(total - x_last - share * size, 0.0)
        if r is not None:
            remaining = r.predict(items_left, units_left, cfg)
        else:
            remaining = units_left / rate
        pos = x_last + share * size
        sigma = r.sigma(cfg) if r is not None else cfg.prior_sigma
        n = r.n if r is not None else 1
        seg_units = r.x_sum / r.n if r is not None and r.n else max(pos, 1.0)
        future = max(units_left / max(seg_units, 1e-9), 1.0)
        rel = math.sqrt(sigma**2 / n + sigma**2 / future)
        low = remaining * math.exp(-cfg.range_z * rel)
        high = remaining * math.exp(cfg.range_z * rel)
        # A change may be brewing: let the range reach what the last few segments say.
        tail = self.recent[-3:]
        if r is not None and len(tail) == 3 and tail[0].serial >= r.tested_from:
            alt = remaining * math.exp(sum(sg.resid for sg in tail) / 3)
            low, high = min(low, alt), max(high, alt)
        return Eta(now, remaining, low, high, rate, self.units, pos, total)


def stall_threshold_s(expected_item_s: float | None, k: float, floor_s: float) -> float:
    """Silence allowed before a stall: k times the time the file in progress should take,
    never less than the floor."""
    if expected_item_s is None:
        return floor_s
    return max(k * expected_item_s, floor_s)


__all__ = ["Eta", "EtaConfig", "EtaState", "Regime", "Segment", "Units", "stall_threshold_s"]


# The estimator's update, a bar update at a time, as functions (compiled, a call of one is a
# C call; a named tuple's method is looked up and called as Python's).


def eta_units(eta: EtaState, done: int) -> float:
    """Units done when `done` files are (`EtaState.x`)."""
    done = min(max(done, 0), eta.total_items)
    return float(done) if eta.cum is None else float(eta.cum[done])


def eta_advance(eta: EtaState, t: float, done: int) -> EtaState:
    """`EtaState.update`."""
    if done <= eta.last_done or t < eta.last_t:
        return eta
    done = min(done, eta.total_items)
    finished = eta.finished_at if done < eta.total_items else t
    dt = t - eta.open_t
    if dt <= 0.0 or (dt < eta.cfg.min_segment_s and done < eta.total_items):
        return _moved(eta, t, done, eta.open_t, eta.open_done, finished)
    x0, x1 = eta_units(eta, eta.open_done), eta_units(eta, done)
    if x1 <= x0:  # zero-byte files: no speed to learn from
        return _moved(eta, t, done, t, done, finished)
    regime, seg, changed = _fold(eta, t, x0, x1, done - eta.open_done)
    return _moved(
        eta,
        t,
        done,
        t,
        done,
        finished,
        regime,
        eta.recent[-(eta.cfg.window - 1) :] + (seg,),  # noqa: RUF005 (`_moved` says why)
        eta.serial + 1,
        eta.changes + (1 if changed else 0),
    )


def _moved(
    eta: EtaState,
    t: float,
    done: int,
    open_t: float,
    open_done: int,
    finished_at: float | None,
    regime: Regime | None = None,
    recent: tuple[Segment, ...] | None = None,
    serial: int | None = None,
    changes: int | None = None,
) -> EtaState:
    """The state after an update at `t` to `done` (the segment open from `open_t`), with a new
    segment in (`regime`, `recent`, `serial`, `changes`) or not (None: as they are)."""
    # total_items, cum, start_t and start_done as they are, the rest anew (concatenated:
    # compiled, a starred tuple display is built through a list)
    return new_tuple(
        EtaState,
        eta[:4]  # noqa: RUF005
        + (
            t,
            done,
            open_t,
            open_done,
            eta.regime if regime is None else regime,
            eta.recent if recent is None else recent,
            eta.serial if serial is None else serial,
            eta.changes if changes is None else changes,
            finished_at,
            eta.cfg,
        ),
    )


def _fold(
    eta: EtaState, t1: float, x0: float, x1: float, items: int
) -> tuple[Regime, Segment, bool]:
    """The segment from the open one to (t1, x1), tested against the regime and added."""
    cfg = eta.cfg
    r = eta.regime
    t0 = eta.open_t
    if r is None:
        seg = new_tuple(Segment, (eta.serial, t0, t1, x0, x1, items, 0.0))
        return regime_from((seg,), cfg.prior_sigma), seg, False
    predicted = regime_predict(r, items, x1 - x0, cfg)
    resid = math.log((t1 - t0) / predicted) if predicted > 0 else 0.0
    seg = new_tuple(Segment, (eta.serial, t0, t1, x0, x1, items, resid))
    sigma = regime_sigma(r, cfg)
    # The fit is itself uncertain while the regime is young.
    z = resid / (sigma * math.sqrt(1.0 + 1.0 / r.n))
    pos = max(0.0, r.cusum_pos + z - cfg.cusum_k)
    neg = max(0.0, r.cusum_neg - z - cfg.cusum_k)
    pos_from = seg.serial if r.cusum_pos == 0.0 else r.pos_from
    neg_from = seg.serial if r.cusum_neg == 0.0 else r.neg_from
    if pos > cfg.cusum_h or neg > cfg.cusum_h:
        since = pos_from if pos > cfg.cusum_h else neg_from
        run = tuple(s for s in (*eta.recent, seg) if s.serial >= since) or (seg,)
        return regime_from(run[change_point(run) :], sigma), seg, True
    return regime_add(r, seg, None, (pos, neg, pos_from, neg_from)), seg, False


def _item_cost(eta: EtaState, done: int) -> float | None:
    """Predicted seconds for file number `done + 1`."""
    if done >= eta.total_items:
        return None
    size = eta_units(eta, done + 1) - eta_units(eta, done)
    if eta.regime is not None:
        return regime_predict(eta.regime, 1, size, eta.cfg)
    rate = eta.rate()
    return size / rate if rate else None


def item_seconds(eta: EtaState) -> float | None:
    """`EtaState.item_seconds`."""
    # (asked at each fold while a bar loads: a list and the fields, no generator or property)
    per = [(s.t1 - s.t0) / s.items for s in eta.recent[-9:] if s.items > 0]
    per.sort()
    if not per:
        return None
    return per[len(per) // 2]


def next_item_seconds(eta: EtaState) -> float | None:
    """`EtaState.next_item_seconds` (the stall check's, after every run of input)."""
    typical = item_seconds(eta)
    cost = _item_cost(eta, eta.last_done) if eta.cum is not None else None
    if cost is None:
        return typical
    return cost if typical is None else max(cost, typical)


def eta_update(eta: EtaState, t: float, ev: ShardProgress) -> EtaState:
    """The estimator after a bar update at `t`. Updates read in one burst (a backlog, a busy
    moment) all happen at one instant of the daemon's clock, which then times nothing: until
    it has, the bar's own elapsed time (a duration, never a stamp) anchors the estimator."""
    if eta.regime is None and eta.last_t >= t:
        took = tqdm_elapsed_s(ev)
        if took is not None:
            return EtaState.start(t, ev.done, ev.total, eta.cum, took, eta.cfg)
    return eta_advance(eta, t, ev.done)


def tqdm_elapsed_s(ev: ShardProgress) -> float | None:
    """How long the bar has run by its own numbers: its elapsed time, or under a second (tqdm
    prints whole seconds) the files done at its rate."""
    if ev.done <= 0:
        return None
    if ev.elapsed_s is not None and ev.elapsed_s >= 1.0:
        return ev.elapsed_s
    if ev.rate_per_s is not None and ev.rate_per_s > 0:
        return ev.done / ev.rate_per_s
    return ev.elapsed_s or None
