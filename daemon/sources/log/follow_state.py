"""What the parts of `LogFollower` share: its files, its place, its counters, and its health.

The follower is one object made of parts, each in its own module: reading (follower.py), noticing
rotations and truncations (follow_changes.py), finding a remembered file again (follow_place.py),
checkpoints (follow_save.py) and waking (follow_wait.py). Each part is a base class of
`LogFollower` over this state; `FollowerState.__init__` is the one place every attribute is set.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from loadwatch.daemon.sources.log.checkpoint import Checkpoint
from loadwatch.daemon.sources.log.files import FileIdentity, OpenFile, Position
from loadwatch.daemon.sources.log.generations import Generations, Since
from loadwatch.daemon.sources.log.wake import ActiveMode

if TYPE_CHECKING:
    from loadwatch.daemon.sources.log.follow_wait import Waiting

_LF, _CR = 10, 13
StartKind = Literal["fresh", "pending", "exact", "rotated", "changed", "gone"]
TAIL_BYTES = 256  # the bytes before a place that must still be there to resume at it
LEFT_KEPT = 16  # files left that are remembered, for one that comes back


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


def _first_terminator(buf: bytes) -> int:
    lf = buf.find(b"\n")
    cr = buf.find(b"\r", 0, lf if lf >= 0 else len(buf))
    return cr if cr >= 0 else lf


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


class FollowerState:
    """The follower's state (see the module docstring); its parts read and change it."""

    _waiting: Waiting  # (set by `LogFollower`)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cap_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_read_bytes: int,
        rotated_keep: int,
        split_cr: bool,
    ) -> None:
        self.path = Path(os.path.abspath(os.fspath(path)))
        self._path = str(self.path)
        self._cap = cap_bytes
        self._max_read = max_read_bytes
        # A container runtime's log (container.py) ends its lines with \n only; a \r is content.
        self._split_cr = split_cr
        self._clock = clock
        self._wall = wall_clock
        self._gens = Generations(self._path, rotated_keep)

        self._sources: list[OpenFile] = []
        self._pending: tuple[FileIdentity, int] | None = None  # a start position to look up
        self._known: list[FileIdentity] = []  # identities given before: see `know`
        self._last_end: Position | None = None  # after the last record delivered
        self._start: StartKind = "fresh"
        # after what the files that came after the checkpoint's were written (see `written_after`)
        self._since: Since | None = None
        # the checkpoint's file by its first bytes at the save, when they are more than its
        # identity holds (`Checkpoint.head`): what looking for that file looks for
        self._heads: dict[str, FileIdentity] = {}
        self._born: dict[str, int] = {}  # and its birth time at the save (`Checkpoint`)
        self._recovered: tuple[str, ...] = ()  # see `recovered`
        self._rewritten: set[str] = set()  # identities whose file was rewritten in place
        self.rewrites_total = 0  # files found rewritten in place (same first bytes, longer)
        # files left (drained after a rotation), by inode: (identity, first bytes, where we
        # were, ended in "\r", the bytes before that place), for one that comes back
        self._left: dict[tuple[int, int], tuple[str, bytes, int, bool, bytes]] = {}
        self._exists = False
        self._at_path = False
        self._backlog = False
        self._closed = False

        self._records = 0
        self._bytes = 0
        self._cuts = 0
        self._unterminated = 0
        self._rotations = 0
        self._truncations = 0
        self._checkpoints = 0
        self._errors = Errors()
        self._last_read_ts: float | None = None
        self._last_check_ts: float | None = None
        self.loaded_checkpoint: Checkpoint | None = None  # (follow_save.py loads it)

    def position(self) -> Position | None:
        """Where the next undelivered record starts; None when no file was seen yet."""
        if self._pending is not None:
            ident, offset = self._pending
            return Position(str(ident), offset)
        if not self._sources:
            return None
        src = self._sources[0]
        if src.ident is not None:
            return Position(src.ident, src.rs)
        if self._last_end is not None:
            # Nothing delivered from this file yet (new at the path, or cut back in place): after
            # the last record delivered, which names its file by its first bytes. This file may
            # be empty, and an identity of no bytes would name whatever its inode holds later.
            return self._last_end
        try:
            return Position(src.provisional_identity(self._known, src.name != self._path), src.rs)
        except OSError:
            return None

    def _fix_identity(self, src: OpenFile) -> str:
        return src.fix_identity(self._known, copy=src.name != self._path)

    def _fail(self, e: BaseException | str, *, state: bool = False) -> None:
        self._errors.fail(e, state=state)

    def _close_sources(self) -> None:
        for src in self._sources:
            src.close()
        self._sources = []

    @property
    def last_error(self) -> str | None:
        """`health().last_error`, without making the rest (asked after every read)."""
        return self._errors.last

    @property
    def file_exists(self) -> bool:
        return self._exists

    def health(self) -> FollowerHealth:
        src = self._sources[0] if self._sources else None
        waker = self._waiting.waker
        return FollowerHealth(
            path=self._path,
            mode=waker.mode if waker is not None else None,
            mode_reason=waker.reason if waker is not None else None,
            file_exists=self._exists,
            records_total=self._records,
            bytes_total=self._bytes,
            cuts_total=self._cuts,
            unterminated_total=self._unterminated,
            rotations_total=self._rotations,
            truncations_total=self._truncations,
            checkpoints_total=self._checkpoints,
            errors_total=self._errors.total,
            last_error=self._errors.last,
            last_read_ts=self._last_read_ts,
            last_check_ts=self._last_check_ts,
            file_id=src.ident if src is not None else None,
            offset=src.rs if src is not None else None,
            backlog=self._backlog,
            start=self._start,
            error_in_state=self._errors.in_state,
        )
