from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from loadwatch.daemon.sources.proc.tree import ProcessTree, ProcInfo, parse_stat, read_process_table
from tests.helpers import wait_for


def test_parse_stat_with_hostile_command_name() -> None:
    line = "4242 (a) b (c) d) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n"
    info = parse_stat(line)
    assert info == ProcInfo(pid=4242, ppid=1, pgid=4242, sid=4242, state="S", start_ticks=987654)
    assert parse_stat("garbage") is None
    assert parse_stat("1 (x) S 1 2") is None


def test_read_process_table_sees_this_process_and_a_fixture_root(tmp_path: Path) -> None:
    table = read_process_table()
    me = table[os.getpid()]
    assert me.ppid == os.getppid() and me.pgid == os.getpgrp() and me.sid == os.getsid(0)
    (tmp_path / "17").mkdir()
    (tmp_path / "17" / "stat").write_text("17 (w) Z 1 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0\n")
    (tmp_path / "self").mkdir()
    (tmp_path / "18").mkdir()  # vanished between listdir and open
    fake = read_process_table(str(tmp_path))
    assert list(fake) == [17] and fake[17].gone


def _info(pid: int, ppid: int, sid: int, start: int = 100, state: str = "S") -> ProcInfo:
    return ProcInfo(pid=pid, ppid=ppid, pgid=sid, sid=sid, state=state, start_ticks=start)


def test_tree_remembers_reparented_and_setsid_members() -> None:
    tree = ProcessTree(10)
    t1 = {
        10: _info(10, 1, 10),
        11: _info(11, 10, 10),
        12: _info(12, 10, 12),
        13: _info(13, 12, 12),
        99: _info(99, 1, 99),
    }
    tree.scan(t1)
    assert tree.pids == (10, 11, 12, 13)
    # The root died; 12 (own session) and its child were reparented to init.
    t2 = {12: _info(12, 1, 12), 13: _info(13, 12, 12), 11: _info(11, 1, 10), 99: _info(99, 1, 99)}
    tree.scan(t2)
    assert tree.alive(t2) == [11, 12, 13]
    # A new process that reuses pid 12 is not ours.
    t3 = {12: _info(12, 1, 12, start=500), 13: _info(13, 1, 12, state="Z")}
    assert tree.alive(t3) == []
    assert not tree.group_alive(t3)


def test_reused_root_pid_does_not_adopt_a_stranger_session() -> None:
    tree = ProcessTree(10)
    tree.scan({10: _info(10, 1, 10, start=100), 11: _info(11, 10, 10, start=110)})
    # The root is gone; an unrelated session leader now has pid 10, with a child of its own.
    t = {
        10: _info(10, 1, 10, start=900),
        20: _info(20, 10, 10, start=910),
        11: _info(11, 1, 10, start=110),
    }
    tree.scan(t)
    assert tree.alive(t) == [11]
    assert 20 not in tree.pids


def test_tree_of_a_real_process_group() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal,subprocess,sys; subprocess.Popen([sys.executable,'-c','import signal; signal.pause()']); signal.pause()",
        ],
        start_new_session=True,
    )
    try:
        tree = ProcessTree(child.pid)

        def both_seen() -> bool:
            tree.scan(read_process_table())
            return len(tree.pids) == 2

        wait_for(both_seen, "the child and its child in the tree", 5)
        assert len(tree.pids) == 2 and child.pid in tree.pids
        assert tree.group_alive(read_process_table())
    finally:
        os.killpg(child.pid, 9)
        child.wait()
