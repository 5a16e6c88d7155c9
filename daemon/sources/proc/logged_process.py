"""Is the vLLM process a log names running on this host, and with which arguments?

In watch mode the log gives pids (`(APIServer pid=N)`, uvicorn's `Started server process [N]`)
but the log may come from another host or a container with its own pid namespace, and it is
untrusted: vLLM prints text its clients choose, so a forged prefix can name any process of this
host. A pid is only taken for vLLM's when that process, here:

- runs as vLLM's user (real and effective uid): `[vllm] user`, else the owner of the log file
  (the vLLM that writes a log owns it: its shell's redirection or its own handler created it);
- and is vLLM by its command line (`is_vllm`), or is a child vLLM spawned (`spawned_by_vllm`).

The command line alone proves nothing (whoever execs a program chooses its argv); the user is
what keeps a stranger's process out. A pid that fails is said once (`on_refused`) and otherwise
ignored: the process taken before stays the one watched. `LoggedProcess` remembers the process
it took (pid and start time, so a reused pid is not mistaken for it) and says when it is gone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadwatch.daemon.sources.proc.tree import parse_stat

# vLLM's own subcommands that run its server (vllm/entrypoints/cli/: `serve`, and `launch`,
# which runs a component's server); `chat`, `complete`, `bench` and the others are clients.
SERVER_SUBCOMMANDS = frozenset({"serve", "launch"})
CLI_MODULE = "vllm.entrypoints.cli.main"  # what the `vllm` console script runs
# The title vLLM gives its processes (vllm/utils/system_utils.py set_process_title, with the
# default VLLM_PROCESS_NAME_PREFIX): `VLLM::EngineCore_DP0`, `VLLM::APIServer_0`.
TITLE_PREFIX = "VLLM::"
# How CPython's multiprocessing starts a child (multiprocessing/spawn.py get_command_line,
# forkserver.py): what vLLM's engine core and workers show until they take their title.
SPAWNED_CODE = (
    "from multiprocessing.spawn import spawn_main",
    "from multiprocessing.forkserver import main",
)
MAX_ANCESTORS = 8  # vLLM's tree is shallow: API server, engine core, workers
MAX_SAID = 256  # refused pids remembered, each said once


@dataclass(frozen=True, slots=True)
class Seen:
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    ppid: int = 0
    uid: int = -1  # real uid
    euid: int = -1  # effective uid


@dataclass(frozen=True, slots=True)
class ExpectedUser:
    """The uid vLLM runs as, and whose it is (said in a refusal); uid None: none is known, and
    `whose` says why and what to set."""

    uid: int | None
    whose: str


def expected_user(configured: int | None, log_path: Path | None) -> ExpectedUser:
    """`[vllm] user` when set, else the owner of the log file: the vLLM that writes a log owns
    it (the file a shell redirection or vLLM itself created as vLLM's user). Not so for a file
    another program writes (systemd's `StandardOutput=file:`, a container runtime's log: root),
    nor for a journal: then `[vllm] user` says it."""
    if configured is not None:
        return ExpectedUser(configured, "[vllm] user")
    if log_path is None:
        return ExpectedUser(None, "the log is a journal, owned by no user: set [vllm] user")
    try:
        owner = os.stat(log_path).st_uid
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return ExpectedUser(None, f"cannot see who owns {log_path} ({why}): set [vllm] user")
    return ExpectedUser(owner, f"the owner of {log_path}; set [vllm] user if vLLM runs as another")


def look(pid: int, proc_root: str = "/proc") -> Seen | None:
    """The live process `pid` (not a zombie) with its argv and uids, or None when there is none.
    Its files are read through one handle on its /proc directory, so they are all of one
    process: once it exits, a new process with its pid is not read in its place."""
    try:
        fd = os.open(f"{proc_root}/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, ValueError):
        return None
    try:
        info = parse_stat(_read(fd, "stat").decode("utf-8", "replace"))
        raw = _read(fd, "cmdline")
        status = _read(fd, "status").decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    if info is None or info.gone:
        return None
    uids = _uids(status)
    if uids is None:
        return None
    argv = tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0") if a)
    return Seen(pid, info.start_ticks, argv, info.ppid, uids[0], uids[1])


def started(pid: int, proc_root: str = "/proc") -> int | None:
    """The start time (clock ticks after boot) of the live process `pid` (not a zombie), or
    None when there is none."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb", buffering=0) as f:
            info = parse_stat(f.read(4096).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    return None if info is None or info.gone else info.start_ticks


def _read(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        return f.read(1 << 20)


def _uids(status: str) -> tuple[int, int] | None:
    """The real and effective uid of `/proc/PID/status` (`Uid:\\treal\\teffective\\tsaved\\tfs`)."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
                return int(fields[0]), int(fields[1])
            return None
    return None


def _python_words(argv: tuple[str, ...]) -> tuple[str, ...] | None:
    """After a Python interpreter and its own options: `-m MODULE ...`, `-c CODE ...` or
    `SCRIPT ...`; None when argv[0] is no Python (`python`, `python3`, `python3.12`)."""
    name = argv[0].rsplit("/", 1)[-1]
    version = name.removeprefix("python")
    if name == version or (version and not version.replace(".", "").isdigit()):
        return None
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in ("-m", "-c") or not word.startswith("-") or word == "-":
            return argv[i:]
        i += 2 if word in ("-W", "-X", "--check-hash-based-pycs") else 1
    return ()


def is_vllm(argv: tuple[str, ...]) -> bool:
    """A vLLM server's command line: `vllm serve ...` (the console script, by itself or after
    its interpreter), `python -m vllm.entrypoints...`, or the title vLLM gives its processes
    (`VLLM::EngineCore_DP0`). A word that merely names vllm elsewhere (`tail -f vllm.log`,
    `python -c ... vllm.x`) does not count, nor vLLM's clients (`vllm chat`)."""
    if not argv:
        return False
    if argv[0].startswith(TITLE_PREFIX):
        return True
    words = _python_words(argv)
    if words is None:
        words = argv  # the console script by its own name, or a launcher that is not Python
    if len(words) < 2:
        return False
    if words[0] == "-m":
        module = words[1]
        if module == CLI_MODULE:
            return len(words) > 2 and words[2] in SERVER_SUBCOMMANDS
        return module.startswith("vllm.entrypoints.")
    return words[0].rsplit("/", 1)[-1] == "vllm" and words[1] in SERVER_SUBCOMMANDS


def is_spawned_child(argv: tuple[str, ...]) -> bool:
    """A process Python's multiprocessing started (spawn, forkserver), by its command line."""
    words = _python_words(argv) if argv else None
    return (
        words is not None
        and len(words) >= 2
        and words[0] == "-c"
        and words[1].startswith(SPAWNED_CODE)
    )


def spawned_by_vllm(seen: Seen, proc_root: str = "/proc") -> bool:
    """A child multiprocessing started, with a vLLM process among its ancestors: vLLM's engine
    core or a worker before it takes its title. Any other descendant (a compiler, a shell vLLM
    runs) is not vLLM, and its short life is not vLLM's."""
    if not is_spawned_child(seen.argv):
        return False
    ppid = seen.ppid
    for _ in range(MAX_ANCESTORS):
        if ppid <= 1:
            return False
        parent = look(ppid, proc_root)
        if parent is None:
            return False
        if is_vllm(parent.argv):
            return True
        ppid = parent.ppid
    return False


def refusal(seen: Seen, user: ExpectedUser, proc_root: str = "/proc") -> str | None:
    """Why the process `seen` is not taken for vLLM's, or None when it is."""
    if user.uid is None:
        return user.whose
    if seen.uid != user.uid or seen.euid != user.uid:
        runs = f"uid {seen.uid}" + (f" (effective {seen.euid})" if seen.euid != seen.uid else "")
        return f"it runs as {runs}, vLLM as uid {user.uid} ({user.whose})"
    if not is_vllm(seen.argv) and not spawned_by_vllm(seen, proc_root):
        program = (seen.argv[0].rsplit("/", 1)[-1] if seen.argv else "")[:64] or "none"
        return f"its command line ({program} ...) is not vLLM's, and no vLLM process spawned it"
    return None


class LoggedProcess:
    """The process the log named, verified on this host; `check()` after each change.

    `user` is asked for the expected user whenever a pid is judged; `on_refused(pid, why)` hears
    once of each pid that runs here and is not taken for vLLM's."""

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        user: Callable[[], ExpectedUser],
        on_refused: Callable[[int, str], None],
    ) -> None:
        self.proc_root = proc_root
        self.user = user
        self.on_refused = on_refused
        self.seen: Seen | None = None
        # Refused pids, oldest first, with the start time and expected user they were judged
        # by: each said once, and not read whole again while the same process runs and the
        # same user is expected (a log from another pid namespace names one of this host's
        # processes at every round, for days: its stat alone tells it is that process still)
        self._refused: dict[int, tuple[int, ExpectedUser]] = {}

    def check(self, pid: int | None) -> tuple[str, Seen | None]:
        """("new", seen): `pid` is a vLLM running here, first seen now; ("gone", last): the one
        seen before is no more (exited, or its pid reused); ("same" | "unknown", None).

        A pid other than the one seen replaces it only when it passes the same check; else the
        one seen stays the one watched (a forged prefix does not hide vLLM's exit)."""
        seen = self.seen
        if pid is not None and (seen is None or pid != seen.pid):
            now = self._judge(pid)
            if now is not None:
                self.seen = now
                return "new", now
        if seen is None:
            return "unknown", None
        # Still the one seen: its pid and start time (a reused pid has another), from its stat
        # alone (asked every few seconds while vLLM serves, for days)
        if started(seen.pid, self.proc_root) != seen.start_ticks:
            self.seen = None
            return "gone", seen
        return "same", None

    def _judge(self, pid: int) -> Seen | None:
        user = self.user()
        refused = self._refused.get(pid)
        if refused is not None and refused == (started(pid, self.proc_root), user):
            return None  # the very process refused before, judged by the same user
        now = look(pid, self.proc_root)
        if now is None:
            return None  # not here: another host's, or another pid namespace's
        why = refusal(now, user, self.proc_root)
        if why is None:
            return now
        if refused is None:
            self.on_refused(pid, why)
        self._refused[pid] = (now.start_ticks, user)
        if len(self._refused) > MAX_SAID:
            del self._refused[next(iter(self._refused))]
        return None


__all__ = [
    "ExpectedUser",
    "LoggedProcess",
    "Seen",
    "expected_user",
    "is_spawned_child",
    "is_vllm",
    "look",
    "refusal",
    "spawned_by_vllm",
    "started",
]
