"""The supervisor's settings: validated once, with one-line errors."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from loadwatch.daemon.config import VllmConfig
from loadwatch.daemon.supervise.remedies import EAGER_PHASES

RestartPolicy = Literal["on-failure", "always", "never"]
StallPolicy = Literal["alert", "restart"]


class SupervisorConfigError(ValueError):
    """A supervisor setting that cannot work; the message is one line for the user."""


@dataclass(frozen=True)
class SupervisorConfig:
    argv: tuple[str, ...]
    log_path: str
    env: Mapping[str, str] | None = None  # None: this process's environment
    cwd: str | None = None
    restart: RestartPolicy = "on-failure"
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0
    backoff_factor: float = 2.0
    backoff_reset_after_s: float = 3600.0  # a run this long counts as a success
    crash_loop_starts: int = 5  # after this many starts within the window, give up (fatal)
    crash_loop_window_s: float = 900.0
    stop_grace_s: float = 30.0  # SIGTERM -> SIGKILL
    kill_wait_s: float = 10.0  # after SIGKILL, how long to wait for the tree to vanish
    stall_policy: StallPolicy = "alert"
    stall_restart_after_s: float = 900.0
    # Start-up phases in which a stall ends the start at once, as a failure of kind `stall` the
    # ladder remedies: those of the `enforce_eager` remedy, when `[vllm] remedies` lists it.
    stall_end_phases: frozenset[str] = frozenset()
    exit_verdict_wait_s: float = 2.0  # after exit code 0: time for the log to report a failure
    tree_scan_interval_s: float = 2.0
    log_max_bytes: int = 256 * 2**20
    log_keep: int = 3  # rotated files kept: PATH.1 .. PATH.N
    # The members of the running tree, for a supervisor started after this one was killed.
    pid_file: str | None = None
    # Run in a worker thread before every start; a returned string vetoes the start.
    preflight: Callable[[], str | None] | None = field(default=None, compare=False)
    # `[vllm] output = "file+stdout"`: each whole line of vLLM's output, also (from the pump's
    # thread; the event log's `passthrough`).
    output_copy: Callable[[bytes], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) and a for a in self.argv):
            raise SupervisorConfigError(
                "vLLM command must be a non-empty list of non-empty strings"
            )
        if self.restart not in ("on-failure", "always", "never"):
            raise SupervisorConfigError(
                f"restart must be on-failure, always or never, not {self.restart!r}"
            )
        if self.stall_policy not in ("alert", "restart"):
            raise SupervisorConfigError(
                f"stall policy must be alert or restart, not {self.stall_policy!r}"
            )
        if self.stall_policy == "restart" and self.restart == "never":
            raise SupervisorConfigError(
                "stall policy 'restart' needs a restart policy other than 'never'"
            )
        for name in (
            "crash_loop_window_s",
            "stall_restart_after_s",
            "tree_scan_interval_s",
        ):
            if not getattr(self, name) > 0:
                raise SupervisorConfigError(f"{name} must be > 0")
        for name in (
            "backoff_initial_s",
            "backoff_max_s",
            "stop_grace_s",
            "kill_wait_s",
            "exit_verdict_wait_s",
            "backoff_reset_after_s",
        ):
            if not getattr(self, name) >= 0:
                raise SupervisorConfigError(f"{name} must be >= 0")
        if self.backoff_factor < 1:
            raise SupervisorConfigError("backoff_factor must be >= 1")
        if self.crash_loop_starts < 1:
            raise SupervisorConfigError("crash_loop_starts must be >= 1")
        if self.log_max_bytes < 1 or self.log_keep < 1:
            raise SupervisorConfigError("log_max_bytes and log_keep must be >= 1")


def supervisor_config(
    vllm: VllmConfig,
    log_path: str | os.PathLike[str],
    preflight: Callable[[], str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    pid_file: str | os.PathLike[str] | None = None,
    output_copy: Callable[[bytes], None] | None = None,
) -> SupervisorConfig:
    """The supervisor's settings from the ``[vllm]`` section of the daemon's configuration."""
    env: dict[str, str] = (
        dict(os.environ if environ is None else environ) if vllm.inherit_env else {}
    )
    env.update(vllm.env)
    return SupervisorConfig(
        argv=tuple(vllm.argv),
        log_path=os.fspath(log_path),
        env=env,
        cwd=None if vllm.cwd is None else os.fspath(vllm.cwd),
        restart=vllm.restart,
        backoff_initial_s=vllm.backoff_initial_s,
        backoff_max_s=vllm.backoff_max_s,
        crash_loop_starts=vllm.crash_loop_starts,
        crash_loop_window_s=vllm.crash_loop_window_s,
        stop_grace_s=vllm.stop_grace_s,
        stall_policy=vllm.stall_policy,
        stall_restart_after_s=vllm.stall_restart_after_s,
        stall_end_phases=EAGER_PHASES if "enforce_eager" in vllm.remedies else frozenset(),
        log_max_bytes=vllm.log_max_bytes,
        log_keep=vllm.log_keep,
        preflight=preflight,
        pid_file=None if pid_file is None else os.fspath(pid_file),
        output_copy=output_copy if vllm.output == "file+stdout" else None,
    )
