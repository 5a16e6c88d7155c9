"""Estimators for a weight load: time left, and when silence means a stall.

Everything here is pure: immutable values in, new immutable values out, time passed in. (The
final memory: memfit.py.)

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
from dataclasses import dataclass, fields
from typing import Literal, NamedTuple

from loadwatch.daemon.state.records import new_tuple

Units = Literal["bytes", "items"]
Cusum = tuple[float, float, int, int]  # (upward sum, downward sum, where each run began)


class _Record:
    """The dataclasses here copy and pickle through their constructor: compiled (mypyc), they
    are native classes without `__dict__`, which `copy` and `pickle` would write. (The records
    made per bar update are named tuples (`new_tuple`): compiled, a frozen dataclass is built
    through a Python-level `__init__` that sets each field, several times slower.)"""

    __slots__ = ()

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in fields(self))  # type: ignore[arg-type]


# -- time left ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EtaConfig(_Record):
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
        n, x, t = float(seg.items), seg.x1 - seg.x0, seg.t1 - seg.t0
        r = seg.resid if resid is None else resid
        pos, neg, pos_from, neg_from = (
            cusum
            if cusum is not None
            else (self.cusum_pos, self.cusum_neg, self.pos_from, self.neg_from)
        )
        return new_tuple(
            Regime,
            (
                self.n + 1,
                self.s_nn + n * n,
                self.s_nx + n * x,
                self.s_xx + x * x,
                self.s_nt + n * t,
                self.s_xt + x * t,
                self.t_sum + t,
                self.x_sum + x,
                self.r2_sum + r * r,
                self.sigma_prior,
                pos,
                neg,
                pos_from,
                neg_from,
                self.tested_from,
            ),
        )

    def coef(self, cfg: EtaConfig) -> tuple[float, float]:
        """(seconds per file, seconds per unit)."""
        ratio = (0.0, self.t_sum / self.x_sum)
        if self.n < 3:
            return ratio
        a11 = self.s_nn * (1.0 + cfg.ridge)
        det = a11 * self.s_xx - self.s_nx * self.s_nx
        if det <= 0.0:
            return ratio
        a = (self.s_nt * self.s_xx - self.s_nx * self.s_xt) / det
        b = (a11 * self.s_xt - self.s_nx * self.s_nt) / det
        if a < 0.0 or b <= 0.0:
            return ratio
        return a, b

    def predict(self, items: float, units: float, cfg: EtaConfig) -> float:
        a, b = self.coef(cfg)
        return a * items + b * units

    @property
    def rate(self) -> float:
        """Units per second over the regime."""
        return self.x_sum / self.t_sum

    def sigma(self, cfg: EtaConfig) -> float:
        w = cfg.prior_weight
        var = (w * self.sigma_prior**2 + self.r2_sum) / (w + self.n)
        return max(cfg.min_sigma, math.sqrt(var))


def _split(run: tuple[Segment, ...]) -> int:
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


def _regime_from(segments: tuple[Segment, ...], sigma_prior: float) -> Regime:
    r = Regime(sigma_prior=sigma_prior)
    for seg in segments:
        r = r.add(seg, resid=0.0)
    nxt = segments[-1].serial + 1
    return r._replace(pos_from=nxt, neg_from=nxt, tested_from=nxt)


@dataclass(frozen=True, slots=True)
class Eta(_Record):
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
        done = min(max(done, 0), self.total_items)
        return float(done) if self.cum is None else float(self.cum[done])

    @property
    def total(self) -> float:
        return self.x(self.total_items)

    def update(self, t: float, done: int) -> EtaState:
        """A bar update. Repeats and regressions are ignored (the caller starts a new bar)."""
        if done <= self.last_done or t < self.last_t:
            return self
        done = min(done, self.total_items)
        finished = self.finished_at if done < self.total_items else t
        dt = t - self.open_t
        if dt <= 0.0 or (dt < self.cfg.min_segment_s and done < self.total_items):
            return self._moved(t, done, self.open_t, self.open_done, finished)
        x0, x1 = self.x(self.open_done), self.x(done)
        if x1 <= x0:  # zero-byte files: no speed to learn from
            return self._moved(t, done, t, done, finished)
        regime, seg, changed = self._fold(t, x0, x1, done - self.open_done)
        return self._moved(
            t,
            done,
            t,
            done,
            finished,
            regime,
            self.recent[-(self.cfg.window - 1) :] + (seg,),  # noqa: RUF005 (`_moved` says why)
            self.serial + 1,
            self.changes + (1 if changed else 0),
        )

    def _moved(
        self,
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
        """The state after an update at `t` to `done` (the segment open from `open_t`), with a
        new segment in (`regime`, `recent`, `serial`, `changes`) or not (None: as they are)."""
        # total_items, cum, start_t and start_done as they are, the rest anew (concatenated:
        # compiled, a starred tuple display is built through a list)
        return new_tuple(
            EtaState,
            self[:4]  # noqa: RUF005
            + (
                t,
                done,
                open_t,
                open_done,
                self.regime if regime is None else regime,
                self.recent if recent is None else recent,
                self.serial if serial is None else serial,
                self.changes if changes is None else changes,
                finished_at,
                self.cfg,
            ),
        )

    def _fold(self, t1: float, x0: float, x1: float, items: int) -> tuple[Regime, Segment, bool]:
        """The segment from the open one to (t1, x1), tested against the regime and added."""
        cfg = self.cfg
        r = self.regime
        t0 = self.open_t
        if r is None:
            seg = new_tuple(Segment, (self.serial, t0, t1, x0, x1, items, 0.0))
            return _regime_from((seg,), cfg.prior_sigma), seg, False
        predicted = r.predict(items, x1 - x0, cfg)
        resid = math.log((t1 - t0) / predicted) if predicted > 0 else 0.0
        seg = new_tuple(Segment, (self.serial, t0, t1, x0, x1, items, resid))
        sigma = r.sigma(cfg)
        # The fit is itself uncertain while the regime is young.
        z = resid / (sigma * math.sqrt(1.0 + 1.0 / r.n))
        pos = max(0.0, r.cusum_pos + z - cfg.cusum_k)
        neg = max(0.0, r.cusum_neg - z - cfg.cusum_k)
        pos_from = seg.serial if r.cusum_pos == 0.0 else r.pos_from
        neg_from = seg.serial if r.cusum_neg == 0.0 else r.neg_from
        if pos > cfg.cusum_h or neg > cfg.cusum_h:
            since = pos_from if pos > cfg.cusum_h else neg_from
            run = tuple(s for s in (*self.recent, seg) if s.serial >= since) or (seg,)
            return _regime_from(run[_split(run) :], sigma), seg, True
        regime = r.add(seg, cusum=(pos, neg, pos_from, neg_from))
        return regime, seg, False

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

    def _item_cost(self, done: int) -> float | None:
        """Predicted seconds for file number `done + 1`."""
        if done >= self.total_items:
            return None
        size = self.x(done + 1) - self.x(done)
        if self.regime is not None:
            return self.regime.predict(1, size, self.cfg)
        rate = self.rate()
        return size / rate if rate else None

    def item_seconds(self) -> float | None:
        """Typical seconds per file lately (median over the recent segments)."""
        # (asked at each fold while a bar loads: a list and the fields, no generator or property)
        per = [(s.t1 - s.t0) / s.items for s in self.recent[-9:] if s.items > 0]
        per.sort()
        if not per:
            return None
        return per[len(per) // 2]

    def next_item_seconds(self) -> float | None:
        """How long the file in progress should take: by its size when sizes are known, and
        never less than the typical time per file."""
        typical = self.item_seconds()
        cost = self._item_cost(self.last_done) if self.cum is not None else None
        if cost is None:
            return typical
        return cost if typical is None else max(cost, typical)

    def _in_file(self, now: float, read_bytes_since_update: int | None) -> float:
        """Share of the file in progress done at `now`, from bytes read (bytes mode) or from
        the time spent on it; never the whole file without the bar saying so."""
        if self.finished_at is not None or self.last_done >= self.total_items:
            return 0.0
        size = self.x(self.last_done + 1) - self.x(self.last_done)
        if self.cum is not None and read_bytes_since_update and size > 0:
            share = read_bytes_since_update / size
        else:
            cost = self._item_cost(self.last_done)
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


def eta_update(eta: EtaState, t: float, ev: ShardProgress) -> EtaState:
    """The estimator after a bar update at `t`. Updates read in one burst (a backlog, a busy
    moment) all happen at one instant of the daemon's clock, which then times nothing: until
    it has, the bar's own elapsed time (a duration, never a stamp) anchors the estimator."""
    if eta.regime is None and eta.last_t >= t:
        took = tqdm_elapsed_s(ev)
        if took is not None:
            return EtaState.start(t, ev.done, ev.total, eta.cum, took, eta.cfg)
    return eta.update(t, ev.done)


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
