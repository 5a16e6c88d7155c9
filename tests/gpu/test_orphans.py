"""The orphan check, on a /proc tree built in tmp_path, and on real processes with the simulated
GPUs, which (like NVML) list a process for a moment after it exits."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.sources.inputs import GpuProcess, GpuReading, GpuSample
from loadwatch.daemon.supervise.orphans import (
    OrphanReport,
    check_orphans,
    process_tree_pids,
    read_process,
    settle_orphans,
)
from tests.helpers import VirtualClock, wait_for

GIB = 1 << 30


def add_proc(root: Path, pid: int, ppid: int, cmd: list[str], comm: str = "python3") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    # fields after the command name: state, ppid, pgrp, session, ...
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0\n")
    (d / "cmdline").write_bytes(b"\0".join(c.encode() for c in cmd) + b"\0")


def reading(*gpus: list[tuple[int, int | None]], health: str = "ok") -> GpuReading:
    return GpuReading(
        ts=77.0,
        samples=tuple(
            GpuSample(
                index=i,
                health=health,  # type: ignore[arg-type]
                uuid=f"GPU-{i}",
                processes=tuple(GpuProcess(pid=p, used_bytes=b) for p, b in procs),
            )
            for i, procs in enumerate(gpus)
        ),
    )


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """init(1) -> loadwatch(50) -> vllm(100) -> workers 101, 102; worker 102 -> helper 103.

    vLLM has exited; 101 was reparented to init and still runs; 300 is someone else's job.
    """
    root = tmp_path / "proc"
    add_proc(root, 1, 0, ["/sbin/init"], comm="systemd")
    add_proc(root, 50, 1, ["loadwatch", "run"])
    add_proc(root, 101, 1, ["python3", "-m", "vllm.worker"], comm="VllmWorker TP0")
    add_proc(root, 103, 101, ["python3", "helper.py"], comm="pt_main_thread")
    add_proc(root, 300, 1, ["python3", "train.py"])
    return root


def test_leaked_workers_and_unknown_holders_are_told_apart(proc: Path) -> None:
    r = reading(
        [(101, 40 * GIB), (300, 2 * GIB)],
        [(103, 1 * GIB), (999, 5 * GIB)],  # 999: gone, or in another pid namespace
    )
    report = check_orphans(r, {100, 101, 102}, proc_root=proc)
    assert [(h.pid, h.gpu_index, h.used_bytes, h.alive) for h in report.leaked] == [
        (101, 0, 40 * GIB, True),
        (103, 1, 1 * GIB, True),  # not in the tree snapshot, but a child of a leaked worker
    ]
    assert report.leaked[0].cmdline == "python3 -m vllm.worker"
    assert report.leaked[0].gpu_uuid == "GPU-0"
    assert [(h.pid, h.alive, h.kind) for h in report.unknown] == [
        (300, True, "unknown"),
        (999, False, "unknown"),
    ]
    assert report.leaked_bytes == 41 * GIB and report.unknown_bytes == 7 * GIB
    assert not report.clean and report.complete and report.ts == 77.0
    assert report.summary() == (
        f"2 leaked process(es) from the vLLM tree hold {41 * GIB} bytes; "
        f"2 other process(es) hold {7 * GIB} bytes"
    )


def test_a_tree_pid_no_longer_in_the_table_is_exiting_not_leaked(proc: Path) -> None:
    # NVML lists a process for a moment after it exits: its /proc entry is gone already
    report = check_orphans(reading([(102, GIB)]), {100, 102}, proc_root=proc)
    assert report.leaked == () and report.clean and not report.settled
    assert [(h.pid, h.alive, h.kind) for h in report.exiting] == [(102, False, "exiting")]
    assert report.summary().endswith("; 1 exited process(es) still listed after 0.0 s")


def test_a_zombie_of_the_tree_is_exiting(proc: Path) -> None:
    add_proc(proc, 104, 101, ["python3"])
    stat = proc / "104" / "stat"
    stat.write_text(stat.read_text().replace(" S 101 ", " Z 101 "))
    report = check_orphans(reading([(104, GIB)]), {101}, proc_root=proc)
    assert report.leaked == () and [h.pid for h in report.exiting] == [104]


def test_nothing_left_is_clean(proc: Path) -> None:
    report = check_orphans(reading([], []), {100, 101}, proc_root=proc)
    assert report.clean and report.complete
    assert report.leaked == () and report.unknown == ()
    assert report.summary() == "no process holds GPU memory"


def test_ignored_pids_are_left_out(proc: Path) -> None:
    report = check_orphans(reading([(300, GIB)]), {100}, proc_root=proc, ignore_pids={300})
    assert report.unknown == () and report.clean


def test_holder_counted_once_per_gpu(proc: Path) -> None:
    report = check_orphans(reading([(101, GIB)], [(101, 2 * GIB)]), {101}, proc_root=proc)
    assert [(h.gpu_index, h.used_bytes) for h in report.leaked] == [(0, GIB), (1, 2 * GIB)]
    assert report.summary().startswith("1 leaked process(es)")


def test_unreadable_gpus_make_the_report_incomplete(proc: Path) -> None:
    r = GpuReading(
        ts=1.0,
        samples=(
            GpuSample(index=0, health="ok", processes=(GpuProcess(101, GIB),)),
            GpuSample(index=1, health="lost"),
        ),
    )
    report = check_orphans(r, {101}, proc_root=proc)
    assert not report.complete and report.error == "not read: GPU 1 lost"
    assert len(report.leaked) == 1
    assert report.summary().endswith("(not read: GPU 1 lost)")
    down = check_orphans(
        GpuReading(ts=1.0, source_up=False, error="NVML init failed"), {101}, proc_root=proc
    )
    assert not down.complete and down.error == "GPUs not readable: NVML init failed"
    assert down.clean  # nothing seen, which the summary says is not the whole story


def test_stat_with_parentheses_and_spaces_in_the_name(tmp_path: Path) -> None:
    add_proc(tmp_path, 7, 3, ["x"], comm="a) (b c) d")
    info = read_process(7, tmp_path)
    assert info is not None and (info.ppid, info.state, info.cmdline) == (3, "S", "x")
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_text("garbage")
    assert read_process(8, tmp_path) is None
    assert read_process(9, tmp_path) is None


def test_process_tree_pids_on_a_fake_table(proc: Path) -> None:
    assert process_tree_pids(101, proc) == {101, 103}
    assert process_tree_pids(1, proc) == {1, 50, 101, 103, 300}
    assert process_tree_pids(4000, proc) == {4000}
    assert process_tree_pids(1, proc / "missing") == {1}


def test_process_tree_pids_on_the_real_proc() -> None:
    child = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        wait_for(lambda: _children_of(child.pid), "the shell to start its sleep", 10)
        grandchildren = _children_of(child.pid)
        tree = process_tree_pids(os.getpid())
        assert {os.getpid(), child.pid} | grandchildren <= tree
        assert 1 not in tree
    finally:
        child.kill()
        child.wait()


def _children_of(pid: int) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = read_process(int(entry.name))
            if info is not None and info.ppid == pid:
                out.add(info.pid)
    return out


# -- real processes, simulated GPUs ----------------------------------------------------------------


def settle(
    gpus: SimulatedGpuSource, clock: VirtualClock, tree: set[int], grace_s: float, **kw: object
) -> OrphanReport:
    """The check after an exit, on `clock`: the grace and the re-reads take no wall time (the
    simulated GPUs' linger after an exit goes by the same clock)."""

    async def poll() -> GpuReading:
        return gpus.poll()

    report = asyncio.run(
        settle_orphans(
            poll,
            tree,
            grace_s=grace_s,
            recheck_s=0.05,
            monotonic=clock,
            sleep=clock.sleep,
            **kw,  # type: ignore[arg-type]
        )
    )
    assert report is not None
    return report


WAIT_FOR_SIGNAL = "import signal; signal.pause()"  # a worker that lives until it is signalled


def python(code: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], text=True, stdout=subprocess.PIPE, **kw)  # type: ignore[call-overload]


