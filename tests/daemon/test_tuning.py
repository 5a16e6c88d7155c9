"""daemon/tuning.py against the kernel's own count of page faults: reading a backlog in the
follower's reads, keeping the last two chunks (as it keeps what it delivered lately), faults far
fewer pages in once glibc's malloc is told to keep read buffers in its heap."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

# One process per case (malloc's settings are the process's): 200 reads of READ_BYTES, the
# last two chunks kept, each cut at its last whole record as the follower cuts it; prints the minor
# page faults the reads took (getrusage).
READS = """
import collections, os, resource, sys
if sys.argv[2] == "tuned":
    from loadwatch.daemon.tuning import tune_process
    tune_process()
from loadwatch.daemon.sources.log.follow_read import READ_BYTES
fd = os.open(sys.argv[1], os.O_RDONLY)
kept = collections.deque(maxlen=2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    buf = os.pread(fd, READ_BYTES, 0)
    kept.append(buf[: buf.rfind(b"\\n") + 1])
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_reads_of_a_backlog_fault_few_pages_once_tuned(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    line = b"(Worker_TP0 pid=7) WARNING 11-18 11:09:40 [weight_utils.py:1398] Found k_scale\n"
    log.write_bytes(line * (2 * (1 << 20) // len(line)))

    def faults(case: str) -> int:
        argv = [sys.executable, "-c", READS, str(log), case]
        return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    plain, tuned = faults("plain"), faults("tuned")
    print(f"minor page faults for 200 reads: {plain} by default, {tuned} tuned")
    # (by default a read's buffer is mapped afresh: its pages faulted in)
    assert tuned * 10 <= plain
