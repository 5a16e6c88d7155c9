"""GPU sources that need no NVML: the deadline guard around any source, and the null source.

A wedged GPU can make an NVML call hang for minutes. ``GuardedGpuSource`` runs the inner poll on
one worker thread of its own and never makes its caller wait longer than the deadline: past it,
the caller gets the last reading again, flagged stale. While the inner call stays hung no second
call is started, so threads never pile up; when it returns, its result is used and polling goes
on as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from loadwatch.daemon.sources.inputs import GpuHealth, GpuReading, GpuSample, GpuSource, XidEvent


@runtime_checkable
class XidDrainable(Protocol):
    """A source whose Xid events can be taken without polling (and so without NVML calls)."""

    def drain_xids(self) -> tuple[XidEvent, ...]: ...


@runtime_checkable
class Closeable(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class GpuSourceHealth:
    """How the GPU source has been doing, as node_exporter reports per collector."""

    up: bool  # the last reading came back in time and the source was up
    stale: bool  # the last poll overran its deadline
    polls_total: int
    errors_total: int  # polls that came back down, raised, or overran the deadline
    deadline_overruns_total: int
    last_success_ts: float | None  # clock time of the last fresh, up reading
    last_poll_seconds: float | None  # how long the caller waited in the last poll
    poll_in_flight: bool  # an inner poll is still running (hung, or overran and not back yet)


def mark_samples(
    samples: tuple[GpuSample, ...], health: GpuHealth, error: str
) -> tuple[GpuSample, ...]:
    """The same samples with their values kept and their health replaced (lost GPUs stay lost)."""
    return tuple(
        s if s.health == "lost" else dataclasses.replace(s, health=health, error=error)
        for s in samples
    )


@dataclass(slots=True)
class _Outcome:
    reading: GpuReading | None
    error: str | None
    seconds: float


class GuardedGpuSource:
    """Polls ``inner`` on a worker thread and answers within ``deadline_s`` whatever happens.

    ``poll()`` blocks its caller for at most ``deadline_s``; an asyncio loop awaits
    ``poll_async()`` instead, so the loop itself never waits on NVML. The default deadline matches
    the default 1 s poll interval: a poll never takes longer than its tick.
    """

    def __init__(
        self,
        inner: GpuSource,
        *,
        deadline_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive, got {deadline_s}")
        self._inner = inner
        self._deadline_s = deadline_s
        self._clock = clock
        self._monotonic = monotonic
        self._poll_lock = threading.Lock()  # callers one at a time
        self._cv = threading.Condition()
        self._worker: threading.Thread | None = None
        self._requested = False
        self._busy = False
        self._closed = False
        self._outcome: _Outcome | None = None
        self._last: GpuReading | None = None
        self._carried_xids: list[XidEvent] = []
        self._polls = 0
        self._errors = 0
        self._overruns = 0
        self._last_success_ts: float | None = None
        self._last_poll_seconds: float | None = None
        self._up = False
        self._stale = False

    @property
    def inner(self) -> GpuSource:
        return self._inner

    @property
    def deadline_s(self) -> float:
        return self._deadline_s

    def poll(self) -> GpuReading:
        with self._poll_lock:
            start = self._monotonic()
            with self._cv:
                if self._closed:
                    raise RuntimeError("poll() on a closed GPU source")
                late = self._take_outcome()
                if not self._busy:
                    self._busy = True
                    self._requested = True
                    self._ensure_worker()
                    self._cv.notify_all()
                finished = self._cv.wait_for(
                    lambda: self._outcome is not None, timeout=self._deadline_s
                )
                outcome = self._take_outcome() if finished else None
            if late is not None:
                self._absorb_late(late)
            if outcome is not None:
                reading = self._deliver(outcome)
            else:
                reading = self._stale_reading()
            self._polls += 1
            self._last_poll_seconds = self._monotonic() - start
            return reading

    async def poll_async(self) -> GpuReading:
        """``poll()`` on a short-lived executor thread; it too returns within the deadline."""
        return await asyncio.to_thread(self.poll)

    def health(self) -> GpuSourceHealth:
        with self._cv:
            in_flight = self._busy
        return GpuSourceHealth(
            up=self._up,
            stale=self._stale,
            polls_total=self._polls,
            errors_total=self._errors,
            deadline_overruns_total=self._overruns,
            last_success_ts=self._last_success_ts,
            last_poll_seconds=self._last_poll_seconds,
            poll_in_flight=in_flight,
        )

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if isinstance(self._inner, Closeable):
            self._inner.close()

    # -- internals ----------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None:
            # daemon: a worker stuck in a hung driver call must not keep the process alive
            self._worker = threading.Thread(
                target=self._work, name="loadwatch-gpu-poll", daemon=True
            )
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._requested or self._closed)
                if self._closed:
                    return
                self._requested = False
            start = self._monotonic()
            reading: GpuReading | None = None
            error: str | None = None
            try:
                reading = self._inner.poll()
            except Exception as exc:  # any fault of the inner source becomes a down reading
                error = f"GPU poll failed: {type(exc).__name__}: {_one_line(str(exc))}"
            with self._cv:
                self._outcome = _Outcome(reading, error, self._monotonic() - start)
                self._busy = False
                self._cv.notify_all()

    def _take_outcome(self) -> _Outcome | None:
        outcome, self._outcome = self._outcome, None
        return outcome

    def _take_carried(self) -> tuple[XidEvent, ...]:
        carried = tuple(self._carried_xids)
        self._carried_xids.clear()
        return carried

    def _absorb_late(self, late: _Outcome) -> None:
        """A poll that overran has come back: keep its values and pass its Xids on."""
        if late.reading is not None:
            self._carried_xids.extend(late.reading.xids)
            self._last = dataclasses.replace(late.reading, xids=())
            if late.reading.source_up:
                self._last_success_ts = late.reading.ts

    def _deliver(self, outcome: _Outcome) -> GpuReading:
        self._stale = False
        if outcome.reading is None:
            self._errors += 1
            self._up = False
            error = outcome.error or "GPU poll failed"
            samples = mark_samples(self._last.samples, "error", error) if self._last else ()
            return GpuReading(
                ts=self._clock(),
                samples=samples,
                xids=self._take_carried() + self._drain_inner(),
                source_up=False,
                error=error,
                poll_seconds=outcome.seconds,
            )
        reading = outcome.reading
        carried = self._take_carried()
        if carried:
            reading = dataclasses.replace(reading, xids=carried + reading.xids)
        self._last = dataclasses.replace(reading, xids=())
        self._up = reading.source_up
        if reading.source_up:
            self._last_success_ts = reading.ts
        else:
            self._errors += 1
        return reading

    def _stale_reading(self) -> GpuReading:
        self._overruns += 1
        self._errors += 1
        self._up = False
        self._stale = True
        error = f"GPU poll did not finish within {self._deadline_s:g} s; values are stale"
        samples = mark_samples(self._last.samples, "stale", error) if self._last else ()
        return GpuReading(
            ts=self._clock(),
            samples=samples,
            xids=self._take_carried() + self._drain_inner(),
            source_up=False,
            error=error,
            stale=True,
        )

    def _drain_inner(self) -> tuple[XidEvent, ...]:
        # Xid events are most wanted exactly when polls hang, so take them without polling.
        if isinstance(self._inner, XidDrainable):
            try:
                return self._inner.drain_xids()
            except Exception:
                return ()
        return ()


class NullGpuSource:
    """``--gpu none``: no GPUs watched; every reading is up and empty."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock

    def poll(self) -> GpuReading:
        return GpuReading(ts=self._clock(), samples=(), source_up=True, poll_seconds=0.0)

    async def poll_async(self) -> GpuReading:
        return self.poll()

    def close(self) -> None:
        pass


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
