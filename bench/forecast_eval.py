"""Replay seeded load traces through LoadState and score its forecasts against tqdm and the truth.

    .venv/bin/python bench/forecast_eval.py [--seeds 12] [--json out.json]

Per trace:
- ETA: at the first bar line at or past 10%, 20%, ... 90% of the files, the absolute error of our
  time left (snapshot right after that line) and of the time left tqdm printed on that line,
  against the true time to the bar's last line. Score: median error ours / median error tqdm
  (and the same for the 90th percentile). Also how often the truth fell inside our low..high.
  For scale, an oracle is scored the same way: it knows the trace's true mean time per file
  (speed, overhead and noise level) and only not the noise still to come, so no estimator can
  beat it on average. Its ratios show how much of a trace's score is the luck of the noise.
- OOM (oom traces): lead = time from the first `forecast_raised` to the overflow, and the share
  of the load still to go at that moment (1 - true bytes fraction). False alarms: any OOM
  forecast on a trace whose load fits.
- Stall (stall traces): delay from the last byte read before the hang to `stall_raised`, divided
  by the configured threshold max(k x typical shard time, floor) taken from the truth. False
  stalls: any stall raised on a trace without one.

Kinds are run over several seeds. ETA scores are given two ways: pooled (every seed's points
together, then the ratio of the median, and of the 90th percentile, of the absolute errors) and
per trace (the ratio for each trace; worst and median across seeds). Per trace the ratio is
noisy: on a steady load both estimates end within a few seconds of the truth, and which one the
next few files' noise favours is luck; the oracle's worst trace shows how far luck alone goes. The last line is key=value pairs:
    eta_ratio_nonuniform   pooled median-error ratio, non-uniform shards (goal <= 0.5)
    eta_ratio_uniform      pooled median-error ratio, equal shards at a steady speed (goal <= 1.1)
    oom_lead_fraction_min  smallest share of the load still to go at the first OOM forecast
                           (goal >= 0.3)
    false_oom              traces that fit but got an OOM forecast (goal 0)
    stall_delay_ratio_max  largest stall delay / configured threshold (goal <= 2)
then: the pooled p90 ratios, the worst single trace of each ETA kind, the worst pooled ratio
after a speed change (cold_warm, warm_cold, slowdown), false stalls, and the seed count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import traces

from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.parsers.events import ShardProgress

ETA_KINDS = ("uniform", "nonuniform", "cold_warm", "warm_cold", "slowdown")
POINTS = tuple(p / 10 for p in range(1, 10))


@dataclass
class Result:
    kind: str
    seed: int
    uniform: bool
    with_model: bool
    err_ours: list[float] = field(default_factory=list)
    err_tqdm: list[float] = field(default_factory=list)
    err_oracle: list[float] = field(default_factory=list)
    after_change: list[bool] = field(default_factory=list)  # point after the speed changed
    covered: int = 0
    oom_lead_s: float | None = None
    oom_lead_fraction: float | None = None
    oom_missed: bool = False
    false_oom: int = 0
    stall_delay_ratio: float | None = None
    stall_missed: bool = False
    false_stall: int = 0
    inputs: int = 0
    fold_s: float = 0.0
    err_nonhead: list[float] = field(default_factory=list)  # a node without the bar

    def ratio(self, q: float, oracle: bool = False) -> float | None:
        if not self.err_ours:
            return None
        ours = _quantile(self.err_oracle if oracle else self.err_ours, q)
        theirs = _quantile(self.err_tqdm, q)
        return ours / max(theirs, 1e-9)


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def evaluate(kind: str, seed: int, with_model: bool = True) -> Result:
    tr = traces.generate(kind, seed, with_model=with_model)
    truth = tr.truth
    res = Result(kind, seed, truth.uniform_sizes, with_model)
    state = LoadState(config=tr.config)
    points = list(POINTS)
    started = time.perf_counter()
    for now, item in tr.inputs:
        state = state.apply(item, now)
        for t in state.transitions:
            if t.kind == "forecast_raised":
                if truth.oom_t is None:
                    res.false_oom += 1
                elif res.oom_lead_s is None:
                    res.oom_lead_s = truth.oom_t - t.at
                    res.oom_lead_fraction = 1.0 - truth.fraction_at(t.at)
            elif t.kind == "stall_raised":
                if truth.stall_start_t is None or t.at < truth.stall_start_t:
                    res.false_stall += 1
                elif res.stall_delay_ratio is None and truth.stall_threshold_s:
                    delay = t.at - truth.stall_start_t
                    res.stall_delay_ratio = delay / truth.stall_threshold_s
        if (
            isinstance(item, ShardProgress)
            and item.bar == "weights"
            and truth.bar_end_t is not None
            and kind in ETA_KINDS
            and points
            and item.total
            and item.done < item.total
            and item.done / item.total >= points[0]
        ):
            while points and item.done / item.total >= points[0]:
                points.pop(0)
            actual = truth.bar_end_t - now
            snap = state.snapshot(now)
            assert snap.session is not None
            eta = snap.session.progress.eta
            ours = eta.remaining_s if eta is not None else 0.0
            if eta is not None and eta.low_s <= actual <= eta.high_s:
                res.covered += 1
            tqdm = item.remaining_s if item.remaining_s is not None else 0.0
            res.err_ours.append(abs(ours - actual))
            res.err_tqdm.append(abs(tqdm - actual))
            # the oracle: the mean time of the files still to load, less the time already spent
            # on the file in progress (the line was logged a little after the file ended)
            into = now - truth.shard_end_t[item.done - 1] if item.done else 0.0
            oracle = sum(truth.expected_shard_s[item.done :]) - into
            res.err_oracle.append(abs(oracle - actual))
            res.after_change.append(truth.switch_t is not None and now > truth.switch_t)
    res.fold_s = time.perf_counter() - started
    res.inputs = len(tr.inputs)
    if kind in ETA_KINDS and truth.bar_end_t is not None:
        res.err_nonhead = nonhead_errors(tr)
    if truth.oom_t is not None and res.oom_lead_s is None:
        res.oom_missed = True
    if truth.stall_start_t is not None and res.stall_delay_ratio is None:
        res.stall_missed = True
    return res


def nonhead_errors(tr: traces.Trace) -> list[float]:
    """The same load seen by a node that prints no bar (every node but global rank 0): the
    trace without its bar lines, so the node's ETA comes from its bytes read and GPU memory
    (daemon/state/nodeprogress.py). Scored at the times the bar crossed 10%, 20%, ... 90%,
    against the true time to the load's end."""
    truth = tr.truth
    assert truth.bar_end_t is not None
    marks: list[float] = []
    points = list(POINTS)
    for now, item in tr.inputs:
        if (
            isinstance(item, ShardProgress)
            and item.bar == "weights"
            and points
            and 0 < item.total > item.done
            and item.done / item.total >= points[0]
        ):
            while points and item.done / item.total >= points[0]:
                points.pop(0)
            marks.append(now)
    state = LoadState(config=tr.config)
    errors: list[float] = []
    for now, item in tr.inputs:
        if isinstance(item, ShardProgress) and item.bar == "weights":
            continue
        state = state.apply(item, now)
        while marks and now >= marks[0]:
            marks.pop(0)
            node = state.snapshot(now).node
            eta = node.progress.eta_s if node is not None else None
            errors.append(abs((eta if eta is not None else 0.0) - (truth.bar_end_t - now)))
    return errors


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _worst_med(xs: list[float], worst: str) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    w = max(xs) if worst == "max" else min(xs)
    return w, statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=12, help="seeds per trace kind (default 12)")
    ap.add_argument("--json", type=Path, help="also write every per-trace result here")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        print("forecast_eval: --seeds must be at least 1", file=sys.stderr)
        return 2

    runs: list[tuple[str, list[Result]]] = []
    for kind in traces.KINDS:
        runs.append((kind, [evaluate(kind, s) for s in range(args.seeds)]))
    # The same non-uniform loads without the model directory: files counted, not weighed.
    runs.append(
        ("nonuniform (no sizes)", [evaluate("nonuniform", s, False) for s in range(args.seeds)])
    )

    head = (
        f"{'kind':<22} {'n':>3}  {'eta ratio med':>13}  {'eta ratio p90':>13}  "
        f"{'per trace med':>13}  {'per trace p90':>13}  {'after chg':>9}  {'in range':>8}  "
        f"{'oom lead frac':>13}  {'oom lead s':>11}  {'false oom':>9}  "
        f"{'stall delay/thr':>15}  {'false stall':>11}  {'us/input':>8}  "
        f"{'oracle med':>10}  {'oracle per trace':>16}"
    )
    print(head)
    print("-" * len(head))
    all_results: list[Result] = []
    pooled: dict[str, tuple[float | None, float | None]] = {}
    oracles: dict[str, tuple[float | None, float | None]] = {}
    for kind, results in runs:
        all_results.extend(results)
        med = [x for r in results if (x := r.ratio(0.5)) is not None]
        p90 = [x for r in results if (x := r.ratio(0.9)) is not None]
        ours = [e for r in results for e in r.err_ours]
        theirs = [e for r in results for e in r.err_tqdm]
        oracle = [e for r in results for e in r.err_oracle]
        om = _pooled(oracle, theirs, 0.5)
        ow, omed = _worst_med([x for r in results if (x := r.ratio(0.5, True)) is not None], "max")
        oracles[kind] = (om, ow)
        pm = _pooled(ours, theirs, 0.5)
        pp = _pooled(ours, theirs, 0.9)
        pooled[kind] = (pm, pp)
        ac_ours = [e for r in results for e, a in zip(r.err_ours, r.after_change, strict=True) if a]
        ac_theirs = [
            e for r in results for e, a in zip(r.err_tqdm, r.after_change, strict=True) if a
        ]
        after = _pooled(ac_ours, ac_theirs, 0.5)
        if after is not None:
            pooled[kind + ":after"] = (after, None)
        cover = sum(r.covered for r in results) / len(ours) if ours else None
        lead_f = [r.oom_lead_fraction for r in results if r.oom_lead_fraction is not None]
        lead_s = [r.oom_lead_s for r in results if r.oom_lead_s is not None]
        stall = [r.stall_delay_ratio for r in results if r.stall_delay_ratio is not None]
        mw, mm = _worst_med(med, "max")
        pw, pmed = _worst_med(p90, "max")
        lw, lm = _worst_med(lead_f, "min")
        sw, sm = _worst_med(lead_s, "min")
        dw, dm = _worst_med(stall, "max")
        missed_oom = sum(r.oom_missed for r in results)
        missed_stall = sum(r.stall_missed for r in results)
        us = 1e6 * sum(r.fold_s for r in results) / max(sum(r.inputs for r in results), 1)
        print(
            f"{kind:<22} {len(results):>3}  {_fmt(pm):>13}  {_fmt(pp):>13}  "
            f"{_fmt(mw):>5} / {_fmt(mm):>5}  {_fmt(pw):>5} / {_fmt(pmed):>5}  "
            f"{_fmt(after):>9}  {_fmt(cover, '.0%'):>8}  "
            f"{_fmt(lw):>5} / {_fmt(lm):>5}  {_fmt(sw, '.0f'):>4} / {_fmt(sm, '.0f'):>4}  "
            f"{sum(r.false_oom > 0 for r in results):>9}  "
            f"{_fmt(dw):>6} / {_fmt(dm):>6}  {sum(r.false_stall > 0 for r in results):>11}  "
            f"{us:>8.0f}  {_fmt(om):>10}  {_fmt(ow):>7} / {_fmt(omed):>6}"
            + (f"  missed oom={missed_oom}" if missed_oom else "")
            + (f"  missed stall={missed_stall}" if missed_stall else "")
        )
    print(
        "eta ratio = our absolute error / tqdm's, pooled over every seed's 10%..90% points "
        "(median, p90);\nper trace = the same ratio for each trace, worst / median across "
        "seeds; after chg = pooled median ratio at the points after the speed changed;\n"
        "in range = share of points where the truth fell inside our low..high; oracle = the same "
        "ratios for an estimator\nthat knows each trace's true mean time per file (pooled median; "
        "per trace worst / median). Lower ratios are better."
    )

    print()
    print(
        f"{'kind':<22} {'head err med s':>14} {'non-head err med s':>18} "
        f"{'head err p90 s':>14} {'non-head err p90 s':>18}"
    )
    nonhead_med: list[float] = []
    head_med: list[float] = []
    for kind, results in runs:
        ours = [e for r in results for e in r.err_ours]
        nh = [e for r in results for e in r.err_nonhead]
        if not ours or not nh:
            continue
        head_med.append(_quantile(ours, 0.5))
        nonhead_med.append(_quantile(nh, 0.5))
        print(
            f"{kind:<22} {_quantile(ours, 0.5):>14.1f} {_quantile(nh, 0.5):>18.1f} "
            f"{_quantile(ours, 0.9):>14.1f} {_quantile(nh, 0.9):>18.1f}"
        )
    print(
        "non-head = the same load on a node that prints no bar: the ETA from its bytes read "
        "and GPU memory alone\n(loadwatch_node_eta_seconds); head = the bar's ETA above. "
        "Absolute errors against the true time to the load's end."
    )

    leads = [r.oom_lead_fraction for r in all_results if r.oom_lead_fraction is not None]
    missed = [r for r in all_results if r.oom_missed]
    stalls = [r.stall_delay_ratio for r in all_results if r.stall_delay_ratio is not None]
    stall_missed = [r for r in all_results if r.stall_missed]
    false_oom = sum(r.false_oom > 0 for r in all_results)
    false_stall = sum(r.false_stall > 0 for r in all_results)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in all_results], indent=1))
    lead_min = 0.0 if missed or not leads else min(leads)
    stall_max = float("inf") if stall_missed or not stalls else max(stalls)
    worst = {
        kind: max(x for r in results if (x := r.ratio(0.5)) is not None)
        for kind, results in runs
        if kind in ("uniform", "nonuniform")
    }
    speed = [pooled[k + ":after"][0] for k in ("cold_warm", "warm_cold", "slowdown")]
    print(
        f"eta_ratio_nonuniform={pooled['nonuniform'][0]:.3f} "
        f"eta_ratio_uniform={pooled['uniform'][0]:.3f} "
        f"oom_lead_fraction_min={lead_min:.3f} false_oom={false_oom} "
        f"stall_delay_ratio_max={stall_max:.3f} "
        f"eta_p90_ratio_nonuniform={pooled['nonuniform'][1]:.3f} "
        f"eta_p90_ratio_uniform={pooled['uniform'][1]:.3f} "
        f"eta_ratio_nonuniform_worst_trace={worst['nonuniform']:.3f} "
        f"eta_ratio_uniform_worst_trace={worst['uniform']:.3f} "
        f"eta_ratio_after_speed_change={max(x or 0.0 for x in speed):.3f} "
        f"oracle_ratio_uniform={oracles['uniform'][0]:.3f} "
        f"oracle_ratio_uniform_worst_trace={oracles['uniform'][1]:.3f} "
        f"false_stall={false_stall} seeds={args.seeds} "
        f"eta_err_med_s_head={statistics.median(head_med):.1f} "
        f"eta_err_med_s_nonhead={statistics.median(nonhead_med):.1f}"
    )
    return 0


def _pooled(ours: list[float], theirs: list[float], q: float) -> float | None:
    if not ours:
        return None
    return _quantile(ours, q) / max(_quantile(theirs, q), 1e-9)


if __name__ == "__main__":
    raise SystemExit(main())
