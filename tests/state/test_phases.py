"""Sessions and phases: starts, ready, failures, exits, restarts."""

from __future__ import annotations

import json

import pytest

from loadwatch.daemon.sources.inputs import HealthProbe, ProcessEvent, Tick
from loadwatch.daemon.state.loadstate import LoadState, StateConfig

from .helpers import T0, bar, exited, fail, fold, kinds, ms, phases, started


def _happy_path() -> list[tuple[float, object]]:
    t = T0
    return [
        (t, started(t)),
        (t + 1, ms("version", value="0.11.1")),
        (t + 3, ms("model_load_start", value="/m", process="Worker_TP0")),
        (t + 5, bar(0, 4)),
        (t + 7, bar(1, 4)),
        (t + 9, bar(2, 4)),
        (t + 11, bar(3, 4)),
        (t + 13, bar(4, 4)),
        (t + 13.001, bar(4, 4)),  # tqdm's close() redraws the last line
        (t + 14, ms("weights_loaded", seconds=8.1)),
        (t + 15, ms("model_memory", gib=61.2, seconds=12.0)),
        (t + 30, ms("kv_cache", detail="available_memory", gib=9.5)),
        (t + 31, ms("kv_cache", detail="size", tokens=123456)),
        (t + 40, ms("graph_capture", seconds=8.0, gib=0.5)),
        (t + 41, ms("engine_init", seconds=25.0)),
        (t + 42, ms("api_server_start", value="http://0.0.0.0:8000")),
        (t + 43, ms("app_startup_complete")),
    ]


def test_happy_path_walks_every_phase_forward_and_times_ready() -> None:
    st, tr = fold(_happy_path())  # type: ignore[arg-type]
    assert phases(tr) == ["starting", "loading_weights", "post_load", "ready"][1:]
    assert kinds(tr)[0] == "session_started"
    s = st.snapshot(T0 + 50)
    assert s.phase == "ready" and s.ready
    assert s.session is not None
    assert s.session.time_to_ready_s == pytest.approx(43.0)
    assert s.session.weights_load_s == pytest.approx(8.1)
    assert [h.phase for h in s.session.history] == [
        "starting",
        "loading_weights",
        "post_load",
        "ready",
    ]
    # t+3 .. t+14: `Loading weights took` ends loading_weights
    assert s.session.history[1].duration_s == pytest.approx(11.0)
    assert s.session.history[-1].left_at is None
    ms_by_key = {m.key: m for m in s.session.milestones}
    assert ms_by_key["model_memory"].gib == 61.2
    assert ms_by_key["kv_cache.size"].tokens == 123456
    assert ms_by_key["kv_cache.available_memory"].gib == 9.5
    bars = s.session.bars
    assert len(bars) == 1 and bars[0].done == 4 and bars[0].updates == 6
    assert s.session.progress.ratio == 1.0
    assert s.session.progress.eta is not None and s.session.progress.eta.remaining_s == 0.0
    json.dumps(s.to_dict())


def test_ready_from_health_probe_needs_the_api_server_first() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 2, ms("model_load_start")),
        (t + 5, HealthProbe(ok=True, ts=t + 5, status=200)),  # before the API server: ignored
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    assert st.session is not None and st.session.phase == "loading_weights"
    st, tr = fold(
        [
            (t + 20, ms("api_server_start", value="http://127.0.0.1:8000")),
            (t + 21, HealthProbe(ok=False, ts=t + 21, status=503)),
            (t + 22, HealthProbe(ok=True, ts=t + 22, status=200)),
        ],
        st,
    )
    assert phases(tr) == ["post_load", "ready"]
    snap = st.snapshot(t + 23)
    assert snap.ready and snap.session is not None
    assert snap.session.time_to_ready_s == pytest.approx(22.0)
    assert snap.health is not None and snap.health.ok and snap.health.consecutive_failures == 0


