"""The supervisor against real processes (the fake vLLM), checked through /proc and the log."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import replace
from pathlib import Path

from loadwatch.daemon.supervise.supervisor import Supervisor
from loadwatch.parsers import ChunkScanner, EventStream, Failure
from tests.supervisor.harness import (
    Recorder,
    live_pids,
    log_bytes,
    read_pids,
    run_async,
    start,
    tiny_config,
    wait_until,
)


def test_serve_then_stop_leaves_no_process(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cfg = tiny_config(
        tmp_path, "--workers", "2", "--setsid", "--grandchild", "--pid-dir", str(pid_dir)
    )
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)

    async def scenario() -> None:
        task = await start(sup)
        await wait_until(lambda: b"Application startup complete." in log_bytes(tmp_path))
        assert sup.state == "running"
        pids = read_pids(pid_dir)
        assert set(pids) == {"main", "worker-0", "worker-1", "grandchild-1"}
        assert sup.pid == pids["main"]
        # The setsid worker and its child left our process group but are still known.
        await wait_until(lambda: set(pids.values()) <= set(sup.tree_pids), what="tree scan")
        result = await sup.stop()
        assert await task == "exited"
        assert result.state == "exited"
        assert set(pids.values()) <= set(result.tree_pids)
        assert result.remaining_pids == ()
        assert live_pids(list(pids.values())) == []
        assert result.exit_code == 0  # the fake's SIGTERM handler exits 0

    run_async(scenario)
    assert rec.kinds == ["started", "stopping", "exited"]
    started, stopping, exited = rec.events
    assert started.pid == exited.pid and started.argv == cfg.argv
    assert stopping.reason == "stop requested"
    assert exited.reason == "stopped: stop requested"
    assert exited.tree_pids and started.pid in exited.tree_pids
    log = log_bytes(tmp_path)
    assert b") \rLoading safetensors checkpoint shards: 100% Completed | 4/4" in log
    assert b"INFO:     Shutting down\n" in log
    assert sup.runs[-1].failed is False


def test_stop_kills_processes_that_ignore_sigterm(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cfg = tiny_config(
        tmp_path,
        "--workers",
        "2",
        "--setsid",
        "--grandchild",
        "--ignore-term",
        "--worker-ignore-term",
        "--pid-dir",
        str(pid_dir),
        stop_grace_s=0.4,
    )
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)

    async def scenario() -> float:
        task = await start(sup)
        await wait_until(lambda: b"Application startup complete." in log_bytes(tmp_path))
        pids = list(read_pids(pid_dir).values())
        assert len(pids) == 4
        await wait_until(lambda: set(pids) <= set(sup.tree_pids), what="tree scan")
        t0 = time.monotonic()
        result = await sup.stop("shutdown")
        took = time.monotonic() - t0
        await task
        assert live_pids(pids) == [], "a process of the tree survived the stop"
        assert result.signal == signal.SIGKILL
        return took

    took = run_async(scenario)
    assert took >= 0.4  # waited the grace period before SIGKILL
    assert rec.kinds == ["started", "stopping", "exited"]
    assert rec.events[-1].signal == signal.SIGKILL and rec.events[-1].exit_code is None


def test_crash_restarts_with_backoff_until_crash_loop_is_fatal(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cfg = tiny_config(
        tmp_path,
        "--scenario",
        "crash",
        "--workers",
        "2",
        "--setsid",
        "--pid-dir",
        str(pid_dir),
        backoff_initial_s=0.05,
        backoff_factor=2.0,
        backoff_max_s=0.15,
        crash_loop_starts=4,
        crash_loop_window_s=60.0,
    )
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)
    assert run_async(sup.run) == "fatal"
    # The crashed main left its two workers behind each time: they are ended before the restart
    # (no stop was asked for: `ending_leftovers`, not `stopping`).
    run = ["started", "ending_leftovers", "exited"]
    assert rec.kinds == [*run, "backoff"] * 3 + [*run, "fatal"]
    assert {e.reason for e in rec.of("ending_leftovers")} == {
        "vLLM exited; ending 2 leftover process(es)"
    }
    assert [e.backoff_s for e in rec.of("backoff")] == [0.05, 0.1, 0.15]
    for exited in rec.of("exited"):
        assert exited.exit_code == 1 and exited.reason == "exit code 1"
    fatal = rec.of("fatal")[0]
    assert fatal.reason is not None and fatal.reason.startswith("crash loop: 4 starts within 60 s")
    # Every run left two workers behind (one in its own session); none survived.
    all_pids = {p for e in rec.of("exited") for p in e.tree_pids}
    assert len(all_pids) >= 4 * 3
    assert live_pids(sorted(all_pids)) == []
    assert log_bytes(tmp_path).count(b"torch.OutOfMemoryError: CUDA out of memory") == 4
    assert len({e.pid for e in rec.of("started")}) == 4


def test_exit_zero_after_engine_death_is_a_success_without_the_log_verdict(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "--scenario", "exit0-fatal")
    rec = Recorder()
    assert run_async(Supervisor(cfg, on_event=rec).run) == "exited"
    assert rec.kinds == ["started", "exited"]
    assert rec.events[-1].exit_code == 0


def test_exit_zero_after_engine_death_restarts_on_the_log_verdict(tmp_path: Path) -> None:
    """The daemon's part, played by the test with the real parser: tail the log from the start
    of the session and pass a fatal Failure on to the supervisor."""
    cfg = tiny_config(tmp_path, "--scenario", "exit0-fatal", crash_loop_starts=2)
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)
    kinds: list[str] = []

    async def tail_and_judge() -> None:
        offset = 0
        scanner: ChunkScanner | None = None
        seen_starts = 0
        while True:
            if len(rec.of("started")) > seen_starts:  # a new session: fresh parser state
                seen_starts = len(rec.of("started"))
                scanner = ChunkScanner(EventStream())
            data = log_bytes(tmp_path)[offset:]
            end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if scanner is not None and end > 0:
                for event in scanner.feed(data[:end], base=offset):
                    if isinstance(event, Failure):
                        kinds.append(event.kind)
                        sup.note_fatal_failure(event.kind)
                offset += end
            await asyncio.sleep(0.01)  # (real: the tail's poll interval, as a follower's)

    async def scenario() -> str:
        tail = asyncio.create_task(tail_and_judge())
        try:
            return await sup.run()
        finally:
            tail.cancel()

    assert run_async(scenario) == "fatal"
    assert rec.kinds == ["started", "exited", "backoff", "started", "exited", "fatal"]
    first_exit = rec.of("exited")[0]
    assert first_exit.exit_code == 0
    assert first_exit.reason == "exit code 0 after a fatal error in the log (engine_init_failed)"
    assert "engine_init_failed" in kinds
    assert sup.note_fatal_failure("late") is False  # no current run


def test_stall_restart_during_loading(tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path, "--scenario", "hang", stall_policy="restart", stall_restart_after_s=5.0
    )
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)

    async def scenario() -> None:
        task = await start(sup)
        await wait_until(lambda: b"| 1/4 [" in log_bytes(tmp_path))
        assert sup.note_stall(1.0) is False  # under the threshold
        assert sup.note_stall(6.0) is True
        await wait_until(lambda: len(rec.of("started")) == 2, what="restart")
        await wait_until(lambda: log_bytes(tmp_path).count(b"| 1/4 [") == 2)
        sup.note_ready()
        assert sup.note_stall(60.0) is False  # serving: stalls are no longer about loading
        await sup.stop()
        await task

    run_async(scenario)
    assert rec.kinds == [
        "started",
        "stopping",
        "exited",
        "backoff",
        "started",
        "stopping",
        "exited",
    ]
    assert rec.events[1].reason == "stalled for 6 s while loading"
    assert rec.events[2].reason == "restarting: stalled for 6 s while loading"
    assert rec.events[3].backoff_s == 0.05


def test_stall_alert_policy_only_reports(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "--scenario", "hang")
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)

    async def scenario() -> None:
        task = await start(sup)
        await wait_until(lambda: b"| 1/4 [" in log_bytes(tmp_path))
        assert sup.note_stall(10_000.0) is False
        # (real: a restart wrongly decided would show within a few tree scans; a stop at once
        # would hide it, as a stop request wins over a restart)
        await asyncio.sleep(0.2)
        assert rec.kinds == ["started"]
        await sup.stop()
        await task

    run_async(scenario)


def test_never_policy_stays_down_after_a_crash(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "--scenario", "exit", "--exit-code", "3", restart="never")
    rec = Recorder()
    assert run_async(Supervisor(cfg, on_event=rec).run) == "exited"
    assert rec.kinds == ["started", "exited"]
    assert rec.events[-1].exit_code == 3 and rec.events[-1].reason == "exit code 3"


def test_always_policy_restarts_clean_exits_until_the_start_limit(tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path,
        "--scenario",
        "exit",
        "--exit-code",
        "0",
        restart="always",
        crash_loop_starts=3,
        exit_verdict_wait_s=0.0,
    )
    rec = Recorder()
    assert run_async(Supervisor(cfg, on_event=rec).run) == "fatal"
    assert rec.kinds == ["started", "exited", "backoff"] * 2 + ["started", "exited", "fatal"]


def test_preflight_veto_backs_off_then_starts(tmp_path: Path) -> None:
    answers = ["preflight: FP8 KV cache on TRITON_MLA", "preflight: FP8 KV cache on TRITON_MLA"]

    def hook() -> str | None:
        return answers.pop(0) if answers else None

    cfg = tiny_config(tmp_path, "--scenario", "hang", preflight=hook)
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)

    async def scenario() -> None:
        task = await start(sup)
        await wait_until(lambda: "started" in rec.kinds)
        await sup.stop()
        await task

    run_async(scenario)
    assert rec.kinds[:3] == ["backoff", "backoff", "started"]
    assert rec.events[0].reason == "preflight: FP8 KV cache on TRITON_MLA"
    assert [e.backoff_s for e in rec.of("backoff")] == [0.05, 0.1]


def test_preflight_veto_with_never_policy_is_fatal(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, "--scenario", "exit", restart="never", preflight=lambda: "no")
    rec = Recorder()
    assert run_async(Supervisor(cfg, on_event=rec).run) == "fatal"
    assert rec.kinds == ["fatal"] and rec.events[0].reason == "no"
    assert not (tmp_path / "vllm.log").exists()


def test_missing_executable_is_fatal_at_once(tmp_path: Path) -> None:
    cfg = replace(tiny_config(tmp_path), argv=(str(tmp_path / "no-such-vllm"), "serve"))
    rec = Recorder()
    assert run_async(Supervisor(cfg, on_event=rec).run) == "fatal"
    assert rec.kinds == ["fatal"]
    assert (
        rec.events[0].reason
        == f"cannot start {tmp_path / 'no-such-vllm'}: No such file or directory"
    )


def test_carriage_return_updates_reach_the_file_before_any_newline(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    gates.mkdir()
    cfg = tiny_config(tmp_path, "--gate-dir", str(gates))
    sup = Supervisor(cfg)
    partial = "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  49%|████▉     | 33/67 [00:01<00:01, 25.10it/s]".encode()

    async def scenario() -> None:
        task = await start(sup)
        # The fake waits at the gate right after writing the partial bar, with no newline.
        await wait_until(lambda: log_bytes(tmp_path).endswith(partial), what="the \\r update")
        (gates / "graph-bar").touch()
        await wait_until(lambda: b"Application startup complete." in log_bytes(tmp_path))
        await sup.stop()
        await task

    run_async(scenario)


def test_log_rotation_during_output_is_byte_exact(tmp_path: Path) -> None:
    record = tmp_path / "printed.bin"
    cfg = tiny_config(
        tmp_path,
        "--scenario",
        "bulk",
        "--record",
        str(record),
        "--bulk-bytes",
        "300000",
        log_max_bytes=16_384,
        log_keep=1000,
        exit_verdict_wait_s=0.0,
    )
    sup = Supervisor(cfg)
    assert run_async(sup.run) == "exited"
    log = tmp_path / "vllm.log"
    rotated = sorted(tmp_path.glob("vllm.log.*"), key=lambda p: int(p.suffix[1:]), reverse=True)
    assert len(rotated) >= 15
    assert sup.log is not None and sup.log.rotations_total == len(rotated)
    joined = b"".join(p.read_bytes() for p in [*rotated, log])
    printed = record.read_bytes()
    assert len(printed) >= 300_000
    assert joined == printed
    for older, newer in zip(rotated, [*rotated[1:], log], strict=True):
        data = older.read_bytes()
        assert len(data) <= 16_384
        nxt = newer.read_bytes()[:1]
        # Each file ends where a record ends: never between \r and \n, never mid-record.
        assert data.endswith(b"\n") or (data.endswith(b"\r") and nxt != b"\n")


def test_cancelling_run_still_ends_the_whole_tree(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    cfg = tiny_config(tmp_path, "--workers", "2", "--setsid", "--pid-dir", str(pid_dir))
    rec = Recorder()
    sup = Supervisor(cfg, on_event=rec)

    async def scenario() -> list[int]:
        task = await start(sup)
        await wait_until(lambda: b"Application startup complete." in log_bytes(tmp_path))
        pids = list(read_pids(pid_dir).values())
        await wait_until(lambda: set(pids) <= set(sup.tree_pids), what="tree scan")
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return pids

    pids = run_async(scenario)
    assert len(pids) == 3
    assert live_pids(pids) == []
    assert sup.state == "exited"
    assert rec.kinds[-1] == "exited" and rec.events[-1].reason == "stopped: supervisor cancelled"


def test_bad_working_directory_is_fatal_and_named(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, cwd=str(tmp_path / "nowhere"))
    rec = Recorder()
    assert run_async(Supervisor(cfg, on_event=rec).run) == "fatal"
    reason = rec.events[-1].reason
    assert reason is not None and reason.endswith(f"({tmp_path / 'nowhere'})")
