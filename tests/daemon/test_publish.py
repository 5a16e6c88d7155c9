"""Publishing by what changed: urgent changes at once, counters when a reader asks for them (the
HTTP process is told once that its board is behind), nothing rendered when nothing changed (a
heartbeat instead). Time is the publisher's injected clock."""

from __future__ import annotations

import asyncio
import io
import socket
from pathlib import Path

from loadwatch.daemon.config import Config, LogConfig
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.publish import BACKLOG_PUBLISH_S, Publisher, status_line
from loadwatch.daemon.sdnotify import SdNotifier
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.sources.inputs import Tick
from loadwatch.daemon.sources.log.inputs import FileInput
from loadwatch.daemon.state.published import Published
from loadwatch.daemon.state.snapshot import Snapshot
from loadwatch.daemon.tasks import Pace, tick
from loadwatch.exporters.eventlog import EventLog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _publisher(tmp_path: Path) -> tuple[Publisher, Clock, list[Published], list[str]]:
    cfg = Config(log=LogConfig(path=None), state_dir=tmp_path / "state")
    daemon = Daemon(cfg, eventlog=EventLog(io.StringIO(), None, console=False), gpu=NullGpuSource())
    clock = Clock()
    pub = Publisher(daemon.bundle, daemon.feed.problem, monotonic=clock)
    boards: list[Published] = []
    beats: list[str] = []
    pub.hooks.append(boards.append)
    pub.heartbeats.append(lambda: beats.append("beat"))
    pub.stale_hooks.append(lambda: beats.append("stale"))
    return pub, clock, boards, beats


def test_counters_go_out_when_asked_for_and_urgent_changes_at_once(tmp_path: Path) -> None:
    pub, clock, boards, said = _publisher(tmp_path)
    pub.want()  # the first ask: nothing was published yet
    assert len(boards) == 1 and not pub.behind
    for _ in range(50):  # a busy log: a change every 10 ms, nobody reading
        clock.t += 0.01
        pub.changed()
    assert len(boards) == 1  # nothing rendered for them
    assert said == ["stale"] and pub.behind  # the reader was told once that it is behind
    pub.want()  # a scrape asks: what changed goes out
    assert len(boards) == 2 and not pub.behind
    assert boards[-1] is pub.published
    pub.want()  # nothing changed since: a heartbeat says so, nothing is rendered
    assert len(boards) == 2 and said == ["stale", "beat"]
    clock.t += 0.1
    pub.urgent()  # a transition: at once, nobody asking
    pub.changed()
    assert len(boards) == 3 and said == ["stale", "beat"]


def test_urgent_changes_wait_a_quarter_second_while_a_backlog_is_read(tmp_path: Path) -> None:
    """A catch-up's reads each hold a start's transitions: a board every `BACKLOG_PUBLISH_S`,
    not one per read; a reader asking gets one at once; the read that ends the backlog at once."""
    pub, clock, boards, said = _publisher(tmp_path)
    pub.now()
    step = 1 / 64  # (exact in binary: a read every 15.6 ms, 16 to a quarter second)
    for _ in range(64):
        clock.t += step
        pub.urgent()
        pub.changed(backlog=True)
    assert len(boards) == 1 + 4 and 16 * step == BACKLOG_PUBLISH_S
    assert said == ["stale"] * 4  # the reader told each time a board fell behind
    clock.t += step
    pub.urgent()
    pub.changed(backlog=True)
    assert len(boards) == 5 and pub.behind
    pub.want()  # a scrape in between: at once
    assert len(boards) == 6 and not pub.behind
    clock.t += step
    pub.urgent()
    pub.changed(backlog=False)  # the last read: at once
    assert len(boards) == 7 and not pub.behind


def test_nothing_changed_is_a_heartbeat_not_a_board(tmp_path: Path) -> None:
    pub, clock, boards, beats = _publisher(tmp_path)
    pub.now()
    clock.t += 2.0
    pub.alive(5.0)  # too soon for a heartbeat
    clock.t += 4.0
    pub.alive(5.0)
    assert (len(boards), beats) == (1, ["beat"])
    clock.t += 0.1
    pub.changed()  # a counter: waits to be asked for, whatever the heartbeats
    clock.t += 5.0
    pub.alive(5.0)
    assert (len(boards), beats) == (1, ["beat", "stale", "beat"])
    pub.urgent()  # an urgent change pending when the tick comes goes out as a board
    pub.alive(5.0)
    assert (len(boards), beats) == (2, ["beat", "stale", "beat"])


def test_a_nap_ends_when_a_load_starts() -> None:
    busy = [False]

    async def main() -> float:
        pace = Pace(lambda: busy[0], None, lambda: False)
        loop = asyncio.get_running_loop()

        def start() -> None:
            busy[0] = True
            pace.check()

        loop.call_later(0.05, start)
        began = loop.time()
        await pace.nap(30.0, 1.0)
        return loop.time() - began

    assert asyncio.run(main()) < 5.0


