"""The start-up timeline (daemon/state/timeline.py): the phase sequence of real logs, durations
that add up, and the rules for ranks, repeats, tails and vLLM's own timings.

The logs are tests/fixtures': real vLLM 0.32 CPU runs (`real-v0.32-*`, made by
tests/realvllm/), and excerpts of public issues (`gh-*`, each with its `.source`: the issue and
what the excerpt shows). The rule tests feed the timeline signals directly (no log lines).
"""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

import pytest

from loadwatch.daemon.state.loadstate import Input, LoadState, run
from loadwatch.daemon.state.snapshot import StartupStepView
from loadwatch.daemon.state.timeline import begin, finish, mark, ready, served, timeline_view
from loadwatch.daemon.tools.analyze import analyze_log
from loadwatch.parsers import EventStream, split_records
from tests.conftest import FIXTURES

GPU_START = [
    "config",
    "weights",
    "weight_postprocess",
    "torch_compile",
    "kv_cache",
    "graph_capture",
    "engine_ready",
    "api_server",
]
CPU_START = ["config", "weights", "kv_cache", "engine_ready", "api_server"]

# fixture -> each session's phases, in order
GOLDEN: dict[str, list[list[str]]] = {
    # real vLLM 0.32 on the CPU: no `Model loading took`, no compile (`--enforce-eager`), no
    # graphs; the time from the weights to the KV cache's first line is the KV cache's
    "real-v0.32-llama.log": [CPU_START],
    "real-v0.32-deepseek-kvscales.log": [CPU_START],
    "real-v0.32-pp2-head.log": [CPU_START],
    # it fails sizing the KV cache, where the timeline ends
    "real-v0.32-kv-too-small.log": [["config", "weights", "kv_cache"]],
    "real-v0.32-supervised-kv-too-small.log": [["config", "weights", "kv_cache"]] * 2,
    # GPU starts (TP 8 DeepSeek-V3; an RTX PRO 6000 start whose compile came from its cache)
    "v1-2025.log": [GPU_START],
    "v1-2026-sm120.log": [["config", "weights"], GPU_START],
    # a second weights bar after the first one ended: the weights again
    "tp1-enginecore.log": [
        [
            "config",
            "weights",
            "weights",
            "weight_postprocess",
            "kv_cache",
            "graph_capture",
            "engine_ready",
            "api_server",
        ]
    ],
    # tails: the first step began before the log
    "gh-glmv-204-two-graph-bars.log": [["kv_cache", "graph_capture", "engine_ready"]],
    "gh-vllm-35061-tp8-aot-compile.log": [["torch_compile"]],
    "gh-club3090-617-autotuner-prefix.log": [["autotune"]],
}


def _analyzed(name: str) -> list[tuple[str, float | None, tuple[StartupStepView, ...]]]:
    report = analyze_log(FIXTURES / name)
    return [(s.reason, s.ready_at, s.timeline) for s in report.sessions]


def assert_adds_up(steps: tuple[StartupStepView, ...]) -> None:
    """Contiguous steps: each begins where the one before ended, so the durations add up."""
    for before, after in itertools.pairwise(steps):
        assert before.ended_at == after.started_at, (before, after)
    end = steps[-1].ended_at if steps[-1].ended_at is not None else None
    total = sum(s.duration_s for s in steps)
    if end is not None:
        assert total == pytest.approx(end - steps[0].started_at)
    for s in steps:
        assert s.duration_s >= 0
        if s.ended_at is not None and s.last_line_at is not None:
            assert s.started_at <= s.last_line_at <= s.ended_at, s


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_phase_sequence_of_real_logs(name: str) -> None:
    sessions = _analyzed(name)
    assert [[s.phase for s in steps] for _, _, steps in sessions] == GOLDEN[name]
    for reason, ready_at, steps in sessions:
        assert_adds_up(steps)
        assert steps[0].began_before_log == (reason == "first_event")
        if ready_at is not None:  # the last step ends at ready, none is left open
            assert steps[-1].ended_at == ready_at


def test_durations_add_up_to_the_time_to_ready() -> None:
    report = analyze_log(FIXTURES / "v1-2025.log")
    (s,) = report.sessions
    took = {x.phase: x.duration_s for x in s.timeline}
    assert sum(took.values()) == pytest.approx(s.time_to_ready_s) == 520.0
    # `Starting to load model` 16:02:53 to `Loading weights took` 16:08:59; the compile from
    # `Model loading took` to `torch.compile takes ... in total`
    assert (took["weights"], took["torch_compile"]) == (366.0, 100.0)
    bars = next(x for x in s.timeline if x.phase == "weights").bars
    assert bars == ("Loading safetensors checkpoint shards: 163/163 files",)


