"""The vLLM process a log names, looked for in the real /proc of this host.

A pid from the log is only taken for vLLM's when that process runs as vLLM's user and its command
line is vLLM's (or a vLLM process spawned it): a client of vLLM can get a forged `(APIServer
pid=N)` prefix into the log, and any process of this host could otherwise be watched as vLLM,
its argv read for the KV-cache dtype and its exit taken for vLLM's. The processes here are real
(tests/daemon/lookalike.py); the other user is `nobody`, which needs root to become.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from loadwatch.daemon.sources.proc.logged_process import (
    ExpectedUser,
    LoggedProcess,
    expected_user,
    is_vllm,
    started,
)
from tests.daemon.lookalike import NOBODY, Lookalike, named, plain, standin
from tests.helpers import wait_for

as_root = pytest.mark.skipif(os.getuid() != 0, reason="becoming another user needs root")


class Watch:
    """A `LoggedProcess` expecting `uid`, and the refusals it said."""

    def __init__(self, uid: int) -> None:
        self.said: list[tuple[int, str]] = []
        self.asked = 0
        self.lp = LoggedProcess(user=self._user, on_refused=lambda p, w: self.said.append((p, w)))
        self.uid = uid

    def _user(self) -> ExpectedUser:
        self.asked += 1
        return ExpectedUser(self.uid, "the test's user")

    def check(self, pid: int | None) -> tuple[str, object]:
        return self.lp.check(pid)


@pytest.fixture
def procs() -> Iterator[list[Lookalike]]:
    started: list[Lookalike] = []
    yield started
    for p in started:
        p.stop()


def test_vllm_command_lines() -> None:
    # How vLLM 0.32 runs: the module (tests/realvllm/vllmproc.py starts real vLLM so), the
    # console script (a shebang: the kernel puts the interpreter first), the title vLLM gives its
    # processes (vllm/utils/system_utils.py set_process_title: `VLLM::EngineCore_DP0`,
    # `VLLM::APIServer_0`; /proc shows it alone, the rest of argv blanked).
    assert is_vllm(("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"))
    assert is_vllm(("python3", "-u", "-X", "dev", "-m", "vllm.entrypoints.openai.api_server"))
    assert is_vllm(("/venv/bin/python3", "/venv/bin/vllm", "serve", "/models/m"))
    assert is_vllm(("python3", "-s", "/usr/local/bin/vllm", "serve", "/models/m"))
    assert is_vllm(("/opt/vllm/bin/vllm", "serve", "/models/m"))
    assert is_vllm(("python", "-m", "vllm.entrypoints.cli.main", "serve", "m"))
    assert is_vllm(("VLLM::EngineCore_DP0",))
    assert is_vllm(("VLLM::APIServer_0",))
    assert not is_vllm(("python3", "-m", "http.server"))
    assert not is_vllm(("bash", "-c", "echo vllm"))
    assert not is_vllm(())
    # What the looser rule took for vLLM: a word among the first four that merely names vllm.
    assert not is_vllm(("python3", "-c", "import time", "vllm.entrypoints.openai.api_server"))
    assert not is_vllm(("tail", "-f", "/var/log/vllm"))
    assert not is_vllm(("vim", "vllm.log"))
    assert not is_vllm(("sleep", "60", "VLLM::EngineCore"))
    assert not is_vllm(("python", "-c", "import vllm", "-m", "vllm.entrypoints.openai.api_server"))
    # vLLM's own clients and tools are not the server.
    assert not is_vllm(("/venv/bin/python3", "/venv/bin/vllm", "chat", "--url", "http://x"))
    assert not is_vllm(("/venv/bin/vllm", "bench", "serve"))
    assert not is_vllm(("python", "-m", "vllm.entrypoints.cli.main", "complete"))
    assert not is_vllm(("python", "-m", "vllmx.entrypoints.openai.api_server"))


def test_a_vllm_running_here_as_its_user_is_seen_with_its_argv_then_gone_once_killed(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    vllm = standin(tmp_path, "--kv-cache-dtype", "fp8")
    procs.append(vllm)
    watch = Watch(os.getuid())
    what, seen = watch.lp.check(vllm.pid)
    assert what == "new" and seen is not None and seen.pid == vllm.pid
    assert seen.argv[1:] == ("-m", "vllm.entrypoints.openai.api_server", "--kv-cache-dtype", "fp8")
    assert watch.check(vllm.pid) == ("same", None)
    vllm.stop()
    what, seen = watch.lp.check(vllm.pid)
    assert what == "gone" and seen is not None and seen.pid == vllm.pid
    assert watch.check(vllm.pid) == ("unknown", None)  # not looked for again as vLLM
    assert watch.said == []


def test_a_pid_that_is_not_here_is_never_judged() -> None:
    watch = Watch(os.getuid())
    assert watch.check(None) == ("unknown", None)
    assert watch.check(2**22 + 12345) == ("unknown", None)  # another host's, or none
    assert watch.said == []  # a log from elsewhere names pids that are not here: no complaint


def test_a_process_that_only_mentions_vllm_is_not_adopted_and_said_once(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    mentions = plain(sys.executable, "-c", "import signal; signal.pause()", "vllm.entrypoints.x")
    sleeper = plain("sleep", "60")
    procs += [mentions, sleeper]
    watch = Watch(os.getuid())
    for _ in range(3):  # checked at every interval; said once
        assert watch.check(mentions.pid) == ("unknown", None)
        assert watch.check(sleeper.pid) == ("unknown", None)
        assert watch.check(os.getpid()) == ("unknown", None)  # pytest
    assert [p for p, _ in watch.said] == [mentions.pid, sleeper.pid, os.getpid()]
    assert all("command line" in why for _, why in watch.said), watch.said


@as_root
def test_a_vllm_lookalike_under_another_user_is_not_adopted(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    foreign = standin(tmp_path, "--kv-cache-dtype", "fp8", uid=NOBODY)
    procs.append(foreign)
    watch = Watch(os.getuid())
    assert watch.check(foreign.pid) == ("unknown", None)
    assert watch.check(foreign.pid) == ("unknown", None)
    assert len(watch.said) == 1 and watch.said[0][0] == foreign.pid
    assert f"uid {NOBODY}" in watch.said[0][1] and "the test's user" in watch.said[0][1]
    foreign.stop()
    assert watch.check(foreign.pid) == ("unknown", None)  # its exit is nobody's business


@as_root
def test_the_expected_user_is_the_one_adopted(tmp_path: Path, procs: list[Lookalike]) -> None:
    ours = standin(tmp_path / "a")
    theirs = standin(tmp_path / "b", uid=NOBODY)
    procs += [ours, theirs]
    watch = Watch(NOBODY)  # `[vllm] user = "nobody"`
    assert watch.check(ours.pid) == ("unknown", None)
    what, seen = watch.lp.check(theirs.pid)
    assert what == "new" and seen is not None and seen.pid == theirs.pid


def test_a_program_named_vllm_serve_passes_by_its_name_and_is_held_to_the_user(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    """`/tmp/x/vllm serve` that is no vLLM is taken for vLLM by its command line: argv is what
    the exec'ing process chose (`exec -a`, as here), so no rule on it tells a real vLLM from a
    copy. What keeps a stranger's process out is the user; a process of vLLM's own user could as
    well be vLLM. Without `serve` (vLLM's clients: `vllm chat`) it is not the server."""
    serve = named(tmp_path / "s", "/tmp/x/vllm", "serve")
    chat = named(tmp_path / "c", "/tmp/x/vllm", "chat")
    procs += [serve, chat]
    assert Watch(os.getuid()).check(serve.pid)[0] == "new"
    assert Watch(os.getuid()).check(chat.pid) == ("unknown", None)
    other = Watch(NOBODY)
    assert other.check(serve.pid) == ("unknown", None)
    assert f"uid {os.getuid()}" in other.said[0][1]


def test_a_child_vllm_spawned_is_adopted_by_its_ancestry_a_helper_it_runs_is_not(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    """vLLM starts its engine core with multiprocessing's spawn: until it takes its title,
    the child's command line is Python's (`-c 'from multiprocessing.spawn import spawn_main;
    ...' --multiprocessing-fork`), and its parent is vLLM. A helper vLLM runs (a compiler, a
    shell) is not vLLM: its short life is not vLLM's."""
    vllm = standin(tmp_path, children=True)
    procs.append(vllm)
    _, core, helper = vllm.pids
    with open(f"/proc/{core}/cmdline", "rb") as f:
        assert b"from multiprocessing.spawn import spawn_main" in f.read()
    watch = Watch(os.getuid())
    assert watch.check(helper) == ("unknown", None)
    assert watch.check(core)[0] == "new"
    code = "from multiprocessing.spawn import spawn_main; import signal; signal.pause()"
    orphan = plain(sys.executable, "-B", "-c", code, "--multiprocessing-fork")
    procs.append(orphan)  # such a command line, started by no vLLM (by pytest)
    other = Watch(os.getuid())
    assert other.check(orphan.pid) == ("unknown", None)
    assert other.said and "no vLLM process spawned it" in other.said[0][1]
    assert orphan.proc.poll() is None  # judged alive


def test_an_adopted_vllm_is_not_replaced_by_a_pid_that_fails_the_check(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    vllm = standin(tmp_path)
    sleeper = plain("sleep", "60")
    procs += [vllm, sleeper]
    watch = Watch(os.getuid())
    assert watch.check(vllm.pid)[0] == "new"
    # The log now names another pid (a forged prefix): refused, and vLLM is still the one watched.
    assert watch.check(sleeper.pid) == ("same", None)
    assert [p for p, _ in watch.said] == [sleeper.pid]
    sleeper.stop()
    assert watch.check(sleeper.pid) == ("same", None)  # the stranger's exit is not vLLM's
    vllm.stop()
    what, seen = watch.lp.check(sleeper.pid)
    assert what == "gone" and seen is not None and seen.pid == vllm.pid


def test_a_new_vllm_replaces_the_adopted_one_only_through_the_same_check(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    first, second = standin(tmp_path / "a"), standin(tmp_path / "b")
    procs += [first, second]
    watch = Watch(os.getuid())
    assert watch.check(first.pid)[0] == "new"
    asked = watch.asked
    what, seen = watch.lp.check(second.pid)  # a restarted vLLM's new API server
    assert what == "new" and seen is not None and seen.pid == second.pid
    assert watch.asked == asked + 1  # its user was checked too


def test_the_expected_user_is_the_configured_one_else_the_log_files_owner(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    assert expected_user(1234, log).uid == 1234
    assert expected_user(None, log).uid == os.stat(log).st_uid
    assert str(log) in expected_user(None, log).whose
    gone = expected_user(None, tmp_path / "missing.log")
    assert gone.uid is None and "[vllm] user" in gone.whose
    journal = expected_user(None, None)  # a journal unit: no file to own
    assert journal.uid is None and "[vllm] user" in journal.whose


def test_the_process_seen_is_told_by_its_start_time_a_zombie_is_gone(
    tmp_path: Path, procs: list[Lookalike]
) -> None:
    """Once seen, the process is checked by its stat alone: its pid with another start time is
    another process (a pid reused), and a zombie is gone."""
    vllm = standin(tmp_path)
    procs.append(vllm)
    watch = Watch(os.getuid())
    what, seen = watch.lp.check(vllm.pid)
    assert what == "new" and seen is not None
    assert started(vllm.pid) == seen.start_ticks
    assert watch.check(vllm.pid) == ("same", None)
    reused = replace(seen, start_ticks=seen.start_ticks + 1)
    watch.lp.seen = reused  # as if its pid were another process's now
    assert watch.check(vllm.pid) == ("gone", reused)
    zombie = subprocess.Popen(["sleep", "30"])
    try:
        assert started(zombie.pid) is not None
        zombie.kill()
        wait_for(lambda: started(zombie.pid) is None, "the killed process a zombie", 5)
    finally:
        zombie.wait()
    assert started(zombie.pid) is None


@pytest.mark.parametrize("change", ["its start time (a new process with the pid)", "the user"])
def test_a_refused_process_is_read_whole_once_while_it_runs_and_its_user_is_expected(
    tmp_path: Path, procs: list[Lookalike], change: str
) -> None:
    """A log from another pid namespace names a process of this host at every round, for days:
    refused once, it is told again by its stat alone. A new process with the pid, or another
    expected user, is judged whole again. The /proc here is a copy of a real process's files, as
    a process cannot be made to change its command line while it runs."""
    sleeper = plain("sleep", "60")
    procs.append(sleeper)
    root = tmp_path / "proc"
    copy = root / str(sleeper.pid)
    copy.mkdir(parents=True)
    for name in ("stat", "cmdline", "status"):
        (copy / name).write_bytes(Path(f"/proc/{sleeper.pid}/{name}").read_bytes())
    watch = Watch(os.getuid())
    watch.lp = LoggedProcess(
        str(root), user=watch._user, on_refused=lambda p, w: watch.said.append((p, w))
    )
    assert watch.check(sleeper.pid) == ("unknown", None)
    assert [p for p, _ in watch.said] == [sleeper.pid]
    (copy / "cmdline").write_bytes(b"vllm\0serve\0model\0")  # were it read, it would pass
    assert watch.check(sleeper.pid) == ("unknown", None)  # the same process: not read again
    if change == "the user":
        watch.uid = NOBODY  # judged again: refused by its uid now
        assert watch.check(sleeper.pid) == ("unknown", None)
        watch.uid = os.getuid()  # and again: it passes
    else:
        stat = (copy / "stat").read_text().split(") ", 1)
        fields = stat[1].split()
        fields[19] = str(int(fields[19]) + 1)  # starttime, the 22nd field of proc_pid_stat(5)
        (copy / "stat").write_text(f"{stat[0]}) {' '.join(fields)}\n")
    what, seen = watch.check(sleeper.pid)
    assert what == "new" and seen is not None and seen.argv == ("vllm", "serve", "model")
    assert [p for p, _ in watch.said] == [sleeper.pid]  # said once
