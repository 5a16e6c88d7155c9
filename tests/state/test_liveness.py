"""`Snapshot.live`, what /livez answers: decided once, in the snapshot builder."""

from __future__ import annotations

from loadwatch.daemon.sources.inputs import ProcessEvent, Tick

from .helpers import T0, bar, exited, fail, fold, ms, started


def _loading(until: int = 8, every: float = 5.0) -> list[tuple[float, object]]:
    out: list[tuple[float, object]] = [(T0, started(T0)), (T0 + 1, bar(0, 20))]
    return out + [(T0 + 1 + every * i, bar(i, 20)) for i in range(1, until + 1)]


def test_live_before_any_session_and_while_the_weights_come_in() -> None:
    st, _ = fold([])
    assert st.snapshot(T0).live and st.snapshot(T0).not_live is None
    st, _ = fold([*_loading(), (T0 + 45, Tick())], stall_k=5.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    snap = st.snapshot(T0 + 45)
    assert snap.phase == "loading_weights" and snap.live


def test_not_live_once_stalled_and_live_again_when_progress_resumes() -> None:
    items = _loading() + [(T0 + t, Tick()) for t in range(42, 80)]
    st, _ = fold(items, stall_k=5.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    snap = st.snapshot(T0 + 80)
    assert snap.phase == "stalled" and not snap.live
    assert snap.not_live is not None and snap.not_live.startswith("stalled for 39 s")
    st, _ = fold([(T0 + 81, bar(9, 20))], st)
    assert st.snapshot(T0 + 81).live


def test_a_failure_is_not_live_unless_the_supervisor_restarts_vllm() -> None:
    items = [
        *_loading(2),
        (T0 + 20, fail("cuda_oom", "CUDA out of memory")),
        (T0 + 21, exited(T0 + 21, code=1)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(T0 + 22)
    assert snap.phase == "failed" and not snap.live
    assert snap.not_live == "failed: cuda_oom"
    backoff = ProcessEvent(kind="backoff", ts=T0 + 22, backoff_s=5.0, reason="exit 1")
    st, _ = fold([(T0 + 22, backoff)], st)
    assert st.snapshot(T0 + 23).live  # loadwatch starts it again: not the kubelet's job
    fatal = ProcessEvent(kind="fatal", ts=T0 + 30, reason="crash loop: 5 starts in 900 s")
    st, _ = fold([(T0 + 30, fatal)], st)
    snap = st.snapshot(T0 + 31)
    assert (
        not snap.live and snap.not_live == "the supervisor gave up: crash loop: 5 starts in 900 s"
    )


def test_three_failed_sessions_in_30_minutes_are_a_crash_loop() -> None:
    items: list[tuple[float, object]] = []
    for k in range(3):
        t = T0 + k * 300
        items += [
            (t, started(t, pid=100 + k)),
            (t + 1, ms("version", value="0.32.0")),
            (t + 5, fail("nccl", "NCCL error")),
            (t + 6, exited(t + 6, pid=100 + k, code=1)),
            (t + 7, ProcessEvent(kind="backoff", ts=t + 7, backoff_s=5.0, reason="exit 1")),
        ]
    st, _ = fold(items)  # type: ignore[arg-type]
    snap = st.snapshot(T0 + 620)
    assert not snap.live and snap.not_live is not None and snap.not_live.startswith("crash looping")
    # two failures are not yet a loop, and failures older than 30 minutes do not count
    two, _ = fold(items[:10])  # type: ignore[arg-type]
    assert two.snapshot(T0 + 320).live
    assert st.snapshot(T0 + 600 + 6 + 1801).live