def test_compile_from_the_cache_and_two_graph_bars_in_one_step() -> None:
    (_, second) = analyze_log(FIXTURES / "v1-2026-sm120.log").sessions
    compile_step = next(x for x in second.timeline if x.phase == "torch_compile")
    assert compile_step.detail == "loaded from the compile cache"
    ((_, _, steps),) = _analyzed("gh-glmv-204-two-graph-bars.log")
    graphs = next(x for x in steps if x.phase == "graph_capture")
    assert graphs.bars == (
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 67/67 items",
        "Capturing CUDA graphs (decode, FULL): 35/35 items",
    )


def test_live_fold_gives_the_same_steps() -> None:
    """As the daemon follows the log live: every event at the daemon's clock, a moment after
    it was written (never a stamp against the clock)."""
    ref = datetime(2026, 12, 1).timestamp()
    data = (FIXTURES / "real-v0.32-llama.log").read_bytes()
    events = EventStream(ref_ts=ref).feed_all(split_records(data))
    items: list[tuple[float, Input]] = []
    now = next(e.ts for e in events if e.ts is not None)
    for ev in events:
        now = max(now, (ev.ts or now) + 0.1)
        items.append((now, ev))
    state, _ = run(items, LoadState())
    s = state.session
    assert s is not None and s.ready_at is not None
    steps = timeline_view(s.timeline, s.bars, now)
    assert [x.phase for x in steps] == CPU_START
    assert_adds_up(steps)
    assert sum(x.duration_s for x in steps) == pytest.approx(s.ready_at - s.started_at)


# -- the rules, signal by signal ------------------------------------------------------------


def phases(tl: object) -> list[tuple[str, float, float | None]]:
    return [(s.phase, s.started_at, s.ended_at) for s in tl.steps]  # type: ignore[attr-defined]


def test_the_slowest_rank_ends_a_step_and_a_lagging_rank_moves_nothing() -> None:
    tl = mark(begin(0.0, "log_version"), "weights", 10.0, "TP0", "start")
    tl = mark(tl, "weights", 100.0, "TP0", "end", took=90.0)
    tl = mark(tl, "weights", 103.0, "TP1", "end", took=93.0)  # rank 1 ends 3 s later
    tl = mark(tl, "weight_postprocess", 110.0, "TP0", "end")  # `Model loading took`
    tl = mark(tl, "weights", 111.0, "TP2", "end")  # a lagging rank's echo: nothing moves
    tl = mark(tl, "torch_compile", 112.0, "TP0", "start")
    assert phases(tl) == [
        ("config", 0.0, 10.0),
        ("weights", 10.0, 103.0),
        ("weight_postprocess", 103.0, 110.0),
        ("torch_compile", 110.0, None),
    ]


def test_a_process_starting_a_phase_it_ended_is_a_second_step() -> None:
    """A drafter's weights bar after the model's: the weights again, from where the first
    ended (the step after an end begins there, whatever it turns out to be)."""
    tl = mark(begin(0.0, "log_version"), "weights", 10.0, "-", "start", bar="a")
    tl = mark(tl, "weights", 20.0, "-", "end")
    tl = mark(tl, "weights", 21.0, "-", "start", took=0.5, bar="b")
    tl = mark(tl, "weights", 25.0, "-", "end")
    assert phases(tl) == [
        ("config", 0.0, 10.0),
        ("weights", 10.0, 20.0),
        ("weights", 20.0, 25.0),
        ("unknown", 25.0, None),
    ]


def test_what_a_line_says_it_took_moves_the_step_back_but_not_into_another_ones_lines() -> None:
    kv = mark(begin(0.0, "log_version"), "kv_cache", 200.0, "EngineCore", "on")
    graphs = mark(kv, "graph_capture", 210.0, "TP0", "end", took=4.0)
    assert phases(graphs)[1:] == [
        ("kv_cache", 200.0, 206.0),
        ("graph_capture", 206.0, 210.0),
        ("unknown", 210.0, None),
    ]
    longer = mark(kv, "graph_capture", 210.0, "TP0", "end", took=50.0)
    assert phases(longer)[1:3] == [("kv_cache", 200.0, 200.0), ("graph_capture", 200.0, 210.0)]


def test_a_line_that_starts_its_phase_is_not_moved_back() -> None:
    """`Initializing model took 0.18 s` after `Starting to load model` on the same second."""
    tl = mark(begin(0.0, "log_version"), "weights", 43.0, "Worker", "start")
    tl = mark(tl, "weights", 43.0, "Worker", "on", took=0.18)
    assert phases(tl) == [("config", 0.0, 43.0), ("weights", 43.0, None)]


