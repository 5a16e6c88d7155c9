"""How much of a checkpoint is in the page cache: a cold or a warm start, known before it reads.

A start whose shards are in the page cache (a restart of the same model on the same node) reads
its weights from memory, many times faster than one that reads them from storage (the first
start after a reboot, a new copy), and the two are not comparable (daemon/state/learned.py keys
the start history by it). The weights' read rate tells them apart only once they load, when
their bar's ETA has taken over; what the ETA from the first line needs is known before: the
kernel says which pages of a file are cached (`mincore(2)` on a mapping of it). A mapping that
nobody touches reads nothing: this costs a few system calls a file, and no I/O.

Only the files of a model directory the daemon was allowed to read (aftercare.py's `ModelDirs`)
are looked at; a sample of each (`WINDOWS` windows of `WINDOW_BYTES`, spread over the file) of
at most `MAX_FILES` files spread over the checkpoint.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import stat
from collections.abc import Sequence
from pathlib import Path

MAX_FILES = 32
WINDOWS = 4
WINDOW_BYTES = 1 << 20
WARM_FRACTION = 0.5  # of the pages sampled, cached: a warm start

_PAGE = mmap.PAGESIZE
_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        )
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
        _libc = libc
    return _libc


def _window_starts(size: int) -> list[int]:
    """Page-aligned starts of up to `WINDOWS` windows spread over a file of `size` bytes."""
    if size <= WINDOWS * WINDOW_BYTES:
        return [0]
    step = (size - WINDOW_BYTES) // (WINDOWS - 1)
    return sorted({(i * step) // _PAGE * _PAGE for i in range(WINDOWS)})


def file_residency(path: Path) -> tuple[int, int] | None:
    """(pages cached, pages sampled) of the file at `path`; None when it cannot be looked at."""
    libc = _c()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO in its place: no wait)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if not stat.S_ISREG(st.st_mode) or size <= 0:
            return None
        cached = sampled = 0
        for start in _window_starts(size):
            length = min(WINDOW_BYTES, size - start)
            addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
            if addr is None or addr == ctypes.c_void_p(-1).value:
                return None
            try:
                pages = (length + _PAGE - 1) // _PAGE
                vec = ctypes.create_string_buffer(pages)
                if libc.mincore(addr, length, vec) != 0:
                    return None
                cached += sum(b & 1 for b in vec.raw[:pages])
                sampled += pages
            finally:
                libc.munmap(addr, length)
        return cached, sampled
    except OSError:
        return None
    finally:
        os.close(fd)


def resident_fraction(files: Sequence[Path]) -> float | None:
    """The fraction of the sampled pages of `files` (up to `MAX_FILES` of them, spread) that
    are in the page cache; None when none could be looked at."""
    if not files:
        return None
    step = max(len(files) / MAX_FILES, 1.0)
    picked = [files[int(i * step)] for i in range(min(len(files), MAX_FILES))]
    cached = sampled = 0
    for path in picked:
        got = file_residency(path)
        if got is not None:
            cached += got[0]
            sampled += got[1]
    return cached / sampled if sampled else None


def cache_state(fraction: float | None) -> str | None:
    """The cache state the start history keys: "warm", "cold" (None: not known)."""
    if fraction is None:
        return None
    return "warm" if fraction >= WARM_FRACTION else "cold"