def test_one_crash_many_failures_keeps_the_root_cause_and_counts_duplicates() -> None:
    t = T0
    kv_msg = "To serve at least one request with the model's max seq len (512), (0.02 GiB KV cache is needed, ..."
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, ms("model_load_start")),
        (
            t + 20,
            fail("engine_init_failed", "EngineCore failed to start.", process="EngineCore_DP0"),
        ),
        (
            t + 20,
            fail("kv_cache_too_small", kv_msg, exc_type="ValueError", process="EngineCore_DP0"),
        ),
        (
            t + 20,
            fail("kv_cache_too_small", kv_msg, exc_type="ValueError", process="EngineCore_DP1"),
        ),
        (
            t + 21,
            fail(
                "engine_init_failed",
                "Engine core initialization failed. See root cause above.",
                exc_type="RuntimeError",
                process="APIServer",
            ),
        ),
        # vLLM exits 0 after its engine died: still failed.
        (t + 22, exited(t + 22, code=0)),
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 23)
    assert s.phase == "failed"
    assert s.session is not None and s.session.failure_kind == "kv_cache_too_small"
    fails = s.session.failures
    assert next(f.kind for f in fails) == "kv_cache_too_small"
    kv = next(f for f in fails if f.kind == "kv_cache_too_small")
    # one root cause: the other workers' copies and the echoes ("failed to start", the API
    # server's "initialization failed") are folded into it, with their processes
    assert kv.count == 4 and kv.echoes == 3
    assert kv.processes == ("APIServer", "EngineCore_DP0", "EngineCore_DP1")
    assert [e.process for e in kv.evidence] == [
        "EngineCore_DP0",
        "EngineCore_DP0",
        "EngineCore_DP1",
        "APIServer",
    ] or len(kv.evidence) == 4
    assert s.session.failures_total == 4 and len(fails) == 1
    # a failure transition when the first echo is seen and one for the root cause; one phase
    # change to failed
    assert kinds(tr).count("failure") == 2
    assert phases(tr).count("failed") == 1
    assert s.session.exit_code == 0


def test_clean_stop_logs_engine_dead_but_is_stopped_not_failed() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, ms("app_startup_complete")),
        (t + 100, ProcessEvent(kind="stopping", ts=t + 100, pid=100)),
        (
            t + 101,
            fail(
                "worker_died", "EngineCore encountered a fatal error.", exc_type="EngineDeadError"
            ),
        ),
        (t + 102, exited(t + 102, code=0)),
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 103)
    assert s.phase == "stopped"
    # the EngineDeadError of a requested stop is the shutdown, not a failure
    assert s.session is not None and s.session.failures_total == 0
    assert s.session.failures == ()
    assert "failed" not in phases(tr) and "failure" not in kinds(tr)


def test_a_root_cause_after_a_stop_is_kept_but_not_fatal() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, ms("model_load_start")),
        (t + 100, ProcessEvent(kind="stopping", ts=t + 100, pid=100)),
        (t + 101, fail("cuda_oom", "CUDA out of memory.", exc_type="torch.OutOfMemoryError")),
        (t + 101, fail("worker_died", "EngineCore encountered a fatal error.")),
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    s = st.snapshot(t + 102)
    assert s.session is not None
    (f,) = s.session.failures
    assert f.kind == "cuda_oom" and f.fatal is False and f.echoes == 0
    assert "failed" not in phases(tr)


def test_request_traceback_while_serving_is_not_fatal_but_engine_death_is() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, ms("app_startup_complete")),
        (
            t + 50,
            fail("other", "ValueError: bad request", exc_type="ValueError", process="APIServer"),
        ),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    assert st.session is not None and st.session.phase == "ready"
    death = fail("worker_died", "Worker proc VllmWorker-0 died unexpectedly", engine_fatal=True)
    st, tr = fold([(t + 60, death)], st)
    assert phases(tr) == ["failed"]
    assert st.session is not None and st.session.failure_kind == "worker_died"


def test_bad_exit_without_log_failure_then_late_traceback_refines_the_kind() -> None:
    t = T0
    st, tr = fold(
        [(t, started(t)), (t + 1, ms("model_load_start")), (t + 9, exited(t + 9, code=1))]  # type: ignore[list-item]
    )
    assert st.session is not None and st.session.phase == "failed"
    assert st.session.failure_kind == "exited"
    assert tr[-1].reason == "exited with code 1"
    # the follower delivers the traceback after the supervisor saw the exit
    st, _tr = fold(
        [(t + 10, fail("cuda_oom", "CUDA out of memory. Tried to allocate 2.00 GiB"))], st
    )
    assert st.session is not None and st.session.failure_kind == "cuda_oom"
    _st2, tr2 = fold(
        [(t, started(t)), (t + 1, ms("model_load_start")), (t + 9, exited(t + 9, signal=9))]
    )  # type: ignore[list-item]
    assert tr2[-1].reason == "killed by signal 9"


