"""Stalls (raised from silence, cleared by progress) and the OOM forecast, fed as event lists."""

from __future__ import annotations

import pytest

from loadwatch.daemon.sources.inputs import Tick
from loadwatch.daemon.state.loadstate import LoadState

from .helpers import GIB, T0, bar, fold, gpu, io, kinds, model, ms, phases, started


def _steady(n: int = 20, every: float = 5.0, upto: int = 8) -> list[tuple[float, object]]:
    out: list[tuple[float, object]] = [(T0, started(T0)), (T0 + 1, bar(0, n))]
    out += [(T0 + 1 + every * i, bar(i, n)) for i in range(1, upto + 1)]
    return out


def _ticks(start: float, end: float, step: float = 1.0) -> list[tuple[float, object]]:
    out: list[tuple[float, object]] = []
    t = start
    while t <= end:
        out.append((t, Tick()))
        t += step
    return out


def test_stall_raised_after_k_typical_shards_and_cleared_by_progress() -> None:
    items = _steady()  # 8 files, one every 5 s; the last at T0 + 41
    items += _ticks(T0 + 42, T0 + 75)
    st, tr = fold(items, stall_k=5.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    raised = [t for t in tr if t.kind == "stall_raised"]
    assert len(raised) == 1
    assert raised[0].threshold_s == pytest.approx(25.0, rel=0.05)
    assert raised[0].since == pytest.approx(T0 + 41)
    assert raised[0].at == pytest.approx(T0 + 67, abs=1.01)
    snap = st.snapshot(T0 + 75)
    assert snap.phase == "stalled"
    assert snap.session is not None and snap.session.stall.active
    assert snap.session.stall.silent_s == pytest.approx(34.0)
    st, tr = fold([(T0 + 80, bar(9, 20))], st)
    assert kinds(tr) == ["stall_cleared", "phase"]
    assert phases(tr) == ["loading_weights"]
    assert tr[0].duration_s == pytest.approx(39.0)
    snap = st.snapshot(T0 + 80)
    assert snap.session is not None and not snap.session.stall.active
    assert snap.session.stall.stalls_total == 1
    assert [h.phase for h in snap.session.history][-3:] == [
        "loading_weights",
        "stalled",
        "loading_weights",
    ]


def test_the_floor_holds_for_fast_shards() -> None:
    items = _steady(every=1.0) + _ticks(T0 + 10, T0 + 40)
    _st, tr = fold(items, stall_k=5.0, stall_floor_s=30.0)  # type: ignore[arg-type]
    (raised,) = [t for t in tr if t.kind == "stall_raised"]
    assert raised.threshold_s == 30.0


def test_files_read_in_one_burst_are_timed_by_the_bars_own_rate() -> None:
    # The daemon was busy: nine files arrive at one instant, too close for it to time them. The
    # bar's rate (5 files/s) says what a file takes, so the stall comes after k x 0.2 s (floor
    # 2 s), not after the wait allowed before the first file.
    items: list[tuple[float, object]] = [(T0, started(T0)), (T0 + 2, bar(0, 24))]
    items += [(T0 + 2, bar(i, 24, rate_per_s=5.0, elapsed_s=1.0)) for i in range(1, 10)]
    items += _ticks(T0 + 3, T0 + 10)
    _st, tr = fold(items, stall_k=5.0, stall_floor_s=2.0)  # type: ignore[arg-type]
    (raised,) = [t for t in tr if t.kind == "stall_raised"]
    assert raised.threshold_s == pytest.approx(2.0)
    assert raised.since == pytest.approx(T0 + 2)
    assert raised.at == pytest.approx(T0 + 5)
    # with only the elapsed time (`s/it` shown as `?`), elapsed / done gives 10 s a file
    items = [(T0, started(T0)), (T0 + 2, bar(0, 24))]
    items += [(T0 + 2, bar(i, 24, elapsed_s=90.0)) for i in range(1, 10)]
    items += _ticks(T0 + 3, T0 + 60)
    _st, tr = fold(items, stall_k=5.0, stall_floor_s=2.0)  # type: ignore[arg-type]
    (raised,) = [t for t in tr if t.kind == "stall_raised"]
    assert raised.threshold_s == pytest.approx(50.0)
    # before any file is done there is no rate: the first-file allowance holds
    items = [(T0, started(T0)), (T0 + 1, bar(0, 24)), *_ticks(T0 + 2, T0 + 60)]
    _st, tr = fold(items, stall_k=5.0, stall_floor_s=2.0)  # type: ignore[arg-type]
    assert "stall_raised" not in kinds(tr)


def test_bytes_still_arriving_mean_a_slow_shard_not_a_stall() -> None:
    items = [*_steady(), (T0 + 41, io(T0 + 41, 0))]
    for i in range(1, 60):  # 60 s with no line, but 50 MB/s being read
        items.append((T0 + 41 + i, io(T0 + 41 + i, i * 50_000_000)))
        items.append((T0 + 41 + i, Tick()))
    st, tr = fold(items, stall_k=5.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    assert "stall_raised" not in kinds(tr)
    # and when the bytes stop too, it is a stall
    last = 59 * 50_000_000
    more = [(T0 + 100 + i, io(T0 + 100 + i, last)) for i in range(40)]
    st, tr = fold(more, st)  # type: ignore[arg-type]
    assert "stall_raised" in kinds(tr)
    st, tr = fold([(T0 + 141, io(T0 + 141, last + 100_000_000))], st)
    assert kinds(tr)[:2] == ["stall_cleared", "phase"] and tr[0].reason == "bytes read again"


def test_a_big_file_is_given_the_time_its_size_needs() -> None:
    sizes = [GIB] * 8 + [20 * GIB] + [GIB] * 11
    items = [(T0, model(sizes)), *_steady()]
    items += _ticks(T0 + 42, T0 + 140)  # file 9 is 20x the others: 100 s at this speed
    _st, tr = fold(items, stall_k=3.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    assert "stall_raised" not in kinds(tr)


def test_quiet_stall_after_loading_and_cleared_by_any_line() -> None:
    items: list[tuple[float, object]] = [
        (T0, started(T0)),
        (T0 + 1, ms("model_memory", gib=10.0)),
        *_ticks(T0 + 2, T0 + 130, 5.0),
    ]
    st, tr = fold(items, quiet_stall_s=100.0)  # type: ignore[arg-type]
    (raised,) = [t for t in tr if t.kind == "stall_raised"]
    assert raised.threshold_s == 100.0
    assert st.session is not None and st.session.stall is not None
    assert st.session.stall.kind == "quiet" and st.session.stall.resume_phase == "post_load"
    st, tr = fold([(T0 + 140, ms("torch_compile", detail="total", seconds=120.0))], st)
    assert kinds(tr) == ["stall_cleared", "phase"] and phases(tr) == ["post_load"]


def test_no_stall_once_ready_or_ended_and_none_without_ticks() -> None:
    items: list[tuple[float, object]] = [
        (T0, started(T0)),
        (T0 + 1, ms("app_startup_complete")),
        *_ticks(T0 + 2, T0 + 5000, 100.0),
    ]
    _, tr = fold(items, quiet_stall_s=100.0)  # type: ignore[arg-type]
    assert "stall_raised" not in kinds(tr)


def test_failure_during_a_stall_ends_the_stall() -> None:
    items = _steady() + _ticks(T0 + 42, T0 + 75)
    st, _ = fold(items, stall_k=5.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    from .helpers import fail

    st, tr = fold([(T0 + 80, fail("nccl", "NCCL error: unhandled system error"))], st)
    assert "stall_cleared" in kinds(tr) and phases(tr)[-1] == "failed"
    assert st.session is not None and st.session.stall is None


# -- OOM forecast -------------------------------------------------------------------------------


def _memory_load(
    final_ratio: float, n: int = 40, total: float = 80 * GIB, emb: float = 3 * GIB
) -> list[tuple[float, object]]:
    """A load with `n` equal files, 2 s each, memory sampled every second: a base, a step of
    replicated embeddings in the first file, then linear in the bytes loaded."""
    sizes = [4 * GIB] * n
    base = 1 * GIB
    slope = final_ratio * total - base - emb
    items: list[tuple[float, object]] = [(T0, started(T0)), (T0, model(sizes)), (T0 + 1, bar(0, n))]
    t0 = T0 + 1
    for sec in range(2 * n + 1):
        t = t0 + sec
        frac = min(sec / (2 * n), 1.0)
        used = base + (emb if sec >= 2 else emb * sec / 2) + slope * frac
        if sec > 0 and sec % 2 == 0:
            items.append((t, bar(sec // 2, n)))
        items.append((t + 0.5, gpu(t + 0.5, min(used, total), total, n=2)))
    return items


def test_oom_predicted_early_with_the_shortfall() -> None:
    # would need 120% of the GPU: overflow at about 83% of the load
    st, tr = fold(_memory_load(1.2)[:60])  # type: ignore[arg-type]
    raised = [t for t in tr if t.kind == "forecast_raised"]
    assert {t.gpu_index for t in raised} == {0, 1}
    first = raised[0]
    assert first.fraction is not None and first.fraction < 0.3
    assert first.shortfall_bytes == pytest.approx(0.2 * 80 * GIB, rel=0.1)
    snap = st.snapshot(T0 + 60)
    g0 = snap.gpus[0]
    assert g0.oom_predicted and g0.oom_predicted_since == first.at
    assert g0.projected_final_bytes == pytest.approx(1.2 * 80 * GIB, rel=0.05)
    assert g0.shortfall_bytes is not None and g0.shortfall_bytes > 0


@pytest.mark.parametrize("final", [0.6, 0.9, 0.97])
def test_no_oom_alarm_when_the_load_fits(final: float) -> None:
    _, tr = fold(_memory_load(final))  # type: ignore[arg-type]
    assert "forecast_raised" not in kinds(tr)


def test_embedding_step_does_not_fool_the_projection() -> None:
    # 12 GiB of replicated embeddings in the first of 40 files: a line from the start would
    # project 12 GiB x 40 = far beyond the GPU.
    _st, tr = fold(_memory_load(0.9, emb=12 * GIB))  # type: ignore[arg-type]
    assert "forecast_raised" not in kinds(tr)


def test_no_oom_alarm_from_counted_files() -> None:
    items = [x for x in _memory_load(1.3) if not hasattr(x[1], "shards")]
    st, tr = fold(items[:60])  # type: ignore[arg-type]
    assert "forecast_raised" not in kinds(tr)
    snap = st.snapshot(T0 + 60)
    assert snap.gpus[0].projected_final_bytes is not None  # still projected, just no alarm


def test_oom_forecast_clears_when_the_weights_are_in() -> None:
    st, tr = fold(_memory_load(1.2)[:60])  # type: ignore[arg-type]
    st, tr = fold([(T0 + 90, ms("model_memory", gib=70.0))], st)
    assert [t.kind for t in tr if t.kind.startswith("forecast")] == ["forecast_cleared"] * 2
    assert all(t.reason == "weights loaded" for t in tr if t.kind == "forecast_cleared")
    assert not LoadState().snapshot(T0).gpus
    assert not any(g.oom_predicted for g in st.snapshot(T0 + 90).gpus)