def test_an_exited_worker_still_listed_for_a_moment_is_not_leaked() -> None:
    clock = VirtualClock()
    gpus = SimulatedGpuSource(2, pids=None, exit_linger_s=1.0, monotonic=clock)
    workers = [python(WAIT_FOR_SIGNAL) for _ in range(2)]
    for i, w in enumerate(workers):
        gpus.hold(i, w.pid, 40 * GIB)
    workers[0].send_signal(signal.SIGTERM)  # a stop
    workers[1].kill()  # a crash
    for w in workers:
        w.wait()
    tree = {w.pid for w in workers}
    first = gpus.poll()
    assert [len(s.processes) for s in first.samples] == [1, 1], "the driver still lists them"
    assert check_orphans(first, tree).leaked == ()
    report = settle(gpus, clock, tree, grace_s=10.0)
    assert report.leaked == () and report.exiting == () and report.unknown == ()
    assert 1.0 <= report.waited_s < 1.1  # the linger, not the grace
    assert report.summary() == "no process holds GPU memory"


def test_a_zombie_worker_waits_out_the_grace_and_is_not_leaked() -> None:
    clock = VirtualClock()
    gpus = SimulatedGpuSource(1, pids=None, exit_linger_s=60.0, monotonic=clock)
    worker = python(WAIT_FOR_SIGNAL)
    gpus.hold(0, worker.pid, GIB)
    worker.kill()

    def zombie() -> bool:
        info = read_process(worker.pid)
        return info is None or info.state == "Z"

    wait_for(zombie, "the killed worker a zombie", 10)
    try:
        report = settle(gpus, clock, {worker.pid}, grace_s=0.5)
        assert report.leaked == () and [h.pid for h in report.exiting] == [worker.pid]
        assert report.waited_s >= 0.5 and report.exiting[0].alive  # a zombie is in /proc
    finally:
        worker.wait()


