"""What the daemon hands the HTTP threads: an immutable `Published` bundle after each change.

`Publisher` builds the bundle from the state (which keeps every count) and the sources' health,
and runs the hooks that render ahead (/metrics, /status).

When. Each bundle is rendered and sent to the HTTP process, which costs more than reading a
second of a busy serving log, so a change is published by what it is: a transition, a failure,
a stall or a change of readiness (`urgent`) at once; counters that only move on (lines read, GPU
readings, probe times) at most every `[http] publish_interval_s`, so a scrape never sees them
older than that. With nothing changed nothing is rendered: `alive` tells the HTTP process the
loop still runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from loadwatch.daemon.config import Config
from loadwatch.daemon.sdnotify import SdNotifier
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource, NullGpuSource
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import LogHealth, Published, SupervisorStats, Totals
from loadwatch.daemon.state.snapshot import Snapshot

VERSION = "0.1.0"


class Host(Protocol):
    """What publishing and the periodic tasks (tasks.py) use of the daemon (loop.py)."""

    cfg: Config
    gpu: GuardedGpuSource | NullGpuSource
    state: LoadState
    feed: Any  # eventfeed.EventFeed
    publisher: Publisher
    notifier: SdNotifier
    supervisor: Any
    log: Any  # sources.log.source.LogSource | None
    stop_event: asyncio.Event
    pace: Any  # tasks.Pace
    io_reader: Any  # sources.inputs.IoReader | None
    started_at: float

    @property
    def busy(self) -> bool: ...

    def clock(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    def apply(self, item: Any) -> None: ...

    def take_log(self, items: Any) -> None: ...

    def snapshot(self) -> Snapshot: ...


class Publisher:
    def __init__(
        self,
        daemon: Host,
        interval_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._d = daemon
        self.interval_s = interval_s
        self._mono = monotonic
        self.published: Published | None = None
        self.hooks: list[Callable[[Published], None]] = []  # e.g. render /metrics ahead
        self.heartbeats: list[Callable[[], None]] = []  # "the loop runs", with nothing new
        self._hook_error: str | None = None  # the last failure of a hook, said once
        self._urgent = False  # since the last bundle: a change that goes out at once
        self._dirty = False  # since the last bundle: a change that may wait
        self._timer: asyncio.TimerHandle | None = None
        self._last = float("-inf")  # monotonic time of the last bundle (or heartbeat)
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def urgent(self) -> None:
        """What changed is a transition, a failure, a stall or readiness: `changed` publishes
        it at once."""
        self._urgent = True

    def changed(self) -> None:
        """Something changed: published at once when urgent, else by `soon`."""
        if self._urgent:
            self.now()
        else:
            self.soon()

    def soon(self) -> None:
        """Publish once `interval_s` has passed since the last bundle: now, when it has or
        nearly has (a fifth of it, at most 0.2 s, early: a change that comes with a read of a
        busy log goes out with that wake-up instead of waking the loop again)."""
        self._dirty = True
        wait = self.interval_s - (self._mono() - self._last)
        if wait <= min(0.2 * self.interval_s, 0.2):
            self.now()
        elif self._timer is None and self._loop is not None:
            self._timer = self._loop.call_later(wait, self._deferred)

    def _deferred(self) -> None:
        self._timer = None
        if self._dirty:
            self.now()

    def alive(self, every_s: float) -> None:
        """Nothing published for `every_s`: tell the hooks' readers the loop runs (a pending
        change goes out as a bundle instead)."""
        if self._dirty or self._urgent:
            self.now()
            return
        if self._mono() - self._last < every_s:
            return
        self._last = self._mono()
        for beat in self.heartbeats:
            try:
                beat()
            except Exception:  # (a hook's failure is said when it next publishes)
                pass

    def now(self) -> None:
        d = self._d
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._urgent = self._dirty = False
        self._last = self._mono()
        now = d.clock()
        snap = d.state.snapshot(now)
        self.published = Published(
            state=d.state,
            at=now,
            started_at=d.started_at,
            version=VERSION,
            totals=Totals.of(d.state, snap),
            log=self._log_health(),
            gpu=d.gpu.health() if isinstance(d.gpu, GuardedGpuSource) else None,
            supervisor=self._supervisor_stats(),
            load_budget_s=d.cfg.forecast.load_budget_s,
            _cache=[snap, now],
        )
        failed: str | None = None
        for hook in self.hooks:
            try:
                hook(self.published)
            except Exception as exc:  # a hook's bug must not stop the loop: said once
                failed = f"after publishing: {type(exc).__name__}: {exc}"
        if failed is not None and failed != self._hook_error:
            d.feed.problem(failed)
        self._hook_error = failed

    def _log_health(self) -> LogHealth | None:
        source = self._d.log
        if source is None:
            return None
        h = source.follower.health()
        return LogHealth(
            up=h.file_exists and h.last_error is None,
            file_exists=h.file_exists,
            lines_total=h.records_total,
            bytes_total=h.bytes_total,
            # (and records joined from a container runtime's pieces past the cap)
            cuts_total=h.cuts_total + (source.decoder.cuts if source.decoder else 0),
            rotations_total=h.rotations_total,
            truncations_total=h.truncations_total,
            errors_total=h.errors_total,
            last_error=h.last_error,
            last_success_ts=h.last_check_ts,
            mode=h.mode,
            state_error=h.error_in_state,
        )

    def _supervisor_stats(self) -> SupervisorStats | None:
        d = self._d
        sup = d.supervisor
        if sup is None:
            return None
        exits = d.state.vllm_exits
        last_ok = d.state.vllm_started_at  # (the last run's start: it worked until its exit)
        if sup.pid is not None:
            last_ok = d.clock()
        return SupervisorStats(
            state=str(sup.state),
            starts_total=sum(exits.values()) + (1 if sup.pid is not None else 0),
            exits=exits,
            errors_total=exits.get("failed", 0) + exits.get("signal", 0),
            last_success_ts=last_ok,
            orphans=d.state.orphans,
        )


def status_line(snap: Snapshot) -> str:
    """One line for systemd's STATUS= and the console: "loading 18/119 shards, ETA 15m"."""
    s = snap.session
    if s is None:
        return "waiting for vLLM"
    p = s.progress
    if s.phase in ("loading_weights", "stalled", "starting") and p.shards_total:
        eta = f", ETA {_human(p.eta.remaining_s)}" if p.eta is not None else ""
        stalled = " (stalled)" if s.phase == "stalled" else ""
        return f"loading {p.shards_done or 0}/{p.shards_total} shards{eta}{stalled}"
    if s.phase == "failed":
        return f"failed: {s.failure_kind or 'unknown'}"
    if s.phase == "ready" and s.time_to_ready_s is not None:
        return f"ready (in {_human(s.time_to_ready_s)})"
    return s.phase.replace("_", " ")


def _human(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
