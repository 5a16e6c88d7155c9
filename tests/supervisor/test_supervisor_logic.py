"""State-machine timing on a virtual clock: a hand-written ProcessOps whose children exit with
scripted codes. The real-process tests cover the OS side; these cover long backoffs and windows
that would take minutes of real time."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from loadwatch.daemon.config import VllmConfig
from loadwatch.daemon.sources.inputs import ProcessEvent
from loadwatch.daemon.sources.proc.tree import ProcInfo
from loadwatch.daemon.supervise.supervisor import (
    Supervisor,
    SupervisorConfig,
    SupervisorConfigError,
    supervisor_config,
)
from tests.supervisor.harness import Recorder, wait_until


class _Child:
    def __init__(self, pid: int, code: int) -> None:
        self.pid = pid
        self._code = code

    def wait(self) -> int:
        return self._code


class VirtualOps:
    """Children exit at once with the next scripted code; time moves only when slept. A sleep
    of `endless_from_s` or more never ends by itself (only a stop can end it)."""

    def __init__(self, codes: list[int], endless_from_s: float = float("inf")) -> None:
        self.codes = list(codes)
        self.endless_from_s = endless_from_s
        self.now = 1000.0
        self.spawned: list[tuple[Sequence[str], dict[str, str], str | None]] = []
        self.signals: list[tuple[int, int]] = []

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, output_fd: int
    ) -> _Child:
        os.write(output_fd, b"hello\n")
        self.spawned.append((argv, dict(env), cwd))
        return _Child(5000 + len(self.spawned), self.codes.pop(0) if self.codes else 0)

    def signal(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))

    def signal_group(self, pgid: int, sig: int) -> None:
        self.signals.append((-pgid, sig))

    def process_table(self) -> dict[int, ProcInfo]:
        return {}

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds >= self.endless_from_s:
            await asyncio.Event().wait()
        self.now += seconds
        # (a real millisecond: the thread that waits for a child reports its exit meanwhile,
        # rather than virtual time racing ahead while the loop spins)
        await asyncio.sleep(0.001)

    def become_subreaper(self) -> bool:
        return False

    def carries(self, pid: int, marker: str) -> bool:
        return False

    def reap(self, pid: int) -> None:
        pass


def _cfg(tmp_path: Path, **kw: object) -> SupervisorConfig:
    base: dict[str, object] = dict(
        argv=("vllm", "serve", "m"),
        log_path=str(tmp_path / "v.log"),
        backoff_initial_s=1.0,
        backoff_factor=2.0,
        backoff_max_s=30.0,
        crash_loop_starts=100,
        crash_loop_window_s=600.0,
        tree_scan_interval_s=0.0001,
        exit_verdict_wait_s=0.0,
    )
    base.update(kw)
    return SupervisorConfig(**base)  # type: ignore[arg-type]


def test_backoff_doubles_to_the_cap(tmp_path: Path) -> None:
    ops = VirtualOps([1] * 8 + [0])
    rec = Recorder()
    sup = Supervisor(_cfg(tmp_path), on_event=rec, ops=ops)
    assert asyncio.run(sup.run()) == "exited"  # the clean exit ends it under on-failure
    assert [e.backoff_s for e in rec.of("backoff")] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert len(rec.of("started")) == 9
    assert (tmp_path / "v.log").read_bytes() == b"hello\n" * 9
    assert [r.failed for r in sup.runs] == [True] * 8 + [False]


def test_crash_loop_window_slides(tmp_path: Path) -> None:
    # Starts at t=0, 10, 30, 70, ... (backoff 10, 20, 40 capped): 3 starts never fit in 25 s.
    ops = VirtualOps([1] * 6 + [0])
    cfg = _cfg(
        tmp_path,
        backoff_initial_s=10.0,
        backoff_max_s=40.0,
        crash_loop_starts=3,
        crash_loop_window_s=25.0,
    )
    rec = Recorder()
    assert asyncio.run(Supervisor(cfg, on_event=rec, ops=ops).run()) == "exited"
    assert "fatal" not in rec.kinds
    ops2 = VirtualOps([1] * 6)
    cfg2 = _cfg(
        tmp_path,
        backoff_initial_s=10.0,
        backoff_max_s=40.0,
        crash_loop_starts=3,
        crash_loop_window_s=31.0,
    )
    rec2 = Recorder()
    assert asyncio.run(Supervisor(cfg2, on_event=rec2, ops=ops2).run()) == "fatal"
    assert len(rec2.of("started")) == 3


def test_a_run_that_became_ready_resets_the_backoff(tmp_path: Path) -> None:
    rec = Recorder()
    holder: list[Supervisor] = []

    def on_event(e: ProcessEvent) -> None:
        rec(e)
        if len(rec.of("started")) == 3 and e.kind == "started":
            holder[0].note_ready()  # the third start answered /health

    sup = Supervisor(
        _cfg(tmp_path, crash_loop_starts=4), on_event=on_event, ops=VirtualOps([1] * 4)
    )
    holder.append(sup)
    assert asyncio.run(sup.run()) == "fatal"
    assert [e.backoff_s for e in rec.of("backoff")] == [1, 2, 1]


def test_signal_exit_is_a_failure_and_described(tmp_path: Path) -> None:
    ops = VirtualOps([-signal.SIGSEGV])
    rec = Recorder()
    assert (
        asyncio.run(Supervisor(_cfg(tmp_path, restart="never"), on_event=rec, ops=ops).run())
        == "exited"
    )
    exited = rec.of("exited")[0]
    assert exited.signal == signal.SIGSEGV and exited.exit_code is None
    assert exited.reason == "killed by SIGSEGV"


def test_the_exit_reason_names_the_most_telling_failure_noted(tmp_path: Path) -> None:
    # vLLM logs "EngineCore failed to start." before the traceback that says why.
    rec = Recorder()
    holder: list[Supervisor] = []

    def on_event(e: ProcessEvent) -> None:
        rec(e)
        if e.kind == "started":
            for kind in ("engine_init_failed", "kv_cache_too_small", "worker_died"):
                assert holder[0].note_fatal_failure(kind)

    sup = Supervisor(_cfg(tmp_path, restart="never"), on_event=on_event, ops=VirtualOps([0]))
    holder.append(sup)
    assert asyncio.run(sup.run()) == "exited"
    exited = rec.of("exited")[0]
    assert exited.reason == "exit code 0 after a fatal error in the log (kv_cache_too_small)"
    assert sup.runs[0].failed


def test_environment_and_cwd_reach_the_child_without_notify_vars(tmp_path: Path) -> None:
    ops = VirtualOps([0])
    env = {"PATH": "/bin", "NOTIFY_SOCKET": "/run/n", "WATCHDOG_USEC": "1", "VLLM_X": "1"}
    cfg = _cfg(tmp_path, env=env, cwd=str(tmp_path))
    sup = Supervisor(cfg, ops=ops)
    asyncio.run(sup.run())
    argv, child_env, cwd = ops.spawned[0]
    assert tuple(argv) == ("vllm", "serve", "m")
    # plus the marker by which the orphan check knows a worker that left the tree
    assert child_env == {"PATH": "/bin", "VLLM_X": "1", "LOADWATCH_RUN": sup.run_marker}
    assert len(sup.run_marker) == 16 and sup.run_marker != Supervisor(cfg, ops=ops).run_marker
    assert cwd == str(tmp_path)


def test_stop_before_run_and_during_backoff(tmp_path: Path) -> None:
    sup = Supervisor(_cfg(tmp_path), ops=VirtualOps([]))
    result = asyncio.run(sup.stop())
    assert result.state == "exited" and result.tree_pids == ()

    rec = Recorder()
    cfg = _cfg(tmp_path, backoff_initial_s=10_000.0, backoff_max_s=10_000.0)
    sup2 = Supervisor(cfg, on_event=rec, ops=VirtualOps([1] * 100, endless_from_s=10_000))

    async def scenario() -> str:
        task = asyncio.create_task(sup2.run())
        await wait_until(lambda: "backoff" in rec.kinds, what="the long backoff")
        await sup2.stop()
        return await task

    assert asyncio.run(scenario()) == "exited"
    assert rec.kinds == ["started", "exited", "backoff"]


def test_callback_errors_do_not_break_supervision(tmp_path: Path) -> None:
    def boom(e: object) -> None:
        raise RuntimeError("consumer bug")

    sup = Supervisor(_cfg(tmp_path), on_event=boom, ops=VirtualOps([0]))
    assert asyncio.run(sup.run()) == "exited"
    assert sup.callback_errors_total == 2


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"argv": ()}, "non-empty list"),
        ({"argv": ("vllm", "")}, "non-empty strings"),
        ({"restart": "sometimes"}, "restart must be"),
        ({"stall_policy": "restart", "restart": "never"}, "needs a restart policy"),
        ({"backoff_initial_s": -1}, "backoff_initial_s must be >= 0"),
        ({"tree_scan_interval_s": 0}, "tree_scan_interval_s must be > 0"),
        ({"stop_grace_s": -1}, "stop_grace_s must be >= 0"),
        ({"backoff_factor": 0.5}, "backoff_factor"),
        ({"crash_loop_starts": 0}, "crash_loop_starts"),
        ({"log_keep": 0}, "log_keep"),
    ],
)
def test_config_errors_are_one_line(tmp_path: Path, kw: dict[str, object], message: str) -> None:
    with pytest.raises(SupervisorConfigError, match=message) as info:
        _cfg(tmp_path, **kw)
    assert "\n" not in str(info.value)


def test_settings_from_the_daemon_configuration(tmp_path: Path) -> None:
    vllm = VllmConfig(
        argv=("vllm", "serve", "/m"),
        env={"VLLM_X": "1"},
        inherit_env=False,
        cwd=tmp_path,
        restart="always",
        backoff_initial_s=3.0,
        crash_loop_starts=7,
        crash_loop_window_s=100.0,
        stop_grace_s=12.0,
        stall_policy="restart",
        log_keep=4,
    )
    cfg = supervisor_config(vllm, tmp_path / "v.log", preflight=lambda: None)
    assert cfg.argv == ("vllm", "serve", "/m") and cfg.env == {"VLLM_X": "1"}
    assert cfg.cwd == str(tmp_path) and cfg.log_path == str(tmp_path / "v.log")
    assert (cfg.restart, cfg.backoff_initial_s, cfg.crash_loop_starts) == ("always", 3.0, 7)
    assert (cfg.crash_loop_window_s, cfg.stop_grace_s, cfg.stall_policy) == (100.0, 12.0, "restart")
    assert cfg.log_keep == 4 and cfg.preflight is not None
    inherited = supervisor_config(
        VllmConfig(argv=("v",), env={"A": "2"}), "l", environ={"A": "1", "B": "1"}
    )
    assert inherited.env == {"A": "2", "B": "1"}