class TimerCountingLoop(asyncio.SelectorEventLoop):
    """An event loop that notes every timer asked of it (each is a wake-up to come)."""

    def __init__(self) -> None:
        super().__init__()
        self.timers: list[object] = []

    def call_at(self, when, callback, *args, context=None):
        self.timers.append(callback)
        return super().call_at(when, callback, *args, context=context)


def test_a_nap_until_a_load_starts_asks_for_no_timer() -> None:
    """The io sampler beside a serving vLLM, for days: nothing to read until a load starts, and
    no wake-up to find that out (the load's start ends the nap)."""
    busy = [False]
    loop = TimerCountingLoop()

    async def main() -> list[object]:
        pace = Pace(lambda: busy[0], None, lambda: False)
        nap = asyncio.ensure_future(pace.nap(None, 1.0))
        await asyncio.sleep(0)  # the nap began
        asked = list(loop.timers)
        assert not nap.done()
        busy[0] = True
        pace.check()
        await asyncio.wait_for(nap, 5.0)
        return asked

    try:
        assert loop.run_until_complete(main()) == []
    finally:
        loop.close()


def test_the_last_read_of_a_backlog_publishes_at_once(tmp_path: Path) -> None:
    """A restart catching up on a log (a backlog read a capped read at a time): the reads in
    between wait to be asked for, the read that reaches the log's end publishes at once, so
    the board is the log's state as soon as it is read, not up to `publish_interval_s` later."""
    log = tmp_path / "vllm.log"
    # A real vLLM 0.32 start ending in its shutdown's lines: no transition at the log's end.
    log.write_bytes((FIXTURES / "real-v0.32-llama.log").read_bytes())
    cfg = Config(log=LogConfig(path=log), state_dir=tmp_path / "state")
    reads = FileInput(log, state_dir=tmp_path / "state" / "ck", cap_bytes=1024, max_read_bytes=2048)
    eventlog = EventLog(io.StringIO(), None, console=False)
    daemon = Daemon(cfg, eventlog=eventlog, gpu=NullGpuSource(), log_input=reads)
    source = daemon.open_log()
    assert source is not None
    boards: list[Published] = []
    daemon.publisher.hooks.append(boards.append)
    read_at_board: list[int] = []  # bytes read when each board went out
    backlog, reads_made = True, 0
    while backlog:
        items = source.read()
        reads_made += 1
        backlog = source.backlog
        before = len(boards)
        daemon.take_log(items)
        read_at_board += [reads.health().bytes_total] * (len(boards) - before)
    size = log.stat().st_size
    assert read_at_board and read_at_board[-1] == size  # the caught-up board, nobody asking
    assert boards[-1].log is not None and boards[-1].log.bytes_total == size
    assert len(boards) < reads_made  # the reads in between did not each publish
    source.close()


def test_the_tick_makes_a_status_line_only_for_a_service_manager(tmp_path: Path) -> None:
    """STATUS= costs a snapshot of the state: the tick makes one only when systemd listens
    (NOTIFY_SOCKET); without it, ticks beside a serving vLLM build nothing for nobody."""
    sock_path = tmp_path / "notify.sock"
    got = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    got.bind(str(sock_path))
    got.settimeout(5)
    log = tmp_path / "vllm.log"
    log.write_bytes((FIXTURES / "real-v0.32-llama.log").read_bytes())  # read to its end: ready
    cfg = Config(log=LogConfig(path=log), state_dir=tmp_path / "state")
    eventlog = EventLog(io.StringIO(), None, console=False)
    daemon = Daemon(cfg, eventlog=eventlog, gpu=NullGpuSource())
    source = daemon.open_log()
    assert source is not None
    while True:
        daemon.take_log(source.read())
        if not source.backlog:
            break
    made: list[str] = []

    def snapshot() -> Snapshot:
        made.append("snapshot")
        return daemon.snapshot()

    def ticks(notifier: SdNotifier, n: int) -> None:
        applied: list[object] = []

        def apply(item: Tick) -> None:
            applied.append(item)
            daemon.apply(item)

        async def nap(_s: float) -> None:
            return None

        pace = Pace(lambda: False, nap, lambda: len(applied) >= n)
        asyncio.run(
            tick(
                apply=apply,
                state=lambda: daemon.state,
                snapshot=snapshot,
                feed=daemon.feed,
                publisher=daemon.publisher,
                notifier=notifier,
                on_stall=lambda _s: None,
                clock=daemon.clock,
                pace=pace,
            )
        )

    ticks(SdNotifier({}), 3)  # no service manager
    assert made == []
    listening = SdNotifier({"NOTIFY_SOCKET": str(sock_path)})
    ticks(listening, 3)
    assert made == ["snapshot"] * 3
    status = got.recv(4096).decode()
    assert status == "STATUS=" + status_line(daemon.snapshot()) != "STATUS=waiting for vLLM"
    assert listening.sent_total == 1
    listening.close()
    got.close()
    source.close()
