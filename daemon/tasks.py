"""The daemon's periodic tasks: GPU polls, the tick, /proc I/O, following the log.

Each runs on the daemon's loop until the daemon stops (`Pace.stopped`), is handed what it uses
(the source it reads, the daemon's `apply` that folds a reading into the state, the publisher),
and waits with `Pace.nap` or the daemon's `sleep` (injectable, as the clock is).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loadwatch.daemon.eventfeed import EventFeed
from loadwatch.daemon.publish import Publisher, status_line
from loadwatch.daemon.sdnotify import SdNotifier
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource, NullGpuSource
from loadwatch.daemon.sources.inputs import GpuReading, IoReader, IoSample, Tick
from loadwatch.daemon.sources.log.source import LogSource, Notice, Run
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.snapshot import Snapshot

TICK_S = 1.0  # while a load is in flight: stall checks, STATUS=, publishing the ETA
IDLE_TICK_S = 5.0  # tick and GPU poll with nothing loading (no session, ready, failed, stopped)
IO_SAMPLE_S = 1.0


class Pace:
    """The idle tasks' waits (`nap`), which a load that starts (or ends) cuts short."""

    def __init__(
        self,
        busy: Callable[[], bool],
        sleep: Callable[[float], Awaitable[None]] | None,
        stopped: Callable[[], bool],
    ) -> None:
        self.busy = busy  # a load is in flight: the tasks run at full pace
        self.stopped = stopped  # the daemon is stopping
        self._sleep = sleep
        self._was_busy = False
        self._naps: set[asyncio.Future[None]] = set()

    async def nap(self, seconds: float | None, step_s: float) -> None:
        """Sleep `seconds` (None: until `busy` changes), or less once `busy` changes. With an
        injected sleep, in steps of `step_s` that look at `busy`, as the tests' virtual time
        expects; else one timer, or none."""
        if self._sleep is not None:
            busy, waited = self.busy(), 0.0
            while (seconds is None or waited < seconds) and self.busy() == busy:
                if self.stopped():
                    return
                await self._sleep(step_s)
                waited += step_s
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, woken) if seconds is not None else None
        self._naps.add(woken)
        try:
            await woken
        finally:
            if timer is not None:
                timer.cancel()
            self._naps.discard(woken)

    def check(self) -> None:
        """After transitions: a change of `busy` ends the naps."""
        busy = self.busy()
        if busy != self._was_busy:
            self._was_busy = busy
            for woken in self._naps:
                _wake(woken)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


async def poll_gpus(
    gpu: GuardedGpuSource | NullGpuSource,
    interval_s: float,
    *,
    apply: Callable[[GpuReading], None],
    feed: EventFeed,
    publisher: Publisher,
    pace: Pace,
) -> None:
    once = isinstance(gpu, NullGpuSource)  # `--gpu none`: every reading is the first one
    last_error: str | None = None
    last_health: tuple[bool, str | None] | None = None
    while not pace.stopped():
        reading = await gpu.poll_async()
        for x in reading.xids:
            feed.line("gpu.xid", gpu=x.gpu_index, uuid=reading.uuid_of(x), xid=x.xid)
        if reading.error != last_error and reading.error:
            feed.problem(f"GPU source: {reading.error}")
        last_error = reading.error
        apply(reading)
        health = (reading.source_up, reading.error)
        if health != last_health:  # a change of health goes out with the state it fed
            last_health = health
            publisher.urgent()
        publisher.changed()  # (readings alone: within the publishing interval)
        if once:
            return
        # While nothing loads, a poll every IDLE_TICK_S; a load that starts meanwhile wakes it.
        await pace.nap(interval_s if pace.busy() else IDLE_TICK_S, interval_s)


async def tick(
    *,
    apply: Callable[[Tick], None],
    state: Callable[[], LoadState],
    snapshot: Callable[[], Snapshot],
    feed: EventFeed,
    publisher: Publisher,
    notifier: SdNotifier,
    on_stall: Callable[[float], None],
    clock: Callable[[], float],
    pace: Pace,
) -> None:
    """Every second while a load is busy, else every IDLE_TICK_S: the stall clock, STATUS=,
    publishing; `on_stall` hears how long a stalled load has been stalled (the supervisor's
    policy decides)."""
    last_status = ""
    while not pace.stopped():
        feed.check()
        apply(Tick())
        if pace.busy():  # the ETA and the stall clock move on their own
            publisher.changed()
        else:  # nothing renders what did not change; the HTTP process hears the loop runs
            publisher.alive(IDLE_TICK_S)
        if notifier.enabled:  # (the line costs a snapshot: made only for systemd to read)
            line = status_line(snapshot())
            if line != last_status:
                last_status = line
                notifier.status(line)
        s = state().session
        if s is not None and s.stall is not None:
            on_stall(clock() - s.stall.since)
        await pace.nap(TICK_S if pace.busy() else IDLE_TICK_S, TICK_S)


async def sample_io(
    reader: IoReader,
    pids_of: Callable[[], Sequence[int]],
    *,
    state: Callable[[], LoadState],
    apply: Callable[[IoSample], None],
    pace: Pace,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Bytes read by the vLLM processes: the supervised one's tree, or in watch mode the trees
    of the pids the log's prefixes name (those that run on this host)."""
    while not pace.stopped():
        s = state().session
        phase = s.phase if s is not None else None
        if phase not in ("starting", "loading_weights", "stalled"):
            # no /proc to read: until a load starts (which ends the nap), beside a serving vLLM
            # without a wake-up of its own; in a busy phase that reads nothing, a look now and then
            await pace.nap(IDLE_TICK_S if pace.busy() else None, IO_SAMPLE_S)
            continue
        pids = pids_of()
        if pids:
            sample: IoSample = reader.read_many(pids)
            if sample.read_bytes is not None:
                apply(sample)
        await sleep(IO_SAMPLE_S)


async def follow_log(
    source: LogSource,
    take: Callable[[Sequence[Run | Notice]], None],
    stop_event: asyncio.Event,
) -> None:
    """Read the log source, apply what it hands over (`take`), wait for more (a change event
    and the source's coalescing tick, or one second), until stopped.

    A wake-up is a callback of the loop (the source's `arm`), not a task: beside a serving vLLM
    this runs ten times a second for days, and a task, its futures and an `asyncio.wait` per
    wake-up cost more than the read. A failure ends the task with it (the daemon says so)."""
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()
    disarm: list[Callable[[], None]] = []

    def step(_event: bool = False) -> None:
        disarm.clear()
        if failed.done() or stop_event.is_set():
            return
        try:
            take(source.read())
            if source.backlog:  # more is there now: read on, letting the loop's other work in
                loop.call_soon(step)
            else:
                disarm.append(source.arm(loop, step, 1.0))
        except Exception as exc:  # (the task reports it)
            failed.set_exception(exc)

    step()
    stop: asyncio.Future[Any] = asyncio.ensure_future(stop_event.wait())
    try:
        await asyncio.wait((stop, failed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        for off in disarm:
            off()
    if failed.done():
        failed.result()
