"""The state keeps every count the daemon exports: log events by type, Xid errors by GPU and
code, vLLM's exits by outcome, and what it last knew of the GPUs and the exited trees."""

from __future__ import annotations

from loadwatch.daemon.sources.inputs import (
    GpuReading,
    GpuSample,
    OrphanCheck,
    ProcessEvent,
    XidEvent,
)
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import Totals
from loadwatch.parsers.events import KvScaleWarning
from tests.state.helpers import T0, bar, exited, fold, ms, started


def test_log_events_are_counted_by_type_in_runs_and_across_sessions() -> None:
    warnings = [KvScaleWarning(scale="k", layer=i) for i in range(3)]
    st = LoadState().apply_run([ms("version", value="0.32.0"), bar(0, 4), *warnings], T0)
    st = st.apply_run([bar(1, 4), ms("version", value="0.32.0")], T0 + 1)  # a second session
    assert st.sessions_total == 2
    assert st.events == {"milestone": 2, "shard_progress": 2, "kv_scale_warning": 3}
    # (inputs that are no log event are not counted)
    st = st.apply(started(T0 + 2), T0 + 2)
    assert sum(st.events.values()) == 7


def test_a_run_counts_on_its_own_copy() -> None:
    first = LoadState().apply(bar(0, 4), T0)
    seen = dict(first.events)
    second = first.apply_run([bar(1, 4), bar(2, 4)], T0 + 1)
    assert first.events == seen == {"shard_progress": 1}
    assert second.events == {"shard_progress": 3}


def sample(index: int, uuid: str, cc: tuple[int, int] | None) -> GpuSample:
    return GpuSample(index=index, health="ok", uuid=uuid, compute_capability=cc, sampled_at=T0)


def test_xids_by_gpu_uuid_and_code_and_the_compute_capability_kept() -> None:
    reading = GpuReading(
        ts=T0,
        samples=(sample(0, "GPU-a", (9, 0)),),
        # GPU 0's UUID is its sample's; GPU 3 has no sample in the reading: the event's own
        xids=(XidEvent(0, 79, T0), XidEvent(0, 79, T0), XidEvent(3, 48, T0, uuid="GPU-d")),
    )
    st, _ = fold([(T0, reading)])
    # a poll that failed to read the static facts: the capability stays the one known
    again = GpuReading(ts=T0 + 1, samples=(sample(0, "GPU-a", None),), xids=(XidEvent(0, 13, T0),))
    st, _ = fold([(T0 + 1, again)], st)
    assert st.xids == {(0, "GPU-a", 79): 2, (3, "GPU-d", 48): 1, (0, "GPU-a", 13): 1}
    assert st.gpus[0].compute_capability == (9, 0)
    (view,) = st.snapshot(T0 + 1).gpus
    assert (view.xids_total, view.last_xid) == (3, 13)


def test_exits_by_outcome_and_the_last_start() -> None:
    items = [
        (T0, started(T0)),
        (T0 + 1, exited(T0 + 1, code=0)),
        (T0 + 2, started(T0 + 2, pid=101)),
        # exit code 0 after a fatal error in the log: the supervisor's verdict is failed
        (T0 + 3, ProcessEvent(kind="exited", ts=T0 + 3, pid=101, exit_code=0, failed=True)),
        (T0 + 4, started(T0 + 4, pid=102)),
        (T0 + 5, exited(T0 + 5, pid=102, code=None, signal=9)),
        (T0 + 6, started(T0 + 6, pid=103)),
    ]
    st, _ = fold(items)  # type: ignore[arg-type]
    assert st.vllm_exits == {"clean": 1, "failed": 1, "signal": 1}
    assert st.vllm_started_at == T0 + 6


def test_the_orphans_of_the_last_tree() -> None:
    st = LoadState()
    assert st.orphans is None  # not checked yet
    st = st.apply(OrphanCheck(ts=T0, leaked=2), T0)
    st = st.apply(OrphanCheck(ts=T0 + 1, leaked=0), T0 + 1)
    assert st.orphans == 0


def test_totals_are_the_states_lifetime_and_the_current_session() -> None:
    warnings = [KvScaleWarning(scale="k", layer=1), KvScaleWarning(scale="v", layer=1)]
    st = LoadState().apply_run([ms("version", value="0.32.0"), *warnings], T0)
    st = st.apply_run([ms("version", value="0.32.0"), warnings[0]], T0 + 1)
    reading = GpuReading(ts=T0, samples=(sample(0, "GPU-a", (9, 0)),), xids=(XidEvent(0, 79, T0),))
    st = st.apply(reading, T0 + 2)
    totals = Totals.of(st, st.snapshot(T0 + 2))
    assert totals.warnings == {"kv_scale_missing": 3}
    assert totals.events == {"milestone": 2, "kv_scale_warning": 3}
    assert totals.xids == {(0, "GPU-a", 79): 1}
