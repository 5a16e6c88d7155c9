"""What the daemon hands the HTTP threads: an immutable `Published` bundle after each change.

`bundle` builds it from the state (which keeps every count) and the sources' health;
`Publisher` says when, and runs the hooks that render it ahead (/metrics, /status).

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

from loadwatch.daemon.sources.gpu.guard import GpuSourceHealth
from loadwatch.daemon.sources.log.source import LogSource
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import LogHealth, Published, SupervisorStats, Totals
from loadwatch.daemon.state.snapshot import Snapshot

VERSION = "0.1.0"


class Publisher:
    """When a bundle goes out (`make` builds it), and the hooks that render it ahead; a hook
    that fails is said through `problem`, once while it repeats."""

    def __init__(
        self,
        make: Callable[[], Published],
        problem: Callable[[str], None],
        interval_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._problem = problem
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
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._urgent = self._dirty = False
        self._last = self._mono()
        self.published = self._make()
        failed: str | None = None
        for hook in self.hooks:
            try:
                hook(self.published)
            except Exception as exc:  # a hook's bug must not stop the loop: said once
                failed = f"after publishing: {type(exc).__name__}: {exc}"
        if failed is not None and failed != self._hook_error:
            self._problem(failed)
        self._hook_error = failed


def bundle(
    state: LoadState,
    now: float,
    *,
    started_at: float,
    log: LogSource | None,
    gpu: GpuSourceHealth | None,
    supervisor: SupervisorStats | None,
    load_budget_s: float | None,
) -> Published:
    """The bundle of `state` at `now`, with the sources' health."""
    snap = state.snapshot(now)
    return Published(
        state=state,
        at=now,
        started_at=started_at,
        version=VERSION,
        totals=Totals.of(state, snap),
        log=log_health(log) if log is not None else None,
        gpu=gpu,
        supervisor=supervisor,
        load_budget_s=load_budget_s,
        _cache=[snap, now],
    )


def log_health(source: LogSource) -> LogHealth:
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


def supervisor_stats(
    sup_state: str, pid: int | None, state: LoadState, now: float
) -> SupervisorStats:
    """The supervisor's stats: its state and the vLLM process it runs (`pid`, None between
    runs), and the counts of the runs before, as `state` keeps them."""
    exits = state.vllm_exits
    # the last run's start (it worked until it exited); now, while one runs
    last_ok = now if pid is not None else state.vllm_started_at
    return SupervisorStats(
        state=sup_state,
        starts_total=sum(exits.values()) + (1 if pid is not None else 0),
        exits=exits,
        errors_total=exits.get("failed", 0) + exits.get("signal", 0),
        last_success_ts=last_ok,
        orphans=state.orphans,
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
