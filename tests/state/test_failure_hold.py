"""How a session ends: a fatal failure held for the echoes of its crash and said once, of its root
cause (`failure_hold_s`); a vLLM gone without a word (`vanished`); a session read back ready,
which is not ready until a live answer says so.

The failures are the records of real vLLM 0.32 runs (tests/state/fixtures, tests/fixtures),
through the real parser, each folded when the daemon reads it live: the first failure line
(`EngineCore failed to start.`) at once, the traceback that says why when it closes (the next
record, or 2 s of quiet: sources/log/source.py QUIET_CLOSE_S), its echoes when vLLM writes them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from loadwatch.daemon.sources.inputs import HealthProbe, LoggedProcessSeen, ProcessEvent, Tick
from loadwatch.daemon.state.loadstate import Input, LoadState, StateConfig
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.parsers import Event, EventStream, split_records
from loadwatch.parsers.events import Failure
from loadwatch.parsers.vllm.catalog import failure

from .helpers import T0, ms, started

STATE_FIXTURES = Path(__file__).parent / "fixtures"
FIXTURES = Path(__file__).parents[1] / "fixtures"
HOLD_S = 5.0


def events(path: Path) -> list[Event]:
    ref = datetime(2026, 12, 1).timestamp()
    return EventStream(ref_ts=ref).feed_all(split_records(path.read_bytes()))


def state(hold_s: float = HOLD_S) -> LoadState:
    return LoadState(config=StateConfig(failure_hold_s=hold_s))


class Live:
    """Inputs folded one at a time at the daemon's clock; every transition and snapshot kept."""

    def __init__(self, st: LoadState) -> None:
        self.st = st
        self.transitions: list[Transition] = []
        self.kinds_seen: set[str | None] = set()  # the session's failure kind after each input

    def apply(self, item: Input, now: float, *, replay: bool = False) -> None:
        self.st = self.st.apply(item, now, replay=replay)
        self.transitions.extend(self.st.transitions)
        snap = self.st.snapshot(now)
        self.kinds_seen.add(snap.session.failure_kind if snap.session else None)

    def ticks(self, start: float, end: float) -> None:
        t = start
        while t <= end:
            self.apply(Tick(), t)
            t += 1.0

    def named(self, kind: str) -> list[Transition]:
        return [t for t in self.transitions if t.kind == kind]


def failed_start(live: Live, path: Path) -> tuple[float, list[Failure]]:
    """The run up to its first failure, folded; the time the first failure is read, and the
    failures in the order they come."""
    evs = events(path)
    first = next(i for i, e in enumerate(evs) if isinstance(e, Failure))
    now = 0.0
    for e in evs[:first]:
        now = max(now, (e.ts or now) + 0.1)
        live.apply(e, now)
    return now + 0.1, [e for e in evs[first:] if isinstance(e, Failure)]


# -- one failure, of the root cause -------------------------------------------------------------


def test_a_failed_start_says_one_failure_of_its_root_cause() -> None:
    """`--kv-cache-memory-bytes 1000000` on real vLLM 0.32: `EngineCore failed to start.` comes
    first, the KV-cache traceback 2 s later, the worker's death and the API server's
    `Engine core initialization failed` after. One failure, `kv_cache_too_small`; the session
    never reads `engine_init_failed` (the alert's `kind`: loadwatch_session_failure)."""
    live = Live(state())
    t, failures = failed_start(live, STATE_FIXTURES / "vllm-0.32-cpu-kv-too-small.log")
    assert [f.kind for f in failures] == [
        "engine_init_failed",
        "kv_cache_too_small",
        "worker_died",
        "kv_cache_too_small",
        "engine_init_failed",
    ]
    arrive = [t, t + 2.0, t + 4.5, t + 4.5, t + 4.5]
    live.ticks(t - 1, t - 1)
    for f, at in zip(failures, arrive, strict=True):
        live.apply(f, at)
        if at == t:
            snap = live.st.snapshot(t)
            assert snap.phase == "post_load" and not snap.ready
            assert snap.not_ready is not None and snap.not_ready.startswith("not ready: failing")
        live.ticks(at + 0.5, at + 0.5)
    live.ticks(t + 5.0, t + 8.0)
    (failure,) = live.named("failure")
    assert failure.failure_kind == "kv_cache_too_small" and failure.fatal is True
    assert failure.message is not None and failure.message.startswith("ValueError: ")
    failed = [p for p in live.named("phase") if p.phase_to == "failed"]
    assert [(p.failure_kind, p.at) for p in failed] == [("kv_cache_too_small", t)]
    assert live.kinds_seen == {None, "kv_cache_too_small"}
    s = live.st.session
    assert s is not None and s.failing is None
    (root,) = s.failures.values()
    assert root.kind == "kv_cache_too_small" and root.echoes == 4


