"""Progress bars: several per session, per process, bytes-weighted progress and the ETA."""

from __future__ import annotations

import pytest

from loadwatch.daemon.state.loadstate import LoadState

from .helpers import GIB, T0, bar, fold, io, model, ms, phases, started


def test_draft_model_bar_after_a_finished_bar_is_a_new_bar_not_a_regression() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, bar(0, 3)),
        (t + 2, bar(1, 3)),
        (t + 3, bar(3, 3)),
        (t + 3.001, bar(3, 3)),
        (t + 4, bar(0, 1)),  # the draft model's weights
        (t + 6, bar(1, 1)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(t + 7)
    assert snap.session is not None
    bars = snap.session.bars
    assert [(b.index, b.done, b.total) for b in bars] == [(0, 3, 3), (1, 1, 1)]
    assert bars[0].finished_at == t + 3 and bars[1].finished_at == t + 6
    prog = snap.session.progress
    assert prog.stage == 1 and prog.shards_done == 1 and prog.shards_total == 1
    # the main bar's longest gap between progress updates: 1->3 took 1 s, 0->1 took 1 s
    assert bars[0].longest_gap_s == pytest.approx(1.0)
    assert snap.session.weights_load_s == pytest.approx(2.0)


def test_bars_from_data_parallel_ranks_are_kept_apart() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, bar(0, 4, process="EngineCore_DP0")),
        (t + 1, bar(0, 4, process="EngineCore_DP1")),
        (t + 3, bar(2, 4, process="EngineCore_DP0")),
        (t + 4, bar(1, 4, process="EngineCore_DP1")),  # not a regression of DP0's bar
        (t + 5, bar(4, 4, process="EngineCore_DP0")),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(t + 5)
    assert snap.session is not None
    by_proc = {b.process: b for b in snap.session.bars}
    assert by_proc["EngineCore_DP0"].done == 4 and by_proc["EngineCore_DP0"].index == 0
    assert by_proc["EngineCore_DP1"].done == 1 and by_proc["EngineCore_DP1"].index == 0
    prog = snap.session.progress
    assert prog.shards_done == 1  # the slower rank
    assert prog.eta is not None and prog.eta.remaining_s > 0  # DP1 still loading


