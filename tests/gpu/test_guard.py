"""GuardedGpuSource: a hung inner poll turns stale within the deadline, and nothing piles up."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from loadwatch.daemon.sim.gpus import GIB, SimulatedGpuSource
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource, NullGpuSource
from loadwatch.daemon.sources.gpu.nvml import NvmlSource
from loadwatch.daemon.sources.inputs import GpuReading, GpuSample
from tests.gpu import fake_pynvml as fk
from tests.helpers import wait_for

DEADLINE_S = 0.05
SLACK_S = 0.5  # scheduling noise on a shared two-core machine


def poll_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "loadwatch-gpu-poll")


def timed(fn: Callable[[], GpuReading]) -> tuple[GpuReading, float]:
    t0 = time.monotonic()
    r = fn()
    return r, time.monotonic() - t0


@pytest.fixture
def sim() -> SimulatedGpuSource:
    progress = {"p": 0.5}
    return SimulatedGpuSource(4, progress=lambda: progress["p"], final_used_bytes=80 * GIB)


def test_passes_readings_through_and_counts(sim: SimulatedGpuSource) -> None:
    g = GuardedGpuSource(sim, deadline_s=2.0, clock=lambda: 42.0)
    r = g.poll()
    assert r.source_up and not r.stale and len(r.samples) == 4
    assert all(s.health == "ok" for s in r.samples)
    r2 = g.poll()
    h = g.health()
    assert (h.polls_total, h.errors_total, h.deadline_overruns_total) == (2, 0, 0)
    assert h.up and not h.stale and not h.poll_in_flight
    assert h.last_success_ts == r2.ts
    assert h.last_poll_seconds is not None and h.last_poll_seconds < 2.0
    g.close()


def test_hung_inner_is_stale_within_the_deadline_and_keeps_last_values(
    sim: SimulatedGpuSource,
) -> None:
    g = GuardedGpuSource(sim, deadline_s=DEADLINE_S)
    good = g.poll()
    sim.hang()
    try:
        r, took = timed(g.poll)
        assert took < DEADLINE_S + SLACK_S
        assert r.stale and not r.source_up
        assert r.error == "GPU poll did not finish within 0.05 s; values are stale"
        assert [s.health for s in r.samples] == ["stale"] * 4
        assert [s.memory_used_bytes for s in r.samples] == [
            s.memory_used_bytes for s in good.samples
        ]
        assert [s.sampled_at for s in r.samples] == [s.sampled_at for s in good.samples]
        assert not any(s.up for s in r.samples)
        h = g.health()
        assert h.stale and not h.up and h.poll_in_flight
        assert h.deadline_overruns_total == 1 and h.errors_total == 1
    finally:
        sim.unhang()
    g.close()


def test_no_thread_pile_up_while_the_inner_call_stays_hung(sim: SimulatedGpuSource) -> None:
    threads_before = poll_threads()  # a closed guard's worker from an earlier test may linger
    g = GuardedGpuSource(sim, deadline_s=0.02)
    g.poll()
    polls_before = sim.polls
    sim.hang()
    try:
        for _ in range(20):
            r, took = timed(g.poll)
            assert r.stale
            assert took < 0.02 + SLACK_S
        assert poll_threads() <= threads_before + 1
        # only the one hung call was made; no new inner poll while it is stuck
        assert sim.polls == polls_before
        assert g.health().deadline_overruns_total == 20
    finally:
        sim.unhang()
    g.close()


def test_recovers_when_the_inner_call_returns(sim: SimulatedGpuSource) -> None:
    threads_before = poll_threads()
    g = GuardedGpuSource(sim, deadline_s=DEADLINE_S)
    g.poll()
    sim.hang()
    assert g.poll().stale
    sim.unhang()
    r = g.poll()  # the late result, or a fresh one: either way no longer stale
    assert not r.stale and r.source_up
    assert all(s.health == "ok" for s in r.samples)
    r = g.poll()
    assert not r.stale and r.source_up
    h = g.health()
    assert h.up and not h.stale and h.deadline_overruns_total == 1
    assert poll_threads() <= threads_before + 1
    g.close()


def test_no_reading_yet_when_the_first_poll_hangs(sim: SimulatedGpuSource) -> None:
    g = GuardedGpuSource(sim, deadline_s=DEADLINE_S)
    sim.hang()
    try:
        r = g.poll()
        assert r.stale and not r.source_up and r.samples == ()
    finally:
        sim.unhang()
    g.close()


def test_xids_raised_during_a_hang_are_delivered_exactly_once(sim: SimulatedGpuSource) -> None:
    g = GuardedGpuSource(sim, deadline_s=DEADLINE_S)
    g.poll()
    sim.hang()
    try:
        sim.raise_xid(3, 79)
        r = g.poll()
        assert r.stale
        assert [(x.gpu_index, x.xid) for x in r.xids] == [(3, 79)]
        assert g.poll().xids == ()
    finally:
        sim.unhang()
    seen = [x for _ in range(3) for x in g.poll().xids]
    assert seen == []
    g.close()


class SlowOnce:
    """Answers its first poll once `release` is set, at once afterwards; Xids in every answer."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.n = 0

    def poll(self) -> GpuReading:
        self.n += 1
        if self.n == 1:
            self.release.wait(10)
        from loadwatch.daemon.sources.inputs import XidEvent

        return GpuReading(
            ts=float(self.n),
            samples=(GpuSample(index=0, health="ok", memory_used_bytes=self.n),),
            xids=(XidEvent(gpu_index=0, xid=self.n, ts=float(self.n)),),
        )


