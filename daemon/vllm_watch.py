"""Is vLLM still serving? The daemon's `/health` prober, servable check and process watch.

A task on the daemon's loop. Once the log says the API server started, it probes `/health`
every `[vllm] health_interval_s` for as long as the session lives, so a server that stops
answering turns `/readyz` to 503 within two intervals (the state's `health_failures_not_ready`
failures in a row). Where (sources/health.py `Endpoint`): `[vllm] health_url` when configured,
else the supervised argv's `--host`/`--port`, else the URL the log printed (`Starting vLLM API
server 0 on http://0.0.0.0:8000`, a wildcard host meaning loopback here).

The log is untrusted input, so the URL it printed is bounded by configuration: `http` to a
loopback host or one of `[vllm] allowed_hosts` (sources/health.py `endpoint_from_log`). The
session's first URL is the one (the fold keeps it: vLLM prints it before it serves, so no
client's text comes first), and once accepted it stays the session's. A URL refused is said in
one `daemon.problem` line and not probed. A round that raises is said (once while it repeats)
and the next goes on: nothing a log line holds ends this task.

With `[vllm] servable = true`, the first `/health` 200 of a session is followed by one tiny
completion (sources/health.py `probe_completion`) at the same endpoint, with the API key vLLM
asks for (`[vllm] api_key_file`, else the supervised argv's `--api-key`): `/readyz` says 200
only once it succeeded.

In watch mode the process the log names (the API server's pid) is looked for in /proc: when it
runs here as vLLM's user and is vLLM (sources/proc/logged_process.py says how it is judged),
its argv is the launch's (the KV-cache dtype), and when it is gone the session ends: stopped
after vLLM's shutdown lines or a stop asked for, else failed as `vanished` (a SIGKILL or the OOM
killer leave no line). A pid that runs here and fails the check (a forged prefix: the log holds
text vLLM's clients chose) is said once in the event log and changes nothing.

A session read back ready (a restart, or the log of a vLLM killed before this daemon started)
is not ready until a live answer says so: a /health 200 or its process seen here (the state's
`seen_live`). Such a session is probed within `QUICK_S`, not an interval later; when /health
fails `health_failures_not_ready` times at a loopback URL, the last with no HTTP answer at
all, and no process has the logged pid here, it is gone as well (`vanished`): nothing else
would ever end it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from loadwatch.daemon.config import Config, VllmConfig
from loadwatch.daemon.eventfeed import EventFeed
from loadwatch.daemon.publish import Publisher
from loadwatch.daemon.sources.health import (
    Endpoint,
    HealthProber,
    UrlRefused,
    endpoint_from_argv,
    endpoint_from_config,
    endpoint_from_log,
    is_loopback,
    probe_completion,
)
from loadwatch.daemon.sources.inputs import CompletionProbe, HealthProbe, LoggedProcessSeen
from loadwatch.daemon.sources.proc.logged_process import (
    ExpectedUser,
    LoggedProcess,
    expected_user,
    look,
)
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.session import TERMINAL, Input, Session

PROBE_TIMEOUT_S = 2.0
QUICK_S = 0.5  # a session read back ready is probed this soon after it is read


class VllmWatch:
    def __init__(
        self,
        cfg: Config,
        *,
        state: Callable[[], LoadState],
        apply: Callable[[Input], None],
        feed: EventFeed,
        publisher: Publisher,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        stop_event: asyncio.Event,
        proc_root: str = "/proc",
    ) -> None:
        """`state`: the daemon's state as it is now; `apply` folds what this finds into it."""
        self._state = state
        self._apply = apply
        self._feed = feed
        self._publisher = publisher
        self._clock = clock
        self._sleep = sleep
        self._stop = stop_event
        self._supervise = cfg.supervise
        self._log_path = cfg.log.path
        self.cfg: VllmConfig | None = cfg.vllm
        self.interval_s = self.cfg.health_interval_s if self.cfg is not None else 5.0
        self._prober: HealthProber | None = None
        self._process = LoggedProcess(proc_root, user=self._expected_user, on_refused=self._refused)
        self._completion_for: int | None = None  # the session the servable check ran for
        self._configured: Endpoint | UrlRefused | None = None  # health_url or argv, resolved
        self._logged: tuple[int, str, Endpoint | None] | None = None  # session, its URL, verdict
        self._last_error: str | None = None  # the last round's exception, said once
        self._quick_for: int | None = None  # the session read back ready probed without delay

    def endpoint(self, s: Session) -> Endpoint | None:
        """Where this session's probes go; None while nowhere (or nowhere allowed)."""
        cfg = self.cfg
        if cfg is not None and (cfg.health_url or cfg.argv):
            return self._configured_endpoint(cfg)
        logged = s.milestones.get("api_server_start")
        if logged is None or not logged.value:
            return None
        seen = self._logged
        if (
            seen is not None
            and seen[0] == s.id
            and (seen[2] is not None or seen[1] == logged.value)
        ):
            return seen[2]  # accepted for the session, or this very URL refused already
        try:
            ep: Endpoint | None = endpoint_from_log(
                logged.value, cfg.allowed_hosts if cfg is not None else ()
            )
        except UrlRefused as exc:
            self._feed.problem(f"vLLM's logged API server URL is not probed: {exc}")
            ep = None
        self._logged = (s.id, logged.value, ep)
        return ep

    def _configured_endpoint(self, cfg: VllmConfig) -> Endpoint | None:
        if self._configured is None:
            try:
                self._configured = (
                    endpoint_from_config(cfg.health_url)
                    if cfg.health_url
                    else endpoint_from_argv(cfg.argv)
                )
            except UrlRefused as exc:  # (an argv vLLM itself would refuse: `--port x`)
                self._feed.problem(f"vLLM's /health is not probed: {exc}")
                self._configured = exc
        return self._configured if isinstance(self._configured, Endpoint) else None

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self._round()
                self._last_error = None
            except Exception as exc:  # one bad round must not end the probes for good
                error = f"vLLM health probe round failed: {type(exc).__name__}: {exc}"
                if error != self._last_error:
                    self._feed.problem(error)
                self._last_error = error
            await self._pause()

    async def _pause(self) -> None:
        """The interval, or less once a session read back ready waits for a live answer (once
        per session: then the interval again, whatever the answer). The interval in one sleep
        while the session was seen live: only a session read back can be ready unseen, and a
        wake-up costs more than the check (beside a serving vLLM, for days)."""
        waited = 0.0
        while waited < self.interval_s and not self._stop.is_set():
            s = self._state().session
            left = self.interval_s - waited
            step = left if s is not None and s.seen_live else min(QUICK_S, left)
            await self._sleep(step)
            waited += step
            s = self._state().session
            if s is not None and s.phase == "ready" and not s.seen_live and s.id != self._quick_for:
                self._quick_for = s.id
                return

    async def _round(self) -> None:
        s = self._state().session
        if s is None or s.phase in TERMINAL:
            return
        if not self._supervise:
            self._check_process(s)
            s = self._state().session
        if s is not None and s.api_server_at is not None and s.phase not in TERMINAL:
            await self._probe(s)

    def _check_process(self, s: Session) -> None:
        what, seen = self._process.check(s.server_pid)
        if seen is None:
            return
        if what == "new":
            self._apply(
                LoggedProcessSeen(ts=self._clock(), pid=seen.pid, alive=True, argv=seen.argv)
            )
        elif what == "gone":
            self._apply(LoggedProcessSeen(ts=self._clock(), pid=seen.pid, alive=False))
            self._publisher.now()

    def _gone_unseen(self) -> None:
        """A session read back (never seen live) whose /health fails at loopback: when no
        process has the pid the log names here, vLLM is gone (killed before this daemon began
        to watch). A process with that pid, whoever's, leaves the session as it is."""
        state = self._state()
        s = state.session
        if s is None or s.phase in TERMINAL or s.seen_live or s.server_pid is None:
            return
        if state.health_failures < state.config.health_failures_not_ready:
            return
        if self._process.seen is not None:
            return  # one was seen: its own exit says when it is gone
        if look(s.server_pid, self._process.proc_root) is not None:
            return
        self._apply(
            LoggedProcessSeen(ts=self._clock(), pid=s.server_pid, alive=False, was_seen=False)
        )

    def _expected_user(self) -> ExpectedUser:
        return expected_user(self.cfg.user if self.cfg else None, self._log_path)

    def _refused(self, pid: int, why: str) -> None:
        self._feed.problem(f"the log names pid {pid}, not taken for vLLM's: {why}")

    async def _probe(self, s: Session) -> None:
        ep = self.endpoint(s)
        if ep is None:
            return
        if self._prober is None or self._prober.endpoint != ep:
            self._prober = HealthProber(ep, PROBE_TIMEOUT_S)
        result = await self._prober.probe()
        last = self._state().health
        if not result.ok or last is None or not last.ok:  # readiness may change: at once
            self._publisher.urgent()
        self._apply(
            HealthProbe(
                ok=result.ok, ts=result.checked_at, status=result.status, error=result.error
            )
        )
        if result.status is None and not self._supervise and is_loopback(ep.host):
            self._gone_unseen()  # (nothing answered: an answer, even a 302, is something alive)
        self._publisher.changed()
        now = self._state().session
        if (
            result.ok
            and self.cfg is not None
            and self.cfg.servable
            and now is not None
            and now.phase not in TERMINAL
            and self._completion_for != now.id
        ):
            self._completion_for = now.id
            await self._servable(ep)

    async def _servable(self, ep: Endpoint) -> None:
        cfg = self.cfg
        assert cfg is not None
        r = await asyncio.to_thread(
            probe_completion,
            ep,
            cfg.servable_prompt,
            cfg.servable_timeout_s,
            self._clock,
            cfg.api_key,
        )
        self._feed.line(
            "vllm.servable",
            ok=r.ok,
            model=r.model,
            latency_s=round(r.latency_s, 6) if r.latency_s is not None else None,
            status=r.status,
            error=r.error,
        )
        self._apply(
            CompletionProbe(
                ok=r.ok, ts=r.checked_at, latency_s=r.latency_s, model=r.model, error=r.error
            )
        )
        self._publisher.now()


__all__ = ["VllmWatch"]