def test_bytes_weighted_progress_with_known_shards() -> None:
    sizes = [8 * GIB, 1 * GIB, 1 * GIB, 1 * GIB, 1 * GIB]  # embeddings first
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t, model(sizes)),
        (t + 1, bar(0, 5)),
        (t + 9, bar(1, 5)),
        (t + 10, bar(2, 5)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(t + 10)
    assert snap.session is not None
    prog = snap.session.progress
    assert prog.bytes_done == 9 * GIB and prog.bytes_total == 12 * GIB
    assert prog.ratio == pytest.approx(0.75)
    assert prog.eta is not None and prog.eta.units == "bytes"
    # 9 GiB in 9 s: the 3 GiB left take about 3 s (tqdm would say 2 files x 4.5 s = 13 s)
    assert prog.eta.remaining_s == pytest.approx(3.0, rel=0.2)
    assert prog.eta.low_s <= prog.eta.remaining_s <= prog.eta.high_s
    assert prog.eta.finish_at == pytest.approx(t + 10 + prog.eta.remaining_s)


def test_count_based_progress_without_model_information() -> None:
    st, _ = fold([(T0, bar(0, 4)), (T0 + 2, bar(1, 4)), (T0 + 4, bar(2, 4))])
    snap = st.snapshot(T0 + 4)
    assert snap.session is not None
    prog = snap.session.progress
    assert prog.bytes_done is None and prog.ratio == pytest.approx(0.5)
    assert prog.eta is not None and prog.eta.units == "items"
    assert prog.eta.remaining_s == pytest.approx(4.0, rel=0.05)


def test_eta_counts_down_between_lines_and_bytes_read_move_the_position() -> None:
    sizes = [10 * GIB] * 4
    t = T0
    base: list[tuple[float, object]] = [
        (t, started(t)),
        (t, model(sizes)),
        (t, io(t, 0)),
        (t + 1, bar(0, 4)),
        (t + 11, io(t + 11, 10 * GIB)),
        (t + 11, bar(1, 4)),
    ]
    st, _ = fold(base)  # type: ignore[arg-type]
    at_line = st.snapshot(t + 11).session
    later = st.snapshot(t + 14).session
    assert at_line is not None and later is not None
    assert at_line.progress.eta is not None and later.progress.eta is not None
    assert at_line.progress.eta.remaining_s == pytest.approx(30.0, rel=0.05)
    assert later.progress.eta.remaining_s == pytest.approx(27.0, rel=0.05)
    # bytes read say the file in progress is half done already
    st, _ = fold([(t + 12, io(t + 12, 15 * GIB))], st)
    snap = st.snapshot(t + 12).session
    assert snap is not None and snap.progress.ratio == pytest.approx(0.375)
    assert snap.progress.eta is not None
    assert snap.progress.eta.remaining_s == pytest.approx(25.0, rel=0.05)


def test_graph_capture_bar_moves_to_post_load_and_counts_as_activity() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, bar(0, 2)),
        (t + 2, bar(2, 2)),
        (
            t + 5,
            bar(0, 51, process="Worker_TP0", kind="graph_capture", desc="Capturing CUDA graphs"),
        ),
        (
            t + 6,
            bar(51, 51, process="Worker_TP0", kind="graph_capture", desc="Capturing CUDA graphs"),
        ),
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    assert phases(tr) == ["loading_weights", "post_load"]
    snap = st.snapshot(t + 6)
    assert snap.session is not None
    assert {b.kind for b in snap.session.bars} == {"weights", "graph_capture"}
    # the weights stage stays the progress shown
    assert snap.session.progress.shards_done == 2


def test_bar_joined_mid_way_uses_its_elapsed_time() -> None:
    st, _ = fold([(T0 + 100, bar(5, 10, elapsed_s=50.0)), (T0 + 110, bar(6, 10, elapsed_s=60.0))])
    snap = st.snapshot(T0 + 110)
    assert snap.session is not None
    b = snap.session.bars[0]
    assert b.started_at == T0 + 50
    assert snap.session.progress.eta is not None
    assert snap.session.progress.eta.remaining_s == pytest.approx(40.0, rel=0.1)


def test_bar_count_is_capped() -> None:
    items: list[tuple[float, object]] = [(T0, started(T0))]
    for i in range(50):
        items.append((T0 + i, bar(0, 1, process=f"W{i}", kind="other", desc="x")))
        items.append((T0 + i + 0.5, bar(1, 1, process=f"W{i}", kind="other", desc="x")))
    st, _ = fold(items, max_bars=8)  # type: ignore[arg-type]
    assert st.session is not None and len(st.session.bars) == 8
    # the newest are kept
    assert {b.process for b in st.session.bars.values()} == {f"W{i}" for i in range(42, 50)}


def test_progress_before_any_bar_is_empty_not_zero() -> None:
    st, _ = fold([(T0, started(T0)), (T0 + 1, ms("model_load_start"))])  # type: ignore[list-item]
    snap = st.snapshot(T0 + 2)
    assert snap.session is not None
    p = snap.session.progress
    assert p.shards_done is None and p.ratio is None and p.eta is None


def test_a_new_load_resets_state_but_not_the_model_information() -> None:
    st = LoadState()
    st, _ = fold([(T0, model([GIB] * 2)), (T0, started(T0)), (T0 + 1, bar(0, 2))], st)  # type: ignore[list-item]
    st, _ = fold(
        [(T0 + 10, started(T0 + 10, pid=5)), (T0 + 11, bar(0, 2)), (T0 + 12, bar(1, 2))], st
    )  # type: ignore[list-item]
    snap = st.snapshot(T0 + 12)
    assert snap.session is not None and snap.session.progress.bytes_done == GIB


