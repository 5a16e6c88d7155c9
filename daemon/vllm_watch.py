"""Is vLLM still serving? The daemon's `/health` prober, servable check and process watch.

A task on the daemon's loop. Once the log says the API server started, it probes `/health`
every `[vllm] health_interval_s` for as long as the session lives, so a server that stops
answering turns `/readyz` to 503 within two intervals (the state's `health_failures_not_ready`
failures in a row). The URL: `[vllm] health_url` when configured, else the supervised argv's
`--host`/`--port`, else the one the log printed (`Starting vLLM API server 0 on
http://0.0.0.0:8000`, a wildcard host meaning loopback here).

With `[vllm] servable = true`, the first `/health` 200 of a session is followed by one tiny
completion (sources/health.py `probe_completion`): `/readyz` says 200 only once it succeeded.

In watch mode the process the log names (the API server's pid) is looked for in /proc: when it
runs here as vLLM's user and is vLLM (sources/proc/logged_process.py says how it is judged),
its argv is the launch's (the KV-cache dtype), and when it is gone the session is stopped,
whatever the log says (a SIGKILL or the OOM killer leave no line). A pid that runs here and fails
the check (a forged prefix: the log holds text vLLM's clients chose) is said once in the event
log and changes nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loadwatch.daemon.config import VllmConfig
from loadwatch.daemon.sources.health import (
    HealthProber,
    health_url,
    health_url_from_argv,
    probe_completion,
)
from loadwatch.daemon.sources.inputs import CompletionProbe, HealthProbe, LoggedProcessSeen
from loadwatch.daemon.sources.proc.logged_process import (
    ExpectedUser,
    LoggedProcess,
    expected_user,
)
from loadwatch.daemon.state.session import TERMINAL, Session

PROBE_TIMEOUT_S = 2.0


class VllmWatch:
    def __init__(self, daemon: Any, proc_root: str = "/proc") -> None:
        """`daemon`: the loop's `Daemon` (its state, apply, publish, event log)."""
        self.daemon = daemon
        self.cfg: VllmConfig | None = daemon.cfg.vllm
        self.interval_s = self.cfg.health_interval_s if self.cfg is not None else 5.0
        self._probers: dict[str, HealthProber] = {}
        self._process = LoggedProcess(proc_root, user=self._expected_user, on_refused=self._refused)
        self._completion_for: int | None = None  # the session the servable check ran for

    def url(self, s: Session) -> str | None:
        cfg = self.cfg
        if cfg is not None and cfg.health_url:
            return cfg.health_url
        if cfg is not None and cfg.argv:
            return health_url_from_argv(cfg.argv)
        logged = s.milestones.get("api_server_start")
        return health_url(logged.value) if logged is not None and logged.value else None

    async def run(self) -> None:
        d = self.daemon
        while not d.stop_event.is_set():
            s = d.state.session
            if s is not None and s.phase not in TERMINAL:
                if not d.cfg.supervise:
                    self._check_process(s)
                    s = d.state.session
                if s is not None and s.api_server_at is not None and s.phase not in TERMINAL:
                    await self._probe(s)
            await self._sleep(self.interval_s)

    def _check_process(self, s: Session) -> None:
        what, seen = self._process.check(s.server_pid)
        if seen is None:
            return
        d = self.daemon
        if what == "new":
            d.apply(LoggedProcessSeen(ts=d.clock(), pid=seen.pid, alive=True, argv=seen.argv))
        elif what == "gone":
            d.apply(LoggedProcessSeen(ts=d.clock(), pid=seen.pid, alive=False))
            d.publish()

    def _expected_user(self) -> ExpectedUser:
        return expected_user(self.cfg.user if self.cfg else None, self.daemon.cfg.log.path)

    def _refused(self, pid: int, why: str) -> None:
        self.daemon.feed.problem(f"the log names pid {pid}, not taken for vLLM's: {why}")

    async def _probe(self, s: Session) -> None:
        url = self.url(s)
        if url is None:
            return
        d = self.daemon
        prober = self._probers.setdefault(url, HealthProber(url, PROBE_TIMEOUT_S))
        result = await prober.probe()
        if not result.ok or d.tally.health_up is not True:  # readiness may change: at once
            d.publisher.urgent()
        d.tally.health_up = result.ok
        d.apply(
            HealthProbe(
                ok=result.ok, ts=result.checked_at, status=result.status, error=result.error
            )
        )
        d.publisher.changed()
        now = d.state.session
        if (
            result.ok
            and self.cfg is not None
            and self.cfg.servable
            and now is not None
            and now.phase not in TERMINAL
            and self._completion_for != now.id
        ):
            self._completion_for = now.id
            await self._servable(url)

    async def _servable(self, url: str) -> None:
        cfg = self.cfg
        assert cfg is not None
        d = self.daemon
        r = await asyncio.to_thread(
            probe_completion, url, cfg.servable_prompt, cfg.servable_timeout_s, d.clock
        )
        d.feed.line(
            "vllm.servable",
            ok=r.ok,
            model=r.model,
            latency_s=round(r.latency_s, 6) if r.latency_s is not None else None,
            status=r.status,
            error=r.error,
        )
        d.apply(
            CompletionProbe(
                ok=r.ok, ts=r.checked_at, latency_s=r.latency_s, model=r.model, error=r.error
            )
        )
        d.publish()

    async def _sleep(self, seconds: float) -> None:
        await self.daemon.sleep(seconds)


__all__ = ["VllmWatch"]
