"""One daemon per state directory: an exclusive lock on `STATE_DIR/lock`, held while it runs.

Two daemons on one state directory (a manual run beside the unit) would write every event twice
and overwrite each other's checkpoints. The lock is flock(2) on a file that keeps the holder's
pid (for the message only; the lock is what counts): the kernel drops it when the holder exits,
even on SIGKILL, so a stale file never keeps a daemon out. The descriptor is close-on-exec:
vLLM and the HTTP server process never hold it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "lock"


class StateDirBusy(Exception):
    """Another daemon holds the state directory; the message is one line."""


def lock_state_dir(state_dir: Path) -> int:
    """The locked descriptor (close it to release). Raises `StateDirBusy`, or OSError."""
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f" (pid {holder})" if holder.isdigit() else ""
        raise StateDirBusy(
            f"another loadwatch{who} is running with the state directory {state_dir}; "
            "one daemon per state directory (give this one --state-dir)"
        ) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