def test_without_a_hold_the_first_fatal_line_decides_and_the_root_corrects_it() -> None:
    """`failure_hold_s = 0` (the state's default, and what loadwatch did before): the kind the
    session first fails with is the echo's."""
    live = Live(state(0.0))
    t, failures = failed_start(live, STATE_FIXTURES / "vllm-0.32-cpu-kv-too-small.log")
    for i, f in enumerate(failures):
        live.apply(f, t + i)
    assert [f.failure_kind for f in live.named("failure")] == [
        "engine_init_failed",
        "kv_cache_too_small",
    ]
    assert live.st.session is not None and live.st.session.failure_kind == "kv_cache_too_small"


def crashed_and_held() -> Live:
    """A supervised start (pid 30131) whose crash's first two failures (a real vLLM 0.32 CPU
    start, KV cache too small) were read at T0 and T0 + 1: held for their echoes."""
    live = Live(state())
    live.apply(started(T0 - 10, pid=30131), T0 - 10)
    evs = events(STATE_FIXTURES / "vllm-0.32-cpu-kv-too-small.log")
    failures = [e for e in evs if isinstance(e, Failure)]
    live.apply(failures[0], T0)
    live.apply(failures[1], T0 + 1)
    return live


def test_the_process_exit_decides_a_held_failure_at_once() -> None:
    live = crashed_and_held()
    live.apply(ProcessEvent(kind="exited", ts=T0 + 2, pid=30131, exit_code=1), T0 + 2)
    snap = live.st.snapshot(T0 + 2)
    assert snap.phase == "failed" and snap.session is not None
    assert snap.session.failure_kind == "kv_cache_too_small"
    (failure,) = live.named("failure")
    assert failure.failure_kind == "kv_cache_too_small" and failure.at == T0
    (phase,) = [p for p in live.named("phase") if p.phase_to == "failed"]
    assert phase.reason is not None and phase.reason.endswith("(then vLLM exited with code 1)")


def test_leftovers_ended_after_the_exit_are_no_stop_request() -> None:
    """The supervisor ends what is left of the tree after vLLM's main process exited by itself
    (`ending_leftovers`, before the exit is reported): the held failure still decides, as a
    stop that was asked for would not let it."""
    live = crashed_and_held()
    why = "vLLM exited; ending 1 leftover process(es)"
    live.apply(ProcessEvent(kind="ending_leftovers", ts=T0 + 2, pid=30131, reason=why), T0 + 2)
    live.apply(ProcessEvent(kind="exited", ts=T0 + 2, pid=30131, exit_code=1), T0 + 2)
    snap = live.st.snapshot(T0 + 2)
    assert snap.phase == "failed" and snap.session is not None
    assert snap.session.failure_kind == "kv_cache_too_small"
    assert not snap.session.stop_requested


def test_a_new_start_decides_the_held_failure_of_the_one_before() -> None:
    live = Live(state())
    live.apply(started(T0 - 10, pid=1), T0 - 10)
    failure = next(
        e for e in events(FIXTURES / "real-v0.32-kv-too-small.log") if isinstance(e, Failure)
    )
    live.apply(failure, T0)
    live.apply(started(T0 + 1, pid=2), T0 + 1)
    (past,) = live.st.past
    assert past.phase == "failed" and past.failure_kind == "engine_init_failed"
    assert [t.kind for t in live.transitions[-3:]] == ["failure", "phase", "session_started"]


def test_an_engine_dead_while_serving_fails_once_when_the_server_shuts_down() -> None:
    """Real vLLM 0.32 serving an FP8 KV cache its CPU kernels cannot read: the worker's death
    first, the root traceback after, then uvicorn's `Shutting down` (no stop was asked for):
    the session fails, once, of the root cause, at the shutdown line."""
    live = Live(state())
    now = 0.0
    for e in events(FIXTURES / "real-v0.32-deepseek-fp8kv.log"):
        now = max(now, (e.ts or now) + 0.1)
        live.apply(e, now)
    (failure,) = live.named("failure")
    assert failure.failure_kind == "fp8_kv_unsupported" and failure.fatal is True
    s = live.st.session
    assert s is not None and s.phase == "failed" and s.failure_kind == "fp8_kv_unsupported"
    (phase,) = [p for p in live.named("phase") if p.phase_to == "failed"]
    assert phase.reason is not None and phase.reason.endswith("(then vLLM shut down)")


# -- a requested stop ---------------------------------------------------------------------------

# vLLM 0.32's engine core when its worker dies (tests/fixtures/real-v0.32-kv-too-small.log)
WORKER_DIED = "Worker proc VllmWorker-0 died unexpectedly (exit code: 0), shutting down executor."


def ready_session(live: Live) -> None:
    for i, m in enumerate(
        (
            ms("version", value="0.32.0", process="APIServer", pid=700),
            ms("model_load_start"),
            ms("api_server_start", value="http://127.0.0.1:8000", process="APIServer", pid=700),
            ms("app_startup_complete"),
        )
    ):
        live.apply(m, T0 + i)


def worker_died() -> Failure:
    return failure(kind="worker_died", message=WORKER_DIED, process="EngineCore", engine_fatal=True)


