"""The orphan check, on a /proc tree built in tmp_path (and once on the real /proc)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from loadwatch.daemon.sources.inputs import GpuProcess, GpuReading, GpuSample
from loadwatch.daemon.supervise.orphans import check_orphans, process_tree_pids, read_process

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


def test_a_tree_pid_no_longer_in_the_table_still_counts_as_leaked(proc: Path) -> None:
    report = check_orphans(reading([(102, GIB)]), {100, 102}, proc_root=proc)
    assert [(h.pid, h.alive) for h in report.leaked] == [(102, False)]


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
        deadline = time.monotonic() + 10
        while not (grandchildren := _children_of(child.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert grandchildren, "the shell did not start its sleep"
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
