"""Where the log source's bytes come from: one seam, `LogInput`, and its implementations.

`LogSource` (source.py) owns resuming and exactly-once for every input: the checkpoint's
`extra`, the emit mark, the replay decision (resume.py). An input owns how the bytes arrive and
where a record is: it reads chunks of whole records of vLLM's output (`read`), says when more
may have come (`arm`), and keeps a place that can be saved and sought again (`position`,
`seek`, `where`, `know`, the checkpoint). A record's place is (file identity, byte offset) in a
file the input follows, so resuming works the same way whatever wraps vLLM's lines.

- `FileInput`: a plain log file: the follower itself (follower.py), with rotation, truncation,
  copytruncate and compressed rotated files. Nothing is added to its reads.
- `ContainerInput`: a container runtime's log file (CRI, docker's json-file): the follower with
  lines cut at `\\n` only, and the runtime's wrapping taken off (container.py) with the offsets
  kept, so a record's place is its place in the runtime's file.
- `JournalInput`: a systemd unit's journal: journalctl's entries copied into a spool file
  exactly once by the pump (journal.py), the spool followed as a plain file. `open` starts the
  pump, `close` stops it.
- `StdinInput`: standard input (`loadwatch analyze -`): spooled, decoded, into a temporary file
  read as a plain file once; deleted at `close`. It cannot resume (there is nothing to read again).

`open_input` is the one factory: `[log] input` ("auto", "file", "cri", "docker", "journal")
picks the implementation; auto goes by the journal unit, else the path's name or first line.
A new input (a pod's log through the Kubernetes API, say) is one more class here and one more
value of the key.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.checkpoint import Checkpoint
from loadwatch.daemon.sources.log.container import (
    ContainerFormat,
    ContainerLogDecoder,
    Readable,
    decode_bytes,
    resolve_format,
    spool,
)
from loadwatch.daemon.sources.log.follow_state import FollowerHealth, StartKind
from loadwatch.daemon.sources.log.follower import LogFollower, Position
from loadwatch.daemon.sources.log.journal import JournalError, JournalPump, JournalSource

if TYPE_CHECKING:  # (the daemon's loop alone runs it: `analyze` reads without asyncio)
    import asyncio

InputKind = Literal["auto", "file", "cri", "docker", "journal"]
INPUT_KINDS: tuple[InputKind, ...] = ("auto", "file", "cri", "docker", "journal")


class InputError(Exception):
    """An input that cannot be opened at all (journalctl cannot run): one line."""


class LogInput(Protocol):
    """What `LogSource` needs of where vLLM's lines come from; see the module doc."""

    path: Path  # what is read (named in the lines the source writes about reading)

    # -- reading: chunks of whole records of vLLM's output, and waiting for more
    def read(self) -> list[Chunk]: ...
    @property
    def backlog(self) -> bool: ...  # the last read stopped at its budget: more is there now
    @property
    def file_exists(self) -> bool: ...
    def arm(
        self, loop: asyncio.AbstractEventLoop, fire: Callable[[bool], None], timeout_s: float
    ) -> Callable[[], None]: ...
    def content(self, raw: bytes) -> bytes: ...  # whole lines of the input as vLLM wrote them

    # -- the place: saved in the checkpoint, sought again on a restart
    def position(self) -> Position | None: ...
    def seek(self, position: Position) -> bool: ...
    def where(self, position: Position) -> int | None: ...
    def know(self, file_id: str) -> None: ...
    @property
    def loaded_checkpoint(self) -> Checkpoint | None: ...
    def checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool: ...
    def checkpoint_due(self) -> bool: ...
    def maybe_checkpoint(self, extra: Mapping[str, Any] | None = None) -> bool: ...

    # -- what the source tells about reading
    @property
    def start(self) -> StartKind: ...
    @property
    def recovered(self) -> tuple[str, ...]: ...
    @property
    def rewrites_total(self) -> int: ...
    @property
    def rotated_keep(self) -> int: ...
    @property
    def last_error(self) -> str | None: ...
    def health(self) -> FollowerHealth: ...

    # -- life
    def open(self) -> None: ...  # start what feeds it; InputError when it cannot
    def close(self, *, checkpoint: bool = True) -> None: ...


class FileInput(LogFollower):
    """A plain log file: the follower as it is (its `read` is the hot path, untouched)."""

    def content(self, raw: bytes) -> bytes:
        return raw

    def open(self) -> None:
        return None


class ContainerInput(LogFollower):
    """A CRI or docker json-file log: the runtime's lines decoded, offsets kept (container.py)."""

    def __init__(self, path: str | os.PathLike[str], fmt: ContainerFormat, **kw: Any) -> None:
        super().__init__(path, split_cr=False, **kw)  # (a `\r` in the content ends no line)
        self.format = fmt
        self.decoder = ContainerLogDecoder(fmt, kw.get("cap_bytes", 1 << 16))

    def read(self) -> list[Chunk]:
        return self.decoder.decode(super().read())

    def content(self, raw: bytes) -> bytes:
        return decode_bytes(raw, self.format)

    def health(self) -> FollowerHealth:
        """The follower's, with the records joined from the runtime's pieces past the cap."""
        h = super().health()
        return dataclasses.replace(h, cuts_total=h.cuts_total + self.decoder.cuts)

    def open(self) -> None:
        return None


class JournalInput(FileInput):
    """A unit's journal, copied exactly once into a spool file (journal.py) that is followed."""

    def __init__(self, pump: JournalPump, **kw: Any) -> None:
        super().__init__(pump.spool_path, **kw)
        self.pump = pump
        self._started = False

    def open(self) -> None:
        try:
            self.pump.start()
        except (JournalError, OSError) as exc:
            raise InputError(f"[log] journal_unit: {exc}") from None
        self._started = True

    def close(self, *, checkpoint: bool = True) -> None:
        super().close(checkpoint=checkpoint)
        if self._started:
            self._started = False
            self.pump.stop()


class StdinInput(FileInput):
    """Standard input, spooled (decoded when a container log) into a temporary file read once."""

    def __init__(self, stream: Readable, hint: Path, **kw: Any) -> None:
        self.spool: IO[bytes] = spool(stream, hint)
        super().__init__(self.spool.name, state_dir=None, **kw)

    def close(self, *, checkpoint: bool = False) -> None:
        super().close(checkpoint=False)
        self.spool.close()  # (deletes it)


def open_input(
    kind: str,
    path: Path | None,
    *,
    state_dir: Path,
    journal: JournalSource | None = None,
    on_problem: Callable[[str], None] | None = None,
    **follow: Any,
) -> LogInput:
    """The input `[log] input` names (`kind`), not yet opened; `follow`: the follower's
    settings (state_dir for its checkpoint is `state_dir / "follower"`). auto: the journal when
    a unit is given, else what the path's name or first line says (container.py)."""
    if kind not in INPUT_KINDS:
        raise ValueError(f"unknown log input {kind!r}")
    checkpoints = state_dir / "follower"
    if kind == "journal" or (kind == "auto" and journal is not None):
        if journal is None:
            raise ValueError("the journal input needs a unit")
        pump = JournalPump(journal, state_dir, on_problem=on_problem)
        return JournalInput(pump, state_dir=checkpoints, **follow)
    if path is None:
        raise ValueError("a file input needs a path")
    fmt = resolve_format("plain" if kind == "file" else kind, path)
    if fmt == "plain":
        return FileInput(path, state_dir=checkpoints, **follow)
    return ContainerInput(path, fmt, state_dir=checkpoints, **follow)
