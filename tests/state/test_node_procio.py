"""A node's progress from the real kernel counters: a real process reads a file, ProcIoReader
reads its /proc/PID/io, and the node's progress follows it to the end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.sources.proc.io_counters import ProcIoReader
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.parsers.events import NodeLaunch

MIB = 1 << 20
SIZE = 48 * MIB

# Reads the file 4 MiB each time it is told, says how much, and stays until its stdin closes:
# the test samples after each read, so the progress is seen on its way, read by read.
READER = """
import sys
with open(sys.argv[1], "rb", buffering=0) as f:
    for _ in sys.stdin:
        print(len(f.read(4 << 20)), flush=True)
"""


def test_a_real_reader_drives_the_node_progress(tmp_path: Path) -> None:
    ckpt = tmp_path / "model-00001-of-00001.safetensors"
    with ckpt.open("wb") as f:
        f.write(os.urandom(SIZE))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(ckpt, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # from storage where it can
    os.close(fd)
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(ckpt)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        reader = ProcIoReader()
        st = LoadState().apply(
            NodeLaunch(mode="headless_tp_pp", head_address="10.0.0.1:29501"), 0.0
        )
        st = st.apply(ModelInfo(path=str(tmp_path), total_bytes=SIZE), 0.0)
        first = reader.read_many((proc.pid,))
        assert first.read_bytes is not None and first.rchar is not None
        st = st.apply(first, first.ts)
        ratios: list[float] = []
        for _ in range(SIZE // (4 * MIB) + 1):
            proc.stdin.write("read\n")
            proc.stdin.flush()
            proc.stdout.readline()  # it has read
            sample = reader.read_many((proc.pid,))
            assert sample.rchar is not None
            st = st.apply(sample, sample.ts)
            p = st.snapshot(sample.ts).node.progress  # type: ignore[union-attr]
            if p.io_ratio is not None:
                ratios.append(p.io_ratio)
            if sample.rchar - first.rchar >= SIZE:
                break
        assert ratios and ratios[-1] > 0.99, ratios[-5:]
        assert ratios == sorted(ratios) and len(set(ratios)) >= 3  # it moved, never back
        p = st.snapshot(time.time()).node.progress  # type: ignore[union-attr]
        assert p.read_bytes is not None and p.read_bytes >= SIZE
        assert p.expected_bytes == SIZE  # a headless TP/PP node with nothing else known: all
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