def test_model_information_arriving_mid_bar_switches_to_bytes() -> None:
    sizes = [8 * GIB, GIB, GIB, GIB]
    t = T0
    st, _ = fold([(t, started(t)), (t + 1, bar(0, 4)), (t + 9, bar(1, 4))])  # type: ignore[list-item]
    snap = st.snapshot(t + 9).session
    assert snap is not None and snap.progress.eta is not None
    assert snap.progress.eta.units == "items"
    assert snap.progress.eta.remaining_s == pytest.approx(24.0)  # 3 files x 8 s
    st, _ = fold([(t + 9.5, model(sizes))], st)
    snap = st.snapshot(t + 9.5).session
    assert snap is not None and snap.progress.eta is not None
    assert snap.progress.eta.units == "bytes" and snap.progress.bytes_done == 8 * GIB
    assert snap.progress.eta.remaining_s == pytest.approx(2.5, abs=0.6)  # 3 GiB at 1 GiB/s
    # a model with another shard count (a different checkpoint) leaves the bar counted
    st2, _ = fold([(t, bar(0, 4)), (t + 2, bar(1, 4)), (t + 3, model([GIB] * 7))])  # type: ignore[list-item]
    s2 = st2.snapshot(t + 3).session
    assert s2 is not None and s2.progress.eta is not None and s2.progress.eta.units == "items"


def test_two_graph_capture_bars_with_their_own_descs_are_two_bars() -> None:
    t = T0
    piecewise = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    full = "Capturing CUDA graphs (decode, FULL)"
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, bar(51, 51, process=None, kind="graph_capture", desc=piecewise)),
        (t + 2, bar(51, 51, process=None, kind="graph_capture", desc=full)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(t + 3)
    assert snap.session is not None
    assert [(b.desc, b.done) for b in snap.session.bars] == [(piecewise, 51), (full, 51)]


def test_a_bar_first_seen_without_its_process_is_adopted_by_the_prefixed_updates() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, bar(6, 37, process=None)),
        (t + 2, bar(7, 37, process="VllmWorker_rank0")),
        (t + 3, bar(8, 37, process="VllmWorker_rank0")),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(t + 4)
    assert snap.session is not None
    (b,) = snap.session.bars
    assert (b.process, b.done, b.total, b.updates) == ("VllmWorker_rank0", 8, 37, 3)


def test_updates_read_in_one_burst_are_timed_by_the_bars_own_clock() -> None:
    # A backlog (or a busy daemon) hands over the bar's start and its first files at one instant
    # of the daemon's clock, which then times nothing. The bar's elapsed time says 6 files took
    # 30 s: the ETA for the other 14 is 70 s, and a real later update times files as usual.
    items = [(T0, started(T0)), (T0 + 1, bar(0, 20))]
    items += [(T0 + 1, bar(i, 20, elapsed_s=5.0 * i, rate_per_s=0.2)) for i in range(1, 7)]
    st, _ = fold(items)
    prog = st.snapshot(T0 + 1).session.progress  # type: ignore[union-attr]
    assert prog.eta is not None and prog.eta.remaining_s == pytest.approx(70.0, rel=0.01)
    # under a second, tqdm's whole seconds say 0: the files done at its rate give the time
    items = [(T0, started(T0)), (T0 + 1, bar(0, 20))]
    items += [(T0 + 1, bar(i, 20, elapsed_s=0.0, rate_per_s=40.0)) for i in range(1, 11)]
    st, _ = fold(items)
    prog = st.snapshot(T0 + 1).session.progress  # type: ignore[union-attr]
    assert prog.eta is not None and prog.eta.remaining_s == pytest.approx(0.25, rel=0.01)
    # with neither, the daemon's clock has nothing to time: no ETA yet, rather than a made-up one
    items = [(T0, started(T0)), (T0 + 1, bar(0, 20))]
    items += [(T0 + 1, bar(i, 20)) for i in range(1, 4)]
    st, _ = fold(items)
    assert st.snapshot(T0 + 1).session.progress.eta is None  # type: ignore[union-attr]
