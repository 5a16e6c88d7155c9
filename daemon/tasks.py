"""The daemon's periodic tasks besides the log: GPU polls, the tick, /proc I/O.

Each runs on the daemon's loop until its stop event is set, feeds its readings to the state
through `the daemon's `apply`` and sleeps with `its `sleep`` (injectable, as the clock is).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from loadwatch.daemon.publish import Host, status_line
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.sources.inputs import IoSample, Tick

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
        self._busy, self._sleep, self._stopped = busy, sleep, stopped
        self._was_busy = False
        self._naps: set[asyncio.Future[None]] = set()

    async def nap(self, seconds: float, step_s: float) -> None:
        """Sleep `seconds`, or less once `busy` changes. With an injected sleep, in steps of
        `step_s` that look at `busy`, as the tests' virtual time expects; else one timer."""
        if self._sleep is not None:
            busy, waited = self._busy(), 0.0
            while waited < seconds and self._busy() == busy and not self._stopped():
                await self._sleep(step_s)
                waited += step_s
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, woken)
        self._naps.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._naps.discard(woken)

    def check(self) -> None:
        """After transitions: a change of `busy` ends the naps."""
        busy = self._busy()
        if busy != self._was_busy:
            self._was_busy = busy
            for woken in self._naps:
                _wake(woken)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


async def poll_gpus(d: Host) -> None:
    interval = d.cfg.gpu.poll_interval_s
    once = isinstance(d.gpu, NullGpuSource)  # `--gpu none`: every reading is the first one
    last_error: str | None = None
    last_health: tuple[bool, str | None] | None = None
    while not d.stop_event.is_set():
        reading = await d.gpu.poll_async()
        for x in reading.xids:
            d.feed.line("gpu.xid", gpu=x.gpu_index, uuid=reading.uuid_of(x), xid=x.xid)
        if reading.error != last_error and reading.error:
            d.feed.problem(f"GPU source: {reading.error}")
        last_error = reading.error
        d.apply(reading)
        health = (reading.source_up, reading.error)
        if health != last_health:  # a change of health goes out with the state it fed
            last_health = health
            d.publisher.urgent()
        d.publisher.changed()  # (readings alone: within the publishing interval)
        if once:
            return
        # While nothing loads, a poll every IDLE_TICK_S; a load that starts meanwhile wakes it.
        await d.pace.nap(interval if d.busy else IDLE_TICK_S, interval)


async def tick(d: Host) -> None:
    last_status = ""
    while not d.stop_event.is_set():
        d.feed.check()
        d.apply(Tick())
        if d.busy:  # the ETA and the stall clock move on their own
            d.publisher.changed()
        else:  # nothing renders what did not change; the HTTP process hears the loop runs
            d.publisher.alive(IDLE_TICK_S)
        line = status_line(d.snapshot())
        if line != last_status:
            last_status = line
            d.notifier.status(line)
        s = d.state.session
        if d.supervisor is not None and s is not None and s.stall is not None:
            # while the load is stalled, tell the supervisor how long for (its policy decides)
            d.supervisor.note_stall(d.clock() - s.stall.since)
        await d.pace.nap(TICK_S if d.busy else IDLE_TICK_S, TICK_S)


async def sample_io(d: Host, pids_of: Callable[[], Sequence[int]]) -> None:
    """Bytes read by the vLLM processes: the supervised one's tree, or in watch mode the trees
    of the pids the log's prefixes name (those that run on this host)."""
    from loadwatch.daemon.sources.proc.io_counters import ProcIoReader

    reader = d.io_reader or ProcIoReader(clock=d.clock)
    while not d.stop_event.is_set():
        phase = d.state.session.phase if d.state.session is not None else None
        if phase not in ("starting", "loading_weights", "stalled"):
            await d.pace.nap(IDLE_TICK_S, IO_SAMPLE_S)  # (until a load starts: no /proc to read)
            continue
        pids = pids_of()
        if pids:
            sample: IoSample = reader.read_many(pids)
            if sample.read_bytes is not None:
                d.apply(sample)
        await d.sleep(IO_SAMPLE_S)


async def follow_log(d: Host) -> None:
    """Read the log source, apply what it hands over, wait for more (a change event and the
    source's coalescing tick, or one second), until stopped.

    A wake-up is a callback of the loop (the source's `arm`), not a task: beside a serving vLLM
    this runs ten times a second for days, and a task, its futures and an `asyncio.wait` per
    wake-up cost more than the read. A failure ends the task with it (the daemon says so)."""
    source = d.log
    if source is None:
        return
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()
    disarm: list[Callable[[], None]] = []

    def step(_event: bool = False) -> None:
        disarm.clear()
        if failed.done() or d.stop_event.is_set():
            return
        try:
            d.take_log(source.read())
            if source.backlog:  # more is there now: read on, letting the loop's other work in
                loop.call_soon(step)
            else:
                disarm.append(source.arm(loop, step, 1.0))
        except Exception as exc:  # (the task reports it)
            failed.set_exception(exc)

    step()
    stop: asyncio.Future[Any] = asyncio.ensure_future(d.stop_event.wait())
    try:
        await asyncio.wait((stop, failed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        for off in disarm:
            off()
    if failed.done():
        failed.result()
