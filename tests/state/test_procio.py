"""The /proc reader: a fixture tree under a temp root, and the real /proc with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.sources.proc.io_counters import ProcIoReader, io_read_bytes, stat_fields
from tests.helpers import wait_for


def _proc(
    root: Path,
    pid: int,
    ppid: int,
    read_bytes: int | None,
    children: tuple[int, ...] = (),
    start: int = 1000,
    comm: str = "python",
    with_children_file: bool = True,
) -> None:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    if read_bytes is not None:
        (d / "io").write_text(
            f"rchar: 5\nwchar: 0\nsyscr: 1\nsyscw: 0\nread_bytes: {read_bytes}\n"
            "write_bytes: 0\ncancelled_write_bytes: 0\n"
        )
    if with_children_file:
        (d / "task" / str(pid) / "children").write_text(" ".join(map(str, children)) + " ")


def test_tree_sum_and_exited_children_keep_their_bytes(tmp_path: Path) -> None:
    _proc(tmp_path, 10, 1, 100, children=(11, 12))
    _proc(tmp_path, 11, 10, 1_000, children=(13,))
    _proc(tmp_path, 12, 10, 10_000)
    _proc(tmp_path, 13, 11, 100_000)
    _proc(tmp_path, 99, 1, 5)  # not ours
    clock = iter([1.0, 2.0, 3.0])
    r = ProcIoReader(tmp_path, clock=lambda: next(clock))
    assert sorted(r.tree(10)) == [10, 11, 12, 13]
    s = r.read(10)
    assert (s.ts, s.read_bytes, s.pids) == (1.0, 111_100, 4)
    # 13 exits (and 11 no longer lists it); 12 reads more
    import shutil

    shutil.rmtree(tmp_path / "13")
    _proc(tmp_path, 11, 10, 1_000, children=())
    _proc(tmp_path, 12, 10, 20_000)
    s = r.read(10)
    assert s.read_bytes == 100 + 1_000 + 20_000 + 100_000 and s.pids == 3
    # pid 12 reused by a new process: its bytes start again, the old ones stay counted
    _proc(tmp_path, 12, 10, 7, start=5000)
    s = r.read(10)
    assert s.read_bytes == 100 + 1_000 + 7 + 20_000 + 100_000


def test_scan_when_the_kernel_has_no_children_files(tmp_path: Path) -> None:
    _proc(tmp_path, 20, 1, 1, with_children_file=False)
    _proc(tmp_path, 21, 20, 2, with_children_file=False, comm="vllm (worker) x")
    _proc(tmp_path, 22, 21, 4, with_children_file=False)
    _proc(tmp_path, 23, 1, 8, with_children_file=False)
    r = ProcIoReader(tmp_path, clock=lambda: 0.0)
    assert sorted(r.tree(20)) == [20, 21, 22]
    assert r.read(20).read_bytes == 7


def test_missing_or_unreadable_root_gives_none(tmp_path: Path) -> None:
    r = ProcIoReader(tmp_path, clock=lambda: 5.0)
    s = r.read(12345)
    assert s.read_bytes is None and s.pids == 0 and s.ts == 5.0
    _proc(tmp_path, 30, 1, None)  # io not readable (another user's process)
    assert r.read(30).read_bytes is None


def test_new_root_starts_a_new_count(tmp_path: Path) -> None:
    _proc(tmp_path, 40, 1, 500)
    _proc(tmp_path, 41, 1, 9)
    r = ProcIoReader(tmp_path, clock=lambda: 0.0)
    assert r.read(40).read_bytes == 500
    assert r.read(41).read_bytes == 9


def test_parsers_of_the_proc_files() -> None:
    fields = stat_fields("77 (a) b (c)) R 1 77 77 0")
    assert fields is not None and fields[0] == "R" and fields[1] == "1"
    assert stat_fields("garbage") is None
    assert io_read_bytes("rchar: 1\nread_bytes: 4096\n") == 4096
    assert io_read_bytes("rchar: 1\n") is None


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc with io")
def test_real_process_tree(tmp_path: Path) -> None:
    # A real parent that starts a real child; both stay up until told to stop.
    code = (
        "import subprocess, sys\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])\n"
        "print(c.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "c.kill(); c.wait()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        r = ProcIoReader()
        wait_for(lambda: child in r.tree(parent.pid), "the child in the tree", 10)
        assert set(r.tree(parent.pid)) >= {parent.pid, child}
        assert os.getpid() not in r.tree(parent.pid)
        s = r.read(parent.pid)
        assert s.read_bytes is not None and s.read_bytes >= 0 and s.pids >= 2
    finally:
        assert parent.stdin is not None
        parent.stdin.write("\n")
        parent.stdin.close()
        parent.wait(timeout=10)
