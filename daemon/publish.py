"""What the daemon hands the HTTP threads: an immutable `Published` bundle after each change.

`bundle` builds it from the state (which keeps every count) and the sources' health;
`Publisher` says when, and runs the hooks that render it ahead (/metrics, /status).

When. Building and rendering a bundle costs more than reading a second of a busy serving log,
and a serving daemon lives for days between scrapes, so a change is published by what it is: a
transition, a failure, a stall, a change of readiness or the end of a backlog (`urgent`) at
once, so that /readyz and /healthz (which read the last board, never ask for a new one) answer it
at once and a restart's catch-up shows as soon as it is read. While a backlog is still being read
(a restart's catch-up, a burst) an urgent change waits up to `BACKLOG_PUBLISH_S`: the board is
behind the log until its end is read anyway, and a catch-up of a load's log otherwise built and
rendered a board for nearly every read, its hundreds of starts' transitions; a change of
counters only (lines read, GPU readings, probe times) marks what was published behind (the
`stale` hooks hear it once) and goes out when a reader asks for it (`want`): the HTTP process
asks when a scrape finds its board behind and older than `[http] publish_interval_s`. So
counters cost nothing while nobody reads them, and a scrape never sees them older than the
interval. With nothing to publish, `alive` tells the HTTP process the loop still runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loadwatch.daemon.sources.gpu.guard import GpuSourceHealth
from loadwatch.daemon.sources.log.source import LogSource
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import LogHealth, Published, SupervisorStats, Totals
from loadwatch.daemon.state.snapshot import Snapshot

VERSION = "0.1.0"
BACKLOG_PUBLISH_S = 0.25  # the most an urgent change waits while a backlog is read


class Publisher:
    """When a bundle goes out (`make` builds it), and the hooks that render it ahead; a hook
    that fails is said through `problem`, once while it repeats."""

    def __init__(
        self,
        make: Callable[[], Published],
        problem: Callable[[str], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._problem = problem
        self._mono = monotonic
        self.published: Published | None = None
        self.hooks: list[Callable[[Published], None]] = []  # e.g. render /metrics ahead
        self.stale_hooks: list[Callable[[], None]] = []  # "what was published is behind"
        self.heartbeats: list[Callable[[], None]] = []  # "the loop runs", with nothing new
        self._hook_error: str | None = None  # the last failure of a hook, said once
        self._urgent = False  # since the last bundle: a change that goes out at once
        self._behind = False  # since the last bundle: a change that waits to be asked for
        self._last = float("-inf")  # monotonic time of the last bundle (or heartbeat)

    @property
    def behind(self) -> bool:
        """Something changed since the last bundle (`published` is not the state now)."""
        return self._behind or self._urgent or self.published is None

    def urgent(self) -> None:
        """What changed is a transition, a failure, a stall or readiness: `changed` publishes
        it at once."""
        self._urgent = True

    def changed(self, *, backlog: bool = False) -> None:
        """Something changed: published at once when urgent (within `BACKLOG_PUBLISH_S` of the
        last bundle while a `backlog` is still being read), else when a reader wants it."""
        if self._urgent and (not backlog or self._mono() - self._last >= BACKLOG_PUBLISH_S):
            self.now()
        elif not self._behind:
            self._behind = True
            self._call(self.stale_hooks)

    def want(self) -> None:
        """A reader asks for the state now: a bundle when something changed, else a heartbeat
        (which tells the reader there is nothing newer)."""
        if self.behind:
            self.now()
        else:
            self._beat()

    def alive(self, every_s: float) -> None:
        """Nothing published for `every_s`: tell the hooks' readers the loop runs (an urgent
        change goes out as a bundle instead)."""
        if self._urgent:
            self.now()
        elif self._mono() - self._last >= every_s:
            self._beat()

    def now(self) -> None:
        self._urgent = self._behind = False
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

    def _beat(self) -> None:
        self._last = self._mono()
        self._call(self.heartbeats)

    @staticmethod
    def _call(hooks: list[Callable[[], None]]) -> None:
        for hook in hooks:
            try:
                hook()
            except Exception:  # (a hook's failure is said when it next publishes)
                pass


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
    h = source.input.health()
    return LogHealth(
        up=h.file_exists and h.last_error is None,
        file_exists=h.file_exists,
        lines_total=h.records_total,
        bytes_total=h.bytes_total,
        cuts_total=h.cuts_total,
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
