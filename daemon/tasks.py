"""The daemon's periodic tasks besides the log: GPU polls, the tick, /proc I/O.

Each runs on the daemon's loop until its stop event is set, feeds its readings to the state
through `the daemon's `apply`` and sleeps with `its `sleep`` (injectable, as the clock is).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from loadwatch.daemon.publish import Host, status_line
from loadwatch.daemon.sources.inputs import IoSample, Tick

TICK_S = 1.0  # while a load is in flight: stall checks, STATUS=, publishing
IDLE_TICK_S = 5.0  # tick and GPU poll with nothing loading (no session, ready, failed, stopped)
IO_SAMPLE_S = 1.0


async def poll_gpus(d: Host) -> None:
    interval = d.cfg.gpu.poll_interval_s
    last_error: str | None = None
    last_health: tuple[bool, str | None] | None = None
    tally = d.tally
    while not d.stop_event.is_set():
        reading = await d.gpu.poll_async()
        tally.last_reading = reading
        for x in reading.xids:
            uuid = next((s.uuid for s in reading.samples if s.index == x.gpu_index), x.uuid)
            tally.xids[(x.gpu_index, uuid, x.xid)] += 1
            d.feed.line("gpu.xid", gpu=x.gpu_index, uuid=uuid, xid=x.xid)
        for s in reading.samples:
            if s.compute_capability is not None:
                tally.gpu_ccs[s.index] = s.compute_capability
        if reading.error != last_error and reading.error:
            d.feed.problem(f"GPU source: {reading.error}")
        last_error = reading.error
        d.apply(reading)
        health = (reading.source_up, reading.error)
        if health != last_health:  # a change of health goes out with the state it fed
            last_health = health
            d.publisher.now()
        elif d.busy:  # while loading, memory and its projection are news
            d.publisher.soon()
        # While nothing loads, a poll every IDLE_TICK_S; a load that starts meanwhile is seen
        # within one interval.
        waited = 0.0
        while not d.stop_event.is_set():
            await d.sleep(interval)
            waited += interval
            if d.busy or waited >= IDLE_TICK_S:
                break


async def tick(d: Host) -> None:
    last_status = ""
    while not d.stop_event.is_set():
        d.feed.check()
        d.apply(Tick())
        d.publisher.now()
        line = status_line(d.snapshot())
        if line != last_status:
            last_status = line
            d.notifier.status(line)
        s = d.state.session
        if d.supervisor is not None and s is not None and s.stall is not None:
            # while the load is stalled, tell the supervisor how long for (its policy decides)
            d.supervisor.note_stall(d.clock() - s.stall.since)
        await d.sleep(TICK_S if d.busy else IDLE_TICK_S)


async def sample_io(d: Host, pids_of: Callable[[], Sequence[int]]) -> None:
    """Bytes read by the vLLM processes: the supervised one's tree, or in watch mode the trees
    of the pids the log's prefixes name (those that run on this host)."""
    from loadwatch.daemon.sources.proc.io_counters import ProcIoReader

    reader = d.io_reader or ProcIoReader(clock=d.clock)
    while not d.stop_event.is_set():
        pids = pids_of()
        phase = d.state.session.phase if d.state.session is not None else None
        if pids and phase in ("starting", "loading_weights", "stalled"):
            sample: IoSample = reader.read_many(pids)
            if sample.read_bytes is not None:
                d.apply(sample)
        await d.sleep(IO_SAMPLE_S)


async def follow_log(d: Host) -> None:
    """Read the log source, apply what it hands over, wait for more."""
    source = d.log
    if source is None:
        return
    while not d.stop_event.is_set():
        items = source.read()
        d.take_log(items)
        if items:
            d.publisher.soon()
        if source.backlog:
            await asyncio.sleep(0)
            continue
        stop = asyncio.ensure_future(d.stop_event.wait())
        wait = asyncio.ensure_future(source.wait(1.0))
        try:
            await asyncio.wait({stop, wait}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (stop, wait):
                if not fut.done():
                    fut.cancel()
