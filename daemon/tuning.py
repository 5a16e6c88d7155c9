"""What the interpreter and the C allocator are told: at start (`tune_process`), settings for
reading a backlog of many MiB (a restart's catch-up, `analyze` of a day's log) in reads of
256 KiB (sources/log/follow_read.py); once the daemon runs (`tune_running_daemon`), for the
days it follows a serving vLLM.

- The garbage collector runs every 50,000 allocations, not 700: few of a record's objects are
  in a cycle, and collecting every 700 took 5-6% of a catch-up. Once the daemon runs, what
  exists then (modules, configuration) lives as long as the process and is kept out of every
  collection, and young objects are collected every 20,000 (an event burst makes many
  short-lived ones).
- glibc's malloc keeps reads' buffers in its heap. By default a read's buffer, over its mmap
  threshold, was mapped afresh for a read (its pages faulted in zeroed, unmapped once the chunk
  was let go), and the heap gave back what it freed at its top: a catch-up of a serving log
  spent about as long in those page faults as in reading the file. Buffers under 8 MiB now
  come from the heap, which keeps up to 16 MiB unused for the next reads (a round reads at
  most `max_read_bytes`, 4 MiB by default). A C library without `mallopt` keeps its defaults.
"""

from __future__ import annotations

import ctypes
import gc

GC_THRESHOLD = 50_000
# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 8 << 20
TRIM_THRESHOLD_BYTES = 16 << 20


def tune_process() -> None:
    gc.set_threshold(GC_THRESHOLD)
    try:
        mallopt = ctypes.CDLL(None).mallopt  # (the process's own C library)
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)


def tune_running_daemon() -> None:
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