def test_exit_zero_then_late_fatal_failure_turns_stopped_into_failed() -> None:
    t = T0
    st, tr = fold(
        [(t, started(t)), (t + 1, ms("model_load_start")), (t + 9, exited(t + 9, code=0))]
    )  # type: ignore[list-item]
    assert st.session is not None and st.session.phase == "stopped"
    st, tr = fold([(t + 9.5, fail("engine_init_failed", "EngineCore failed to start."))], st)
    assert phases(tr) == ["failed"]


def test_restart_by_supervisor_opens_a_session_and_summarises_the_last() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t, pid=100)),
        (t + 1, ms("version", value="0.11.1")),
        (t + 2, ms("model_load_start")),
        (t + 3, bar(0, 10)),
        (t + 5, bar(3, 10)),
        (t + 6, fail("cuda_oom", "CUDA out of memory")),
        (t + 7, exited(t + 7, pid=100, code=1)),
        (t + 17, started(t + 17, pid=200)),
        (t + 18, ms("version", value="0.11.1")),  # the new process's first line: same session
        (t + 19, ms("model_load_start")),
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    assert kinds(tr).count("session_started") == 2
    s = st.snapshot(t + 20)
    assert s.restarts == 1 and s.sessions_total == 2
    assert s.session is not None and s.session.id == 2 and s.session.pid == 200
    assert s.session.phase == "loading_weights"
    (prev,) = s.sessions
    assert prev.id == 1 and prev.phase == "failed" and prev.failure_kind == "cuda_oom"
    assert prev.shards_done == 3 and prev.shards_total == 10 and prev.exit_code == 1


def test_late_failure_of_previous_process_goes_to_its_summary() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t, pid=100)),
        (t + 1, ms("model_load_start")),
        (t + 5, exited(t + 5, pid=100, code=0)),
        (t + 8, started(t + 8, pid=200)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    late = fail("cuda_oom", "CUDA out of memory", ts=t + 4)
    st, tr = fold([(t + 9, late)], st)
    assert st.session is not None and st.session.phase == "starting"
    assert st.session.failures_total == 0
    assert st.past[-1].failure_kind == "cuda_oom" and st.past[-1].phase == "failed"
    assert tr[0].kind == "failure" and tr[0].session == 1


def test_log_only_sessions_from_version_and_model_load_start() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, ms("version", value="0.10.0")),
        (t + 1, ms("model_load_start")),
        (t + 2, ms("app_startup_complete")),
        # a restart in the log: the next startup's first line
        (t + 100, ms("version", value="0.10.0")),
        (t + 101, ms("model_load_start")),
        (t + 102, ms("model_memory", gib=10.0)),
        # the same process loads again after loading (a restart without a version line)
        (t + 200, ms("model_load_start")),
    ]
    st, tr = fold(items)  # type: ignore[arg-type]
    starts = [x for x in tr if x.kind == "session_started"]
    assert [x.reason for x in starts] == ["log_version", "log_version", "log_model_load_start"]
    assert [p.phase for p in st.past] == ["ready", "post_load"]


def test_process_start_adopts_a_session_the_log_opened_moments_before() -> None:
    t = T0
    st, _tr = fold([(t, ms("version", value="0.11.1")), (t + 1, started(t + 1, pid=7))])  # type: ignore[list-item]
    assert st.sessions_total == 1 and st.session is not None and st.session.pid == 7


