"""What the follower's parts share: its errors, its health record, and how a file is known.

`LogFollower` (follower.py) composes parts that each own their state (see its docstring); what
they have in common lives here: `FollowerError`, `FollowerHealth`, `StartKind`, `TAIL_BYTES`,
`Errors` (the errors, given to each part that can fail), `longer` and `one_line`.

Files and identity. A file is known by device + inode and a fingerprint of its first bytes (up to
`FINGERPRINT_BYTES`), written ``"dev:ino:len:hash"`` (`FileIdentity`) and carried by every chunk.
The fingerprint is taken when the first record of a file is delivered, so a file that is
truncated and grows again, or a new file that reuses an inode, is told apart. A file that an
identity given before names (the checkpoint's, or one passed to `know`: same inode, same first
bytes over that identity's length; at a rotated name, a copy with those first bytes) gets
exactly that identity again, however long the file has grown since, so identities from
different runs compare as strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from loadwatch.daemon.sources.log.files import FileIdentity
from loadwatch.daemon.sources.log.wake import ActiveMode

StartKind = Literal["fresh", "pending", "exact", "rotated", "changed", "gone"]
TAIL_BYTES = 256  # the bytes before a place that must still be there to resume at it


class FollowerError(Exception):
    """A configuration the follower cannot work with; the message is one line."""


@dataclass(frozen=True, slots=True)
class FollowerHealth:
    path: str
    mode: ActiveMode | None  # None until waiting begins (a bare read() loop has no mode)
    mode_reason: str | None  # why polling is active when inotify was wanted
    file_exists: bool
    records_total: int
    bytes_total: int  # bytes consumed: delivered plus skipped
    cuts_total: int  # records longer than the cap
    unterminated_total: int  # records delivered without terminator: their file was left
    rotations_total: int  # files switched to (rename, delete + recreate, copytruncate copies)
    truncations_total: int
    checkpoints_total: int
    errors_total: int
    last_error: str | None  # one line; None again once reading (a save, for a checkpoint) works
    last_read_ts: float | None  # wall clock, the last read that found data
    last_check_ts: float | None  # wall clock, the last read() that finished without error
    file_id: str | None  # the file being read, once a record of it was delivered
    offset: int | None  # next undelivered byte in that file
    backlog: bool  # the last read() stopped at its size bound; call again without waiting
    # how this follower began: no checkpoint yet, at it, at it in a rotated file, the path from 0
    # because the checkpoint's file was cut back below it ("changed") or is not found ("gone")
    start: StartKind
    error_in_state: bool = False  # last_error is the state directory's (a save), not the log's


def longer(file_id: str, head: str | None) -> FileIdentity | None:
    """The identity `file_id` with the first bytes `head` ("N:FP") names, when they are more
    than its own; None otherwise (or when either does not parse)."""
    n, _, fp = (head or "").partition(":")
    try:
        ident = FileIdentity.parse(file_id)
        longer = FileIdentity.parse(f"{ident.dev}:{ident.ino}:{n}:{fp}")
    except ValueError:
        return None
    return longer if longer.fp_len > ident.fp_len else None


def one_line(e: BaseException | str) -> str:
    text = str(e)
    if isinstance(e, OSError) and e.strerror:
        name = os.fsdecode(e.filename) if e.filename else ""
        if len(name) > 200:  # a path too long to show keeps its ends; the reason is kept whole
            name = f"{name[:80]}...{name[-80:]}"
        text = f"{name}: {e.strerror}" if name else e.strerror
    return " ".join(text.split())[:300]


class Errors:
    """The follower's errors: how many, the last one (one line), and whether that one is the
    state directory's (a save) rather than the log's. Each part that can fail is given it."""

    def __init__(self) -> None:
        self.total = 0
        self.last: str | None = None  # None again once reading (a save, for a save's) works
        self.in_state = False  # the last error is the state directory's: a save clears it

    def fail(self, e: BaseException | str, *, state: bool = False) -> None:
        self.total += 1
        self.last = one_line(e)
        self.in_state = state

    def read_works(self) -> None:
        """A read finished without error: a read's error is over (a save's is not)."""
        if not self.in_state:
            self.last = None

    def save_works(self) -> None:
        """A save worked: a save's error is over."""
        if self.in_state:
            self.last, self.in_state = None, False