def test_a_late_result_is_kept_and_its_xids_are_passed_on() -> None:
    inner = SlowOnce()
    g = GuardedGpuSource(inner, deadline_s=0.02)
    assert g.poll().stale
    inner.release.set()
    wait_for(lambda: not g.health().poll_in_flight, "the first call back", 10)
    r = g.poll()
    assert not r.stale
    assert r.samples[0].memory_used_bytes == 2  # the fresh answer
    assert [x.xid for x in r.xids] == [1, 2]  # the late answer's events first, none lost
    assert g.health().last_success_ts == 2.0
    g.close()


class Boom:
    def poll(self) -> GpuReading:
        raise RuntimeError("binding exploded\nwith a second line")


def test_an_inner_exception_is_a_down_reading_with_one_line() -> None:
    g = GuardedGpuSource(Boom(), deadline_s=1.0)
    r = g.poll()
    assert not r.source_up and not r.stale
    assert r.error == "GPU poll failed: RuntimeError: binding exploded with a second line"
    assert g.health().errors_total == 1
    assert g.poll().error == r.error  # the worker survives the exception and polls again
    assert (g.health().polls_total, g.health().errors_total) == (2, 2)
    g.close()


def test_guarding_the_nvml_source_with_a_hung_driver_call() -> None:
    release = threading.Event()
    fake = fk.FakeNvml(fk.devices(2))
    src = NvmlSource(fake, xid_events=False)
    g = GuardedGpuSource(src, deadline_s=DEADLINE_S)
    assert g.poll().source_up
    fake.devices[1].hang = release
    try:
        r, took = timed(g.poll)
        assert r.stale and took < DEADLINE_S + SLACK_S
        assert [s.health for s in r.samples] == ["stale", "stale"]
    finally:
        release.set()
    r = g.poll()
    assert not r.stale and all(s.up for s in r.samples)
    g.close()
    assert fake.refcount == 0  # closing the guard closes the NVML source


def test_lost_gpus_stay_lost_in_a_stale_reading(sim: SimulatedGpuSource) -> None:
    g = GuardedGpuSource(sim, deadline_s=DEADLINE_S)
    sim.lose_gpu(2)
    g.poll()
    sim.hang()
    try:
        r = g.poll()
        assert [s.health for s in r.samples] == ["stale", "stale", "lost", "stale"]
    finally:
        sim.unhang()
    g.close()


def test_deadline_must_be_positive(sim: SimulatedGpuSource) -> None:
    with pytest.raises(ValueError, match="deadline_s must be positive"):
        GuardedGpuSource(sim, deadline_s=0)


def test_poll_after_close_is_refused(sim: SimulatedGpuSource) -> None:
    g = GuardedGpuSource(sim, deadline_s=1.0)
    g.poll()
    g.close()
    with pytest.raises(RuntimeError, match="closed"):
        g.poll()


def test_null_source_is_up_and_empty() -> None:
    r = NullGpuSource(clock=lambda: 9.0).poll()
    assert r == GpuReading(ts=9.0, samples=(), source_up=True, poll_seconds=0.0)


def test_poll_async_keeps_the_event_loop_free_while_the_inner_call_hangs(
    sim: SimulatedGpuSource,
) -> None:
    import asyncio

    g = GuardedGpuSource(sim, deadline_s=0.2)

    async def main() -> tuple[GpuReading, list[float]]:
        first = await g.poll_async()
        assert first.source_up
        sim.hang()
        loop = asyncio.get_running_loop()
        ran: list[float] = []
        for at in (0.05, 0.1, 0.15):  # the loop's other work, all along the 0.2 s wait
            loop.call_later(at, ran.append, at)
        reading = await g.poll_async()
        return reading, list(ran)  # (what ran before the answer came)

    try:
        reading, ran = asyncio.run(main())
    finally:
        sim.unhang()
    assert reading.stale
    assert ran == [0.05, 0.1, 0.15]  # the loop ran its other work during the wait
    g.close()