GRANDCHILD = """
import os, signal, sys
r, w = os.pipe()
if os.fork() == 0:  # the grandchild: holds its memory after its parent exited
    os.close(r)
    if "--escape" in sys.argv:  # leaves the session and the parent link, as a daemon does
        os.setsid()
        if os.fork():
            os._exit(0)
    os.write(w, str(os.getpid()).encode())
    os.close(w)
    signal.pause()  # (until the test kills it)
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode(), flush=True)
if "--escape" not in sys.argv:
    sys.stdin.readline()  # exits when the test closes its stdin
"""


def start_grandchild(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    child = subprocess.Popen(
        [sys.executable, "-c", GRANDCHILD, *args],
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def test_a_grandchild_keeping_memory_after_its_parent_exited_is_leaked() -> None:
    clock = VirtualClock()
    gpus = SimulatedGpuSource(3, pids=None, exit_linger_s=0.3, monotonic=clock)
    child, grandchild = start_grandchild()
    try:
        tree = process_tree_pids(child.pid)  # the snapshot taken while the run lives
        assert tree == {child.pid, grandchild}
        gpus.hold(0, child.pid, 30 * GIB)
        gpus.hold(2, grandchild, 9 * GIB)
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
        report = settle(gpus, clock, tree, grace_s=1.0)
        assert [(h.pid, h.gpu_index, h.used_bytes, h.alive) for h in report.leaked] == [
            (grandchild, 2, 9 * GIB, True)
        ]
        assert report.exiting == () and report.waited_s >= 1.0, "the grace was waited out"
        assert report.summary().startswith(
            f"1 leaked process(es) from the vLLM tree hold {9 * GIB}"
        )
    finally:
        os.kill(grandchild, signal.SIGKILL)


def test_a_worker_that_left_the_tree_is_known_by_the_run_marker() -> None:
    clock = VirtualClock()
    gpus = SimulatedGpuSource(1, pids=None, monotonic=clock)
    env = {**os.environ, "LOADWATCH_RUN": "5eed"}
    child, escaped = start_grandchild("--escape", env=env)
    try:
        child.wait()
        tree = {child.pid}  # the tree never saw it: it left the session before a scan
        gpus.hold(0, escaped, 5 * GIB)
        assert [h.pid for h in settle(gpus, clock, tree, 0.2, run_marker="5eed").leaked] == [
            escaped
        ]
        other = settle(gpus, clock, tree, 0.2, run_marker="0ther")
        assert other.leaked == () and [h.pid for h in other.unknown] == [escaped]
        assert settle(gpus, clock, tree, 0.2).leaked == ()
    finally:
        os.kill(escaped, signal.SIGKILL)


def test_settle_gives_up_on_gpus_that_cannot_be_read() -> None:
    gpus = SimulatedGpuSource(1)
    gpus.set_library_missing()

    async def poll() -> GpuReading:
        return gpus.poll()

    assert asyncio.run(settle_orphans(poll, {1}, grace_s=5.0)) is None
    assert gpus.polls == 1
