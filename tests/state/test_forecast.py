"""The estimators on their own: time left, final memory, stall threshold; and the trace
generator's copy of tqdm's arithmetic that the benchmark compares against."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.state.forecast import EtaConfig, EtaState, stall_threshold_s
from loadwatch.daemon.state.memfit import MemoryFit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import traces


def _cum(sizes: list[int]) -> tuple[int, ...]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + s)
    return tuple(out)


def _run(
    sizes: list[int], speeds: list[float], overhead: float = 0.0, upto: int | None = None
) -> EtaState:
    """Feed one bar where file i loads at speeds[i] units/s."""
    eta = EtaState.start(0.0, 0, len(sizes), _cum(sizes))
    t = 0.0
    for i, (size, v) in enumerate(zip(sizes, speeds, strict=True)):
        if upto is not None and i >= upto:
            break
        t += overhead + size / v
        eta = eta.update(t, i + 1)
    return eta


def test_steady_speed_is_exact_and_the_range_holds_it() -> None:
    sizes = [100] * 20
    eta = _run(sizes, [50.0] * 20, upto=5)
    est = eta.estimate(eta.last_t)
    assert est is not None
    assert est.remaining_s == pytest.approx(30.0)
    assert est.low_s <= 30.0 <= est.high_s
    assert eta.changes == 0


def test_unequal_files_are_weighed_by_bytes() -> None:
    sizes = [800, 100, 100, 100, 900, 100]
    eta = _run(sizes, [100.0] * 6, upto=3)
    est = eta.estimate(eta.last_t)
    assert est is not None and est.units == "bytes"
    assert est.remaining_s == pytest.approx(11.0)  # 1100 units at 100/s


def test_per_file_cost_is_learnt_when_sizes_vary() -> None:
    rng = random.Random(3)
    sizes = [rng.randint(100, 1000) for _ in range(40)]
    eta = _run(sizes, [100.0] * 40, overhead=2.0, upto=25)
    assert eta.regime is not None
    a, b = eta.regime.coef(eta.cfg)
    assert a == pytest.approx(2.0, rel=0.05) and b == pytest.approx(0.01, rel=0.05)
    est = eta.estimate(eta.last_t)
    truth = sum(2.0 + s / 100 for s in sizes[25:])
    assert est is not None and est.remaining_s == pytest.approx(truth, rel=0.01)


def test_speed_change_is_found_and_the_new_regime_starts_where_it_began() -> None:
    sizes = [100] * 40
    speeds = [50.0] * 15 + [200.0] * 25  # the cache turned warm at file 16
    eta = _run(sizes, speeds, upto=18)
    assert eta.changes == 1
    assert eta.regime is not None and eta.regime.rate == pytest.approx(200.0)
    est = eta.estimate(eta.last_t)
    assert est is not None and est.remaining_s == pytest.approx(22 * 0.5)


def test_noise_alone_does_not_look_like_a_change() -> None:
    rng = random.Random(7)
    sizes = [100] * 200
    speeds = [50.0 * math.exp(rng.gauss(0, 0.15)) for _ in sizes]
    eta = _run(sizes, speeds)
    assert eta.changes == 0


def test_short_segments_are_merged() -> None:
    eta = EtaState.start(0.0, 0, 10, None, cfg=EtaConfig(min_segment_s=1.0))
    for i, t in enumerate([0.3, 0.6, 0.9, 1.2], 1):
        eta = eta.update(t, i)
    assert len(eta.recent) == 1 and eta.recent[0].items == 4
    assert eta.update(1.2, 4) is eta  # a repeated line changes nothing


def test_position_between_lines_is_capped_inside_the_file() -> None:
    eta = _run([100] * 4, [10.0] * 4, upto=1)  # 10 s per file
    assert eta.position(eta.last_t + 5) == pytest.approx(150.0)
    assert eta.position(eta.last_t + 500) == pytest.approx(195.0)  # never the whole file
    assert eta.position(eta.last_t + 1, read_bytes_since_update=80) == pytest.approx(180.0)


def test_memory_projection_skips_the_first_file_step() -> None:
    fit = MemoryFit(skip_below=0.02)
    for i in range(0, 41):
        f = i / 100
        used = 1e9 + (10e9 if f >= 0.02 else 0.0) + 50e9 * f
        fit = fit.add(f, used)
    p = fit.project()
    assert p is not None
    assert p.final_bytes == pytest.approx(61e9, rel=0.01)
    assert p.low_bytes <= p.final_bytes <= p.high_bytes
    assert MemoryFit().add(0.01, 1e9).project() is None  # too early to say


def test_stall_threshold() -> None:
    assert stall_threshold_s(None, 5, 60) == 60
    assert stall_threshold_s(4.0, 5, 10) == 20
    assert stall_threshold_s(1.0, 5, 10) == 10


def test_tqdm_copy_prints_what_tqdm_prints() -> None:
    bar = traces.TqdmBar(10, 100.0)
    assert bar.line(100.0).endswith("0/10 [00:00<?, ?it/s]")
    assert bar.update(102.5) is not None  # 1 file in 2.5 s
    line = bar.line(102.5)
    # rate 0.4 it/s -> 9 / 0.4 = 22.5 s, printed truncated
    assert line.endswith("1/10 [00:02<00:22,  2.50s/it]")
    assert line.startswith("Loading safetensors checkpoint shards:  10% Completed | ")
    # EMA (0.3, bias-corrected) of dt over two refreshes: 2.5 then 0.5
    bar.update(103.0)
    ema = (0.3 * 0.5 + 0.7 * 0.3 * 2.5) / (1 - 0.7**2)
    assert bar.line(103.0).endswith(f"2/10 [00:03<00:{int(8 * ema):02d}, {ema:5.2f}s/it]")
    assert bar.update(103.05) is None  # within mininterval: not printed
    assert bar.n == 3
