"""The followed log misbehaves under a running daemon: it reports, keeps serving, recovers.

The daemon runs as a subprocess without the capabilities that let root read through any mode bit
(see faults.unprivileged): a directory made mode 000 is really closed to it. Each fault is put in place
while the load goes on, then taken away:

- the log's directory loses its permissions, then gets them back;
- the log is rotated and the new file is unreadable (mode 000), then readable;
- the log's directory is deleted, then created again with a new vLLM start in it;
- the log is replaced by a symlink to another file, then by a symlink loop, then by a good link;
- the log is replaced by a FIFO, then by a regular file again.

For each: the log source reads down in /metrics (and a one-line `daemon.problem` names an error,
and /healthz answers 503 naming the log source), /status still answers with what the daemon
knew, and once the cause is gone the source is up, /healthz 200, and the load's progress moves
on from where it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import append as _append
from tests.reliability.faults import load_steps, unprivileged
from tests.reliability.proc import DaemonProc, wait_for

SHARDS = 12


def _write_new(path: Path, lines: list[str], mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".new")
    tmp.write_text("".join(lines))
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Probe:
    def __init__(self, d: DaemonProc) -> None:
        self.d = d
        self.faults = 0
        self.recovered = 0
        self.seen = 0  # problem lines of the faults before

    def up(self) -> float:
        return self.d.metrics()['loadwatch_source_up{source="log"}']

    def errors(self) -> float:
        return self.d.metrics()['loadwatch_source_errors_total{source="log"}']

    def session(self) -> dict[str, Any]:
        s: dict[str, Any] = self.d.status()["session"]
        return s

    def shards(self) -> int | None:
        s = self.session()
        return s["progress"]["shards_done"] if s else None

    def problems(self) -> list[str]:
        return [str(e["error"]) for e in self.d.events() if e.get("event") == "daemon.problem"]

    def fault(self, what: str, *, problem: str | None, known: Callable[[], bool]) -> None:
        """The fault is in place: reported, and what was known is still served."""
        wait_for(lambda: self.up() == 0.0, f"{what}: the log source to read down")
        if problem is not None:
            # a line of this fault: an earlier fault's may say the same (and the source reads
            # down for a moment while a file is replaced, before the daemon met the fault)
            wait_for(
                lambda: any(problem in p for p in self.problems()[self.seen :]),
                f"{what}: a '{problem}' line",
            )
            assert all("\n" not in p and "Traceback" not in p for p in self.problems())
        self.seen = len(self.problems())
        assert known(), f"{what}: /status lost what it knew"
        assert self.d.get("/metrics")[0] == 200
        # /healthz still answers: 503 naming the log source while it cannot be read, 200 when
        # the log is only gone (as before vLLM starts)
        if problem is None:
            assert self.d.get("/healthz")[0] == 200
        else:
            wait_for(lambda: self.d.get("/healthz")[0] == 503, f"{what}: /healthz saying so")
            assert b"the log source is down" in self.d.get("/healthz")[1]
        self.faults += 1

    def recover(self, what: str, progressed: Callable[[], bool]) -> None:
        wait_for(progressed, f"{what}: reading to go on")
        wait_for(lambda: self.up() == 1.0, f"{what}: the log source to come back up")
        wait_for(lambda: self.d.get("/healthz")[0] == 200, f"{what}: /healthz 200 again")
        self.recovered += 1


@pytest.mark.slow  # bounded: see the module docstring
def test_log_faults_are_reported_served_through_and_recovered(tmp_path: Path) -> None:
    root = tmp_path
    logdir = root / "logs"
    logdir.mkdir()
    log = logdir / "vllm.log"
    steps = load_steps("/models/m", SHARDS, 7, [2, 4, 6, 8, 10])
    second = load_steps("/models/m", SHARDS, 8, [2, 4])
    _write_new(log, steps[0])
    cfg = root / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{root / 'state'}'\n"
        f"[log]\npath = '{log}'\npoll_interval_s = 0.05\n"
        "[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        "[forecast]\nstall_floor_s = 86400\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl", wrapper=unprivileged())
    d.wait_listening()
    p = Probe(d)
    try:
        wait_for(lambda: p.shards() == 2 and p.up() == 1.0, "the first two shards")

        # 1. the directory loses its permissions (the open file can still be read, but the
        #    path cannot be looked at: the follower cannot tell a rotation from growth)
        os.chmod(logdir, 0o000)
        _append(log, steps[1])
        p.fault("directory mode 000", problem="Permission denied", known=lambda: p.shards() == 2)
        os.chmod(logdir, 0o755)
        p.recover("directory mode back", lambda: p.shards() == 4)

        # 2. rotated, and the new file is unreadable to the daemon
        os.rename(log, logdir / "vllm.log.1")
        _write_new(log, steps[2], mode=0o000)
        p.fault("new file mode 000", problem="Permission denied", known=lambda: p.shards() == 4)
        os.chmod(log, 0o644)
        p.recover("new file readable", lambda: p.shards() == 6)

        # 3. the directory is deleted; a new vLLM start writes a new one
        for f in logdir.iterdir():
            f.unlink()
        logdir.rmdir()
        p.fault("directory deleted", problem=None, known=lambda: p.shards() == 6)
        logdir.mkdir()
        _write_new(log, second[0])
        p.recover(
            "directory recreated",
            lambda: p.session()["id"] == 2 and p.shards() == 2,
        )

        # 4. a symlink to another file (followed), a symlink loop, a good link again
        _write_new(logdir / "other.log", [*second[0], *second[1]])
        tmp = logdir / "link.tmp"
        tmp.symlink_to("other.log")
        os.replace(tmp, log)
        wait_for(lambda: p.shards() == 4, "the symlinked file to be read")
        assert p.up() == 1.0
        (logdir / "loop-a").symlink_to("loop-b")
        (logdir / "loop-b").symlink_to("loop-a")
        tmp.symlink_to("loop-a")
        os.replace(tmp, log)
        p.fault("symlink loop", problem="symbolic links", known=lambda: p.shards() == 4)
        _append(logdir / "other.log", second[2][:3])
        tmp.symlink_to("other.log")
        os.replace(tmp, log)
        p.recover("good link again", lambda: p.up() == 1.0)

        # 5. a FIFO where the log was (a reader that opened it would hang)
        known = p.shards()
        log.unlink()
        os.mkfifo(log)
        p.fault("FIFO", problem="not a regular file", known=lambda: p.shards() == known)
        log.unlink()
        _write_new(log, [*second[0], *second[1], *second[2]])
        p.recover("regular file again", lambda: p.session()["phase"] == "ready")
        assert p.d.get("/readyz")[0] == 200
    finally:
        code = d.stop()
    assert code == 0, d.stderr()
    assert "Traceback" not in d.stderr(), d.stderr()
    # each fault that raised an error was followed by a line saying the log reads again
    back = [e for e in d.events() if e.get("event") == "daemon.recovered"]
    assert len(back) >= 4 and {e["source"] for e in back} == {"log"}, back
    print(f"\nlog faults injected={p.faults} recovered={p.recovered} errors={p.problems()}")
