"""What the daemon reads of its own state files is bounded.

A checkpoint file of 256 MiB (sparse: no disk is spent) in place of the few hundred bytes a
checkpoint is: before, the daemon read all of it (62 MB -> 830 MB RSS for 300 MB). Now its peak
RSS stays within 64 MiB of a daemon started side by side on a clean state directory, one
`daemon.problem` line names the file, and the log is read from its start.
"""

from __future__ import annotations

import os
from pathlib import Path

from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from tests.reliability.proc import DaemonProc, wait_for

BIG = 256 << 20


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _start(tmp_path: Path, name: str, log: Path) -> tuple[DaemonProc, int]:
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / name), "--gpu", "none",
         "--listen", "127.0.0.1:0"],
        tmp_path / f"{name}.jsonl",
    )  # fmt: skip
    d.wait_listening()
    wait_for(lambda: b"loadwatch_log_lines_total 1.0" in d.get("/metrics")[1], "the log read")
    return d, _peak_rss(d.pid)


def test_oversized_checkpoint_is_not_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.11.0\n")
    cp = tmp_path / "big" / "follower" / checkpoint_name(log)
    cp.parent.mkdir(parents=True)
    with cp.open("wb") as f:
        f.truncate(BIG)
    clean, clean_rss = _start(tmp_path, "clean", log)
    try:
        big, big_rss = _start(tmp_path, "big", log)
        try:
            problems = [e["error"] for e in big.events() if e.get("event") == "daemon.problem"]
        finally:
            assert big.stop() == 0
    finally:
        assert clean.stop() == 0
    print(
        f"\npeak RSS: clean {clean_rss >> 20} MiB, {BIG >> 20} MiB checkpoint {big_rss >> 20} MiB"
    )
    assert big_rss < clean_rss + (64 << 20)
    assert len([p for p in problems if cp.name in p]) == 1, problems
    assert os.path.getsize(cp) <= BIG  # (left for the operator to look at, or replaced)