def test_data_parallel_ranks_starting_to_load_stay_in_one_session() -> None:
    t = T0
    items: list[tuple[float, object]] = [
        (t, started(t)),
        (t + 1, ms("model_load_start", process="EngineCore_DP0")),
        (t + 1, ms("model_load_start", process="EngineCore_DP1")),
        (t + 30, ms("model_memory", gib=40.0, process="EngineCore_DP0")),
        (t + 31, ms("model_memory", gib=40.0, process="EngineCore_DP1")),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    assert st.sessions_total == 1 and st.session is not None and st.session.phase == "post_load"


def test_last_n_sessions_are_kept() -> None:
    items: list[tuple[float, object]] = []
    for i in range(10):
        t = T0 + 100 * i
        items += [(t, started(t, pid=i + 1)), (t + 5, exited(t + 5, pid=i + 1, code=1))]
    st, _ = fold(items, max_sessions=3)  # type: ignore[arg-type]
    assert [p.id for p in st.past] == [7, 8, 9]
    assert st.restarts == 9


def test_events_before_any_start_open_a_session_in_the_right_phase() -> None:
    st, tr = fold([(T0, bar(5, 10))])
    assert tr[0].reason == "first_event"
    assert st.session is not None and st.session.phase == "loading_weights"


def test_apply_is_copy_on_write_and_transitions_are_per_call() -> None:
    st0 = LoadState(config=StateConfig())
    st1 = st0.apply(started(T0), T0)
    st2 = st1.apply(ms("model_load_start"), T0 + 1)
    st3 = st2.apply(Tick(), T0 + 2)
    assert st0.session is None and st1.session is not None
    assert st1.session.phase == "starting" and st2.session is not None
    assert st2.session.phase == "loading_weights"
    assert [t.kind for t in st1.transitions] == ["session_started"]
    assert [t.phase_to for t in st2.transitions] == ["loading_weights"]
    assert st3.transitions == ()
    assert st3.session is st2.session  # untouched parts are shared, not copied


def test_unsupported_input_is_a_clear_type_error() -> None:
    with pytest.raises(TypeError, match="unsupported input str"):
        LoadState().apply("hello", T0)  # type: ignore[arg-type]


def test_replayed_log_uses_the_lines_own_times() -> None:
    # A daemon restart re-reads the log: every event arrives now, carrying its own time.
    now = T0 + 3600
    items: list[tuple[float, object]] = [
        (now, ms("version", value="0.11.1", ts=T0)),
        (now, ms("model_load_start", ts=T0 + 2)),
        (now, ms("app_startup_complete", ts=T0 + 40)),
    ]
    st, tr = fold(items, replay=True)  # type: ignore[arg-type]
    s = st.snapshot(now)
    assert s.session is not None
    assert s.session.started_at == T0
    assert s.session.time_to_ready_s == pytest.approx(40.0)
    assert not [t for t in tr if t.kind == "stall_raised"]


def test_replayed_line_without_a_time_takes_the_time_of_the_line_before() -> None:
    now = T0 + 3600
    items: list[tuple[float, object]] = [
        (now, ms("version", value="0.32.0", ts=T0)),
        (now, ms("api_server_start", value="http://127.0.0.1:8000", ts=T0 + 30)),
        (now, ms("app_startup_complete")),  # uvicorn's line has no time of its own
    ]
    st, _ = fold(items, replay=True)  # type: ignore[arg-type]
    assert st.session is not None and st.session.ready_at == T0 + 30
    # live again: a line without a time is seen now
    st, _ = fold([(now + 5, ms("kv_cache", ts=now + 4)), (now + 6, ms("torch_compile"))], st)
    assert st.session is not None and st.session.milestones["torch_compile"].first_at == now + 6


# -- readiness that ends ------------------------------------------------------------------------


def _ready_session(t: float) -> list[tuple[float, object]]:
    return [
        (t, ms("version", value="0.32.0", process="APIServer", pid=700)),
        (t + 1, ms("model_load_start")),
        (t + 5, ms("api_server_start", value="http://0.0.0.0:8000", process="APIServer", pid=700)),
        (t + 6, ms("app_startup_complete")),
    ]


@pytest.mark.parametrize(
    "line", ["API server: shutdown triggered", "Shutting down", "Application shutdown complete"]
)
def test_the_api_servers_shutdown_lines_end_ready(line: str) -> None:
    st, _ = fold(_ready_session(T0))  # type: ignore[arg-type]
    assert st.snapshot(T0 + 7).ready
    st, tr = fold([(T0 + 8, ms("shutdown", value=line))], st)  # type: ignore[list-item]
    snap = st.snapshot(T0 + 9)
    assert snap.phase == "stopped" and not snap.ready and phases(tr) == ["stopped"]
    assert snap.not_ready == "not ready: stopped"


def test_the_engine_cores_shutdown_line_alone_does_not_end_ready() -> None:
    st, _ = fold(_ready_session(T0))  # type: ignore[arg-type]
    st, _ = fold([(T0 + 8, ms("shutdown", value="EngineCore: exiting busy loop"))], st)  # type: ignore[list-item]
    assert st.snapshot(T0 + 9).ready


def test_health_failing_twice_after_ready_ends_ready_and_a_200_brings_it_back() -> None:
    st, _ = fold(_ready_session(T0))  # type: ignore[arg-type]
    st = st.apply(HealthProbe(ok=False, ts=T0 + 10, error="connection refused"), T0 + 10)
    assert st.snapshot(T0 + 10).ready  # one failure is not yet a stop
    st = st.apply(HealthProbe(ok=False, ts=T0 + 15, error="connection refused"), T0 + 15)
    snap = st.snapshot(T0 + 15)
    assert not snap.ready and snap.phase == "ready"
    assert snap.not_ready == "not ready: /health failed 2 times in a row (connection refused)"
    st = st.apply(HealthProbe(ok=True, ts=T0 + 20, status=200), T0 + 20)
    assert st.snapshot(T0 + 20).ready


def test_the_logged_process_gone_without_a_word_fails_the_session_its_argv_the_kv_dtype() -> None:
    """SIGKILL and the OOM killer leave no line: a vLLM gone with no shutdown line and no stop
    asked for is a failure of its own kind, `vanished` (it was once a quiet `stopped`)."""
    from loadwatch.daemon.sources.inputs import LoggedProcessSeen

    st, _ = fold(_ready_session(T0))  # type: ignore[arg-type]
    assert st.session is not None and st.session.server_pid == 700
    argv = ("python", "-m", "vllm.entrypoints.openai.api_server", "--kv-cache-dtype", "fp8")
    st = st.apply(LoggedProcessSeen(ts=T0 + 7, pid=700, alive=True, argv=argv), T0 + 7)
    snap = st.snapshot(T0 + 7)
    assert snap.ready and snap.kv_cache.source == "argv" and snap.kv_cache.dtype == "fp8"
    st = st.apply(LoggedProcessSeen(ts=T0 + 9, pid=700, alive=False), T0 + 9)
    snap = st.snapshot(T0 + 9)
    assert snap.phase == "failed" and not snap.ready
    assert snap.session is not None and snap.session.failure_kind == "vanished"
    assert snap.session.history[-1].failure_kind == "vanished"
    assert snap.session.history[-2].phase == "ready"
    assert [(t.phase_to, t.failure_kind) for t in st.transitions] == [("failed", "vanished")]
    assert "vLLM process 700 is gone, with no shutdown line" in str(st.transitions[0].reason)


@pytest.mark.parametrize(
    "last",
    [
        ms("shutdown", value="EngineCore: trigger received signal=SIGTERM"),  # a stop asked for
        ms("shutdown", value="EngineCore: exiting busy loop"),  # vLLM's own shutdown lines
    ],
)
def test_the_logged_process_gone_after_its_shutdown_lines_stopped(last: object) -> None:
    from loadwatch.daemon.sources.inputs import LoggedProcessSeen

    st, _ = fold([*_ready_session(T0), (T0 + 8, last)])  # type: ignore[list-item]
    assert st.snapshot(T0 + 8).phase == "ready"
    st = st.apply(LoggedProcessSeen(ts=T0 + 9, pid=700, alive=False), T0 + 9)
    snap = st.snapshot(T0 + 9)
    assert snap.phase == "stopped" and not snap.ready
    assert snap.session is not None and snap.session.failure_kind is None
    assert snap.session.verdict == "ready"  # it was ready, then stopped


def test_servable_ready_waits_for_the_completion_and_its_failure_is_a_kind_of_its_own() -> None:
    from loadwatch.daemon.sources.inputs import CompletionProbe

    cfg = StateConfig(require_completion=True)
    base = LoadState(config=cfg)
    st, _ = fold(_ready_session(T0), base)  # type: ignore[arg-type]
    snap = st.snapshot(T0 + 7)
    assert not snap.ready and snap.not_ready == "not ready: waiting for the first completion"
    ok = st.apply(CompletionProbe(ok=True, ts=T0 + 8, latency_s=0.25, model="m"), T0 + 8)
    snap = ok.snapshot(T0 + 8)
    assert snap.ready and snap.session is not None and snap.session.first_completion_s == 0.25
    bad = st.apply(CompletionProbe(ok=False, ts=T0 + 8, model="m", error="HTTP 500"), T0 + 8)
    snap = bad.snapshot(T0 + 8)
    assert not snap.ready and snap.phase == "failed"
    assert snap.session is not None and snap.session.failure_kind == "completion_failed"
    assert "HTTP 500" in snap.session.failures[0].message


def test_every_phase_transition_names_the_phase_it_leaves() -> None:
    """The event log's `transition.phase` says where a session came from: never the phase it
    goes to (the fold once read the phase after setting it)."""
    _st, tr = fold(_happy_path())  # type: ignore[arg-type]
    moves = [(t.phase_from, t.phase_to) for t in tr if t.kind == "phase"]
    assert moves == [
        ("starting", "loading_weights"),
        ("loading_weights", "post_load"),
        ("post_load", "ready"),
    ]


# -- once vLLM serves, an error in the log needs corroboration ---------------------------------

_OOM = "CUDA out of memory. Tried to allocate 20.00 GiB"


def _serving_with_an_error(t: float) -> LoadState:
    """Ready, then an ERROR record of the OOM kind that nothing else confirms (a request's error,
    or a client's model name echoed into the log)."""
    st, tr = fold([(t, started(t)), *_ready_session(t)])  # type: ignore[arg-type]
    assert st.session is not None and st.session.phase == "ready"
    st, tr = fold([(t + 10, fail("cuda_oom", _OOM, exc_type="torch.OutOfMemoryError"))], st)
    assert phases(tr) == []
    assert [(x.kind, x.fatal) for x in tr] == [("failure", False)]
    snap = st.snapshot(t + 11)
    assert snap.phase == "ready" and snap.ready and snap.live
    assert snap.session is not None and [f.fatal for f in snap.session.failures] == [False]
    return st


def test_an_error_alone_while_serving_is_a_warning_not_a_failed_session() -> None:
    st = _serving_with_an_error(T0)
    # /health goes on answering 200 and the process lives: it stays a warning
    st = st.apply(HealthProbe(ok=True, ts=T0 + 60, status=200), T0 + 60)
    assert st.snapshot(T0 + 60).ready and st.session is not None
    assert st.session.failure_kind is None


@pytest.mark.parametrize(
    "confirm",
    [
        # the engine's own word that it died
        [fail("worker_died", "EngineCore encountered a fatal error.", engine_fatal=True)],
        # the process ends (vLLM exits 0 when its engine died while serving)
        [exited(T0 + 30, code=0)],
        # /health fails twice in a row
        [
            HealthProbe(ok=False, ts=T0 + 25, status=503, error="HTTP 503"),
            HealthProbe(ok=False, ts=T0 + 30, status=503, error="HTTP 503"),
        ],
    ],
    ids=["engine_fatal", "exit", "health"],
)
def test_a_confirmed_error_fails_the_session_with_its_own_kind(confirm: list[object]) -> None:
    st = _serving_with_an_error(T0)
    st, tr = fold([(T0 + 30, item) for item in confirm], st)  # type: ignore[misc]
    assert phases(tr) == ["failed"]
    assert st.session is not None and st.session.failure_kind == "cuda_oom"
    snap = st.snapshot(T0 + 31)
    assert not snap.ready and snap.phase == "failed"


def test_an_error_long_before_the_end_does_not_name_it() -> None:
    """The window: an error logged minutes before an exit explains nothing of it."""
    st = _serving_with_an_error(T0)
    st, tr = fold([(T0 + 300, exited(T0 + 300, code=0))], st)  # type: ignore[list-item]
    assert phases(tr) == ["stopped"]
    assert st.session is not None and st.session.failure_kind is None


def test_bars_of_ever_new_processes_keep_the_state_bounded() -> None:
    """Bar lines each under a process prefix of their own (a red team's 100k `(Wi pid=i)` bars):
    the bars kept stay at `max_bars` and so does what names each process's latest bar (it once
    grew by one entry a process, each copied whole: quadratic time)."""
    st, _ = fold([(T0, started(T0))])  # type: ignore[list-item]
    items = [(T0 + 1 + i * 0.001, bar(1, 2, process=f"W{i}")) for i in range(2000)]
    st, _ = fold(items, st)  # type: ignore[arg-type]
    s = st.session
    assert s is not None and len(s.bars) == st.config.max_bars
    assert len(s.bar_latest) <= st.config.max_bars
    assert set(s.bar_latest.values()) <= set(s.bars)
