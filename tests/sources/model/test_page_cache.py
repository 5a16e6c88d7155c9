"""The page cache of a checkpoint, as the real kernel says (mincore on a mapping): evicted files
are cold, read ones warm, and nothing but regular files is looked at."""

from __future__ import annotations

import os
from pathlib import Path

from loadwatch.daemon.sources.model.page_cache import (
    WINDOW_BYTES,
    WINDOWS,
    cache_state,
    resident_fraction,
)

SIZE = (WINDOWS + 2) * WINDOW_BYTES  # sampled in windows, not whole


def evicted(path: Path, data: bytes | None = None) -> Path:
    """`path` with `data` (a sparse file when None), written out and dropped from the cache."""
    with open(path, "wb") as f:
        if data is None:
            f.truncate(SIZE)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


def test_evicted_shards_are_cold_and_read_ones_warm(tmp_path: Path) -> None:
    files = [evicted(tmp_path / f"s{i}.safetensors", os.urandom(SIZE)) for i in range(3)]
    files.append(evicted(tmp_path / "sparse.safetensors"))  # (demo checkpoints are sparse)
    cold = resident_fraction(files)
    assert cold is not None and cold < 0.1 and cache_state(cold) == "cold"
    for f in files[:2]:
        f.read_bytes()
    part = resident_fraction(files)
    assert part is not None and 0.4 < part < 0.6  # two of four files read
    for f in files:
        f.read_bytes()
    warm = resident_fraction(files)
    assert warm is not None and warm > 0.9 and cache_state(warm) == "warm"
    # looking reads nothing: the evicted file stays cold however often it is looked at
    again = evicted(tmp_path / "again.safetensors", os.urandom(SIZE))
    for _ in range(3):
        assert resident_fraction([again]) == 0.0


def test_what_is_not_a_regular_file_is_not_looked_at(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    empty = tmp_path / "empty.safetensors"
    empty.touch()
    assert resident_fraction([fifo, empty, tmp_path / "missing.safetensors"]) is None
    assert resident_fraction([]) is None and cache_state(None) is None
