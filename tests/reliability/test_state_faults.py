"""The state directory fills up, then the daemon's files hit a size limit: it reports, keeps
serving, and recovers once the cause goes.

- disk full: the state directory (checkpoints, emit mark, the event log file) is a 512 KiB
  tmpfs, filled to the last byte by the test while the load goes on, then emptied;
- file-size limit: RLIMIT_FSIZE of the running daemon lowered below the size of its files with
  prlimit (every write past it fails with EFBIG), then raised again.

Meanwhile the console (a pipe, which neither fault reaches) carries a one-line problem report,
/status keeps the load's progress, the log source's health says what happened, and afterwards
checkpoints and the event log file are written again.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import resource
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.exporters.eventlog import EventLog
from tests.helpers import append as _append
from tests.reliability.faults import load_steps
from tests.reliability.proc import DaemonProc, wait_for

SHARDS = 12
CHECKPOINT_WAIT_S = 15.0  # checkpoints are saved every 5 s while the log moves


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> int:
    """Write a file until the file system is full; its size."""
    n = 0
    with path.open("wb", buffering=0) as f:
        chunk = b"\0" * 4096
        while True:
            try:
                n += f.write(chunk) or 0
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        for small in (512, 64, 1):
            try:
                while True:
                    n += f.write(b"\0" * small) or 0
            except OSError:
                pass
    return n


def _about(lines: list[str], word: str) -> bool:
    return any(word in line for line in lines)


class Trickle(threading.Thread):
    """vLLM is never quiet for long: a request line every 0.3 s keeps the daemon reading (and so
    checkpointing, which it does after reads, every 5 s)."""

    def __init__(self, log: Path) -> None:
        super().__init__(daemon=True)
        self.log = log
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.wait(0.3):
            n += 1
            _append(
                self.log,
                [f'(APIServer pid=9) INFO:     127.0.0.1:{n} - "GET /v1/models HTTP/1.1" 200 OK\n'],
            )


def test_a_line_that_fits_the_last_block_of_a_full_disk_is_no_recovery(tmp_path: Path) -> None:
    """A full disk still takes a few lines into the event log file's last, partly used block:
    written, but the disk is full all the same, so the event log is not said to be back."""
    with tmpfs(tmp_path / "fs", "64k") as fs:
        path = fs / "events.jsonl"
        log = EventLog(io.StringIO(), path, console=False, stdout="none")
        log.emit("first", pad="x" * 100)
        fill(fs / "filler")
        log.emit("big", pad="x" * 8192)  # more than the block holds: refused
        assert log.last_error is not None and "No space left" in log.last_error
        log.emit("small")
        assert b'"small"' in path.read_bytes()  # it fitted...
        assert log.last_error is not None  # ...on a disk still full
        (fs / "filler").unlink()
        log.emit("after")
        assert log.last_error is None
        log.close()


@pytest.mark.slow  # bounded: see the module docstring
def test_disk_full_then_file_size_limit_on_the_state_directory(tmp_path: Path) -> None:
    steps = load_steps("/models/m", SHARDS, 11, [2, 4, 6, 8])
    log = tmp_path / "vllm.log"
    log.write_text("".join(steps[0]))
    with tmpfs(tmp_path / "state", "512k") as state:
        events = state / "events.jsonl"
        cfg = tmp_path / "loadwatch.toml"
        cfg.write_text(
            f"state_dir = '{state}'\nevents_file = '{events}'\n"
            f"[log]\npath = '{log}'\npoll_interval_s = 0.05\n"
            "[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
            "[forecast]\nstall_floor_s = 86400\n"
        )
        d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
        d.wait_listening()
        trickle = Trickle(log)
        trickle.start()
        checkpoint = state / "follower" / checkpoint_name(log)

        def shards() -> int:
            return int(d.status()["session"]["progress"]["shards_done"])

        def log_up() -> float:
            return d.metrics()['loadwatch_source_up{source="log"}']

        def problems(word: str) -> list[str]:
            return [
                str(e["error"])
                for e in d.events()
                if e.get("event") == "daemon.problem" and word in str(e.get("error"))
            ]

        def file_events() -> list[dict[str, object]]:
            return [json.loads(x) for x in events.read_text().splitlines() if x.strip()]

        try:
            wait_for(lambda: shards() == 2 and checkpoint.exists(), "a first checkpoint", 20)

            # -- disk full ---------------------------------------------------------------
            filler = state / "filler"
            fill(filler)
            saved = checkpoint.read_bytes()
            _append(log, steps[1])
            wait_for(lambda: shards() == 4, "the load to go on while the disk is full")
            wait_for(
                lambda: _about(problems("cannot write the event log"), "No space left on device"),
                "a problem line about the event log on the full disk",
            )
            wait_for(
                lambda: _about(problems("cannot save checkpoint"), "No space left on device"),
                "a problem line about the checkpoint on the full disk",
                CHECKPOINT_WAIT_S,
            )
            # the metric follows with the next publish to the HTTP process
            wait_for(
                lambda: log_up() == 0.0, "the log source down: its checkpoints cannot be saved"
            )
            assert checkpoint.read_bytes() == saved  # the old one is whole, no temp left behind
            assert (
                sorted(p.name for p in checkpoint.parent.iterdir() if p.name.startswith(".")) == []
            )
            assert d.get("/healthz")[0] == 200
            filler.unlink()
            _append(log, steps[2])
            wait_for(lambda: shards() == 6, "the load to go on after the disk emptied")
            wait_for(lambda: log_up() == 1.0, "the log source up again", CHECKPOINT_WAIT_S)
            assert checkpoint.read_bytes() != saved
            wait_for(
                lambda: any(e.get("done") == 6 for e in file_events()),
                "the event log file written again",
            )

            # -- file-size limit ---------------------------------------------------------
            limit = 100  # below the checkpoint's size and the event log's
            resource.prlimit(d.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
            saved = checkpoint.read_bytes()
            _append(log, steps[3])
            wait_for(lambda: shards() == 8, "the load to go on past the size limit")
            wait_for(
                lambda: _about(problems("cannot write the event log"), "File too large"),
                "a problem line about the event log past the limit",
            )
            wait_for(
                lambda: _about(problems("cannot save checkpoint"), "File too large"),
                "a problem line about the checkpoint past the limit",
                CHECKPOINT_WAIT_S,
            )
            wait_for(lambda: log_up() == 0.0, "the log source down past the limit")
            assert checkpoint.read_bytes() == saved
            resource.prlimit(
                d.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
            _append(log, steps[4])
            wait_for(lambda: d.status()["phase"] == "ready", "ready after the limit is lifted")
            wait_for(lambda: log_up() == 1.0, "the log source up again", CHECKPOINT_WAIT_S)
            wait_for(
                lambda: any(
                    e.get("event") == "transition.phase" and e.get("phase_to") == "ready"
                    for e in file_events()
                ),
                "the event log file written again",
            )
        finally:
            trickle.stop.set()
            trickle.join()
            code = d.stop()
        assert code == 0, d.stderr()
        assert "Traceback" not in d.stderr(), d.stderr()
        recovered = [e.get("source") for e in d.events() if e.get("event") == "daemon.recovered"]
        assert recovered.count("log") == 2 and recovered.count("eventlog") == 2, recovered
        print(f"\nstate faults: {problems('')}")
        os.sync()