def test_a_requested_stop_writes_no_worker_died_failure() -> None:
    """SIGTERM to vLLM's process group: a worker dies of it, and the engine core says so before
    the API server's `[shutdown] API server: shutdown triggered` is read. That is the stop."""
    live = Live(state())
    ready_session(live)
    live.apply(worker_died(), T0 + 10)
    assert not live.st.snapshot(T0 + 10).ready  # the engine said it died: not ready at once
    live.apply(ms("shutdown", value="API server: shutdown triggered"), T0 + 11)
    live.ticks(T0 + 12, T0 + 20)
    assert live.named("failure") == []
    s = live.st.session
    assert s is not None and s.phase == "stopped" and s.failure_kind is None and s.stop_requested
    assert all(not v.fatal for v in s.failures.values())


def test_a_dead_worker_with_no_stop_fails_the_session_once_the_hold_is_over() -> None:
    live = Live(state())
    ready_session(live)
    live.apply(worker_died(), T0 + 10)
    live.ticks(T0 + 11, T0 + 14)
    assert live.st.snapshot(T0 + 14).phase == "ready" and live.named("failure") == []
    live.ticks(T0 + 15, T0 + 15)
    (failure,) = live.named("failure")
    assert failure.failure_kind == "worker_died" and failure.at == T0 + 10
    assert live.st.snapshot(T0 + 15).phase == "failed"


def test_a_failure_held_from_records_read_back_is_marked_replay() -> None:
    """Decided after the backlog was read (a restart): the event log marks it, and the
    supervisor's current run is not told of it (loop.py `tell_supervisor`)."""
    live = Live(state())
    failure = next(
        e for e in events(FIXTURES / "real-v0.32-kv-too-small.log") if isinstance(e, Failure)
    )
    live.apply(ms("version", value="0.32.0"), T0, replay=True)
    live.apply(failure, T0 + 1, replay=True)
    live.ticks(T0 + 6, T0 + 6)
    (t,) = live.named("failure")
    assert t.replay is True and t.failure_kind == "engine_init_failed"


# -- vanished -----------------------------------------------------------------------------------


def test_a_process_gone_while_loading_with_no_line_fails_as_vanished() -> None:
    live = Live(state())
    live.apply(ms("version", value="0.32.0", process="APIServer", pid=700), T0)
    live.apply(ms("model_load_start"), T0 + 1)
    live.apply(LoggedProcessSeen(ts=T0 + 5, pid=700, alive=False), T0 + 5)
    snap = live.st.snapshot(T0 + 5)
    assert snap.phase == "failed" and snap.session is not None
    assert snap.session.failure_kind == "vanished" and snap.session.verdict == "failed"
    assert not snap.live and snap.not_live == "failed: vanished"


# -- a session read back ready ------------------------------------------------------------------


def read_back_ready(live: Live) -> None:
    """The log of a vLLM that was ready, read back by a daemon that just started."""
    for i, m in enumerate(
        (
            ms("version", value="0.32.0", process="APIServer", pid=700),
            ms("model_load_start"),
            ms("api_server_start", value="http://127.0.0.1:8000", process="APIServer", pid=700),
            ms("app_startup_complete"),
        )
    ):
        live.apply(m, T0 + 100 + i / 10, replay=True)


def test_a_session_read_back_ready_waits_for_a_live_health_answer() -> None:
    live = Live(state())
    read_back_ready(live)
    snap = live.st.snapshot(T0 + 100)
    assert snap.phase == "ready" and not snap.ready
    assert snap.not_ready == (
        "not ready: ready in the log read back, waiting for a live /health answer"
    )
    live.apply(HealthProbe(ok=True, ts=T0 + 101, status=200), T0 + 101)
    assert live.st.snapshot(T0 + 101).ready


def test_a_session_read_back_ready_is_ready_once_its_process_is_seen_here() -> None:
    live = Live(state())
    read_back_ready(live)
    live.apply(LoggedProcessSeen(ts=T0 + 101, pid=700, alive=True, argv=("vllm",)), T0 + 101)
    assert live.st.snapshot(T0 + 101).ready


def test_a_session_read_back_ready_whose_process_is_not_here_fails_as_vanished() -> None:
    """/health fails, and no process has the logged pid here (vllm_watch.py says so)."""
    live = Live(state())
    read_back_ready(live)
    for i in (1, 2):
        live.apply(HealthProbe(ok=False, ts=T0 + 100 + i, error="connection refused"), T0 + 100 + i)
    seen = LoggedProcessSeen(ts=T0 + 102, pid=700, alive=False, was_seen=False)
    live.apply(seen, T0 + 102)
    snap = live.st.snapshot(T0 + 102)
    assert snap.phase == "failed" and not snap.ready and snap.session is not None
    assert snap.session.failure_kind == "vanished"
    (phase,) = [p for p in live.named("phase") if p.phase_to == "failed"]
    assert phase.reason is not None
    assert phase.reason.startswith("vLLM process 700 is not running here and /health fails")