def test_a_tail_begins_with_a_step_of_no_known_start() -> None:
    tl = begin(50.0, "first_event")
    assert phases(tl) == [("unknown", 50.0, None)] and tl.steps[0].before_log
    tl = mark(tl, "torch_compile", 55.0, "TP6", "on")
    tl = mark(tl, "torch_compile", 80.0, "TP0", "end", took=85.0)  # not before the log
    assert phases(tl) == [("torch_compile", 50.0, 80.0), ("unknown", 80.0, None)]
    assert tl.steps[0].before_log


def test_ready_and_the_first_completion() -> None:
    tl = mark(begin(0.0, "process_start"), "api_server", 30.0, "APIServer", "on")
    served_check = ready(tl, 31.0, None, serve_check=True)
    assert phases(served_check)[-1] == ("first_completion", 31.0, None)
    done = served(served_check, 31.4)
    assert done.done and phases(done)[-1] == ("first_completion", 31.0, 31.4)
    without = ready(tl, 31.0, None, serve_check=False)
    assert without.done and phases(without) == [("config", 0.0, 30.0), ("api_server", 30.0, 31.0)]
    assert mark(without, "kv_cache", 40.0, "EngineCore", "on") is without  # over: nothing moves


def test_a_failure_ends_the_step_under_way() -> None:
    tl = mark(begin(0.0, "log_version"), "weights", 10.0, "TP0", "start")
    tl = finish(tl, 12.5)
    assert tl.done and phases(tl) == [("config", 0.0, 10.0), ("weights", 10.0, 12.5)]


def test_the_steps_and_processes_kept_are_bounded() -> None:
    tl = begin(0.0, "log_version")
    for i in range(200):
        tl = mark(tl, "weights", 1.0 + i, f"w{i}", "start")
        tl = mark(tl, "weights", 1.5 + i, f"w{i}", "end")
        tl = mark(tl, "weights", 1.6 + i, f"w{i}", "start")
    assert len(tl.steps) <= 64 and tl.dropped > 0 and len(tl.ended) <= 17


def test_status_lists_the_current_sessions_timeline() -> None:
    report_state = _fold_llama()
    doc = report_state.snapshot(report_state.session.last_event_at).to_dict()  # type: ignore[union-attr]
    steps = doc["session"]["timeline"]
    assert [s["phase"] for s in steps] == CPU_START
    assert {"phase", "started_at", "ended_at", "duration_s"} <= set(steps[0])


def _fold_llama() -> LoadState:
    ref = datetime(2026, 12, 1).timestamp()
    data = (Path(FIXTURES) / "real-v0.32-llama.log").read_bytes()
    events = EventStream(ref_ts=ref).feed_all(split_records(data))
    state = LoadState()
    for ev in events:
        if ev.ts is not None:
            state = state.apply(ev, ev.ts)
    return state


def test_the_servable_check_is_the_last_step_of_a_live_start() -> None:
    """Supervised, with `[vllm] servable`: the start-up ends with the first completion, and
    the steps add up to it; /health 200 stands for the ready line no log gave."""
    from loadwatch.daemon.sources.inputs import CompletionProbe, HealthProbe

    from .helpers import T0, bar, fold, ms, started

    items: list[tuple[float, Input]] = [
        (T0, started(T0)),
        (T0 + 20, ms("model_load_start", process="Worker_TP0")),
        (T0 + 21, bar(0, 2)),
        (T0 + 30, bar(2, 2)),
        (T0 + 31, ms("weights_loaded", seconds=10.0, process="Worker_TP0")),
        (T0 + 40, ms("kv_cache", detail="available_memory", gib=1.0, process="Worker_TP0")),
        (T0 + 45, ms("engine_init", seconds=14.0, process="EngineCore")),
        (T0 + 46, ms("api_server_start", value="http://127.0.0.1:8000", process="APIServer")),
        (T0 + 48, HealthProbe(ok=True, ts=T0 + 48, status=200)),
        (T0 + 49.5, CompletionProbe(ok=True, ts=T0 + 49.5, latency_s=0.4)),
    ]
    state, _ = fold(items, require_completion=True)
    s = state.session
    assert s is not None and s.timeline.done
    steps = timeline_view(s.timeline, s.bars, T0 + 60)
    assert [(x.phase, x.started_at - T0, x.duration_s) for x in steps] == [
        ("config", 0.0, 20.0),
        ("weights", 20.0, 11.0),
        ("kv_cache", 31.0, 14.0),
        ("engine_ready", 45.0, 1.0),
        ("api_server", 46.0, 2.0),
        ("first_completion", 48.0, 1.5),
    ]
    assert_adds_up(steps)
