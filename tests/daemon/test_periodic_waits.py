"""The daemon's waits: a periodic one ends on its period's grid, so idle tasks of one period
share a wake-up; a stop cuts every sleep short."""

from __future__ import annotations

import asyncio

import pytest

from loadwatch.daemon.tasks import StopEvent, on_grid


@pytest.mark.parametrize(
    ("now", "period", "ends"),
    [(12.3, 5.0, 15.0), (15.0, 5.0, 20.0), (0.2, 0.5, 0.5), (7.99, 1.0, 8.0)],
)
def test_a_periodic_wait_ends_at_the_next_multiple_of_its_period(
    now: float, period: float, ends: float
) -> None:
    assert on_grid(now, period) == pytest.approx(ends)
    assert now < on_grid(now, period) <= now + period


def test_tasks_of_one_period_wake_together_and_a_plain_sleep_lasts_its_time() -> None:
    async def main() -> tuple[list[float], float]:
        loop = asyncio.get_running_loop()
        stop = StopEvent()
        woke: list[float] = []

        async def periodic(delay: float) -> None:
            await asyncio.sleep(delay)
            await stop.sleep(0.3, periodic=True)
            woke.append(loop.time() - t0)

        t0 = loop.time()
        plain = asyncio.ensure_future(stop.sleep(0.3))
        await asyncio.gather(periodic(0.0), periodic(0.05))
        await plain
        return woke, loop.time() - t0

    woke, plain_took = asyncio.run(main())
    assert len(woke) == 2 and abs(woke[0] - woke[1]) < 0.01  # one wake-up, the same grid point
    assert max(woke) < 0.05 + 0.3 + 0.1  # (the later one waited at most its period)
    assert plain_took >= 0.3 - 1e-3  # not on the grid: a backoff or a timeout is not shortened


def test_a_stop_ends_every_sleep_at_once() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        stop = StopEvent()
        t0 = loop.time()
        sleeps = [
            asyncio.ensure_future(stop.sleep(30)),
            asyncio.ensure_future(stop.sleep(30, True)),
        ]
        await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*sleeps)
        await stop.sleep(30)  # set already: no wait at all
        return loop.time() - t0

    assert asyncio.run(main()) < 1.0
