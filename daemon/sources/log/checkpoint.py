"""Where the follower stands, kept on disk so a restart resumes exactly.

One small JSON file per followed path in the state directory. Every save writes a temporary file
next to it, fsyncs it, renames it over the old one and fsyncs the directory, so a crash leaves
either the old checkpoint or the new one, never a torn file. ``extra`` is opaque to this module:
the daemon keeps positions of its own there (such as where the current vLLM session began).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1


MAX_CHECKPOINT_BYTES = 1 << 20  # a checkpoint is a few hundred bytes; past this it is not one


def read_bounded(path: Path, limit: int) -> bytes | None:
    """The file's bytes, or None when it holds more than `limit` (never read past it)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


class CheckpointError(Exception):
    """A checkpoint could not be read or written; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: str  # the followed path, as given
    file_id: str  # identity of the file `offset` belongs to (see follower.FileIdentity)
    offset: int  # the next byte to read: the start of the first record not yet delivered
    extra: Mapping[str, Any] = field(default_factory=dict)
    saved_at: float | None = None  # epoch seconds
    # "N:HASH": the N bytes before `offset` (sha256, 16 hex digits), so a file rewritten in
    # place with the same first bytes is not resumed as if it were still ours
    tail: str | None = None
    # the modification time of the file `file_id` names, as last seen (its filesystem's clock):
    # a rotated file last written at or after it came after that file. Compared with file times
    # only, never with `saved_at`: the kernel stamps files from a coarser clock than a process
    # reads, so a file written just after a save can carry an earlier time than the save's.
    file_mtime_ns: int | None = None
    # "N:FP": the first N bytes of that file at the save (its fingerprint, as in its identity).
    # An identity is fixed when the file is first seen, maybe empty then (it names the file by
    # its inode alone); these bytes find the file again where only its content can (compressed,
    # copied), and tell a reused inode from it.
    head: str | None = None
    # that file's birth time (`birth.born_ns`): a later file given its freed inode has another
    file_born_ns: int | None = None
    # `head` of the other files the follower read and still knows (open, or left after a
    # rotation), by identity, when their identity holds fewer bytes: the file a session began
    # in (named in `extra`) is found again by them as the checkpoint's own file is
    heads: Mapping[str, str] = field(default_factory=dict)


MAX_HEADS = 64  # more is not a checkpoint of ours


def tail_digest(data: bytes) -> str:
    """`Checkpoint.tail` for the bytes just before a position."""
    return f"{len(data)}:{hashlib.sha256(data).hexdigest()[:16]}"


def checkpoint_name(path: str | os.PathLike[str]) -> str:
    """File name of the checkpoint for a followed path: stable, and safe in one directory."""
    absolute = os.path.abspath(os.fspath(path))
    digest = hashlib.sha256(absolute.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"follower-{digest}.json"


class CheckpointStore:
    """Loads and atomically saves the checkpoint of one followed path."""

    def __init__(self, state_dir: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
        self.state_dir = Path(state_dir)
        self.followed = os.fspath(path)
        self.file = self.state_dir / checkpoint_name(path)

    def load(self) -> Checkpoint | None:
        """The saved checkpoint, or ``None`` when there is none. Raises `CheckpointError`."""
        try:
            raw = read_bounded(self.file, MAX_CHECKPOINT_BYTES)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"cannot read checkpoint {self.file}: {e.strerror}") from None
        if raw is None:
            raise CheckpointError(
                f"checkpoint {self.file} is over {MAX_CHECKPOINT_BYTES} bytes: not one of ours"
            )
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
                raise ValueError("unknown format")
            file_id, offset = doc["file_id"], doc["offset"]
            extra = doc.get("extra", {})
            saved_at = doc.get("saved_at")
            tail = doc.get("tail")
            file_mtime_ns = doc.get("file_mtime_ns")
            head = doc.get("head")
            file_born_ns = doc.get("file_born_ns")
            heads = doc.get("heads", {})
            if (
                not isinstance(heads, dict)
                or len(heads) > MAX_HEADS
                or not all(isinstance(v, str) for v in heads.values())
            ):
                raise ValueError("bad heads")
            for value in (file_mtime_ns, file_born_ns):
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ValueError("bad file time")
            if head is not None and not isinstance(head, str):
                raise ValueError("bad head")
            if tail is not None and not isinstance(tail, str):
                raise ValueError("bad tail")
            if not isinstance(file_id, str) or not isinstance(offset, int) or offset < 0:
                raise ValueError("bad file_id/offset")
            if not isinstance(extra, dict):
                raise ValueError("bad extra")
            if saved_at is not None and not isinstance(saved_at, int | float):
                raise ValueError("bad saved_at")
        except (ValueError, KeyError, UnicodeDecodeError) as e:
            raise CheckpointError(f"checkpoint {self.file} is unreadable ({e})") from None
        return Checkpoint(
            path=str(doc.get("path", self.followed)),
            file_id=file_id,
            offset=offset,
            extra=extra,
            saved_at=None if saved_at is None else float(saved_at),
            tail=tail,
            file_mtime_ns=file_mtime_ns,
            head=head,
            file_born_ns=file_born_ns,
            heads=heads,
        )

    def save(self, checkpoint: Checkpoint) -> None:
        """Write atomically: temp file, fsync, rename, fsync the directory."""
        doc = {
            "version": FORMAT_VERSION,
            "path": checkpoint.path,
            "file_id": checkpoint.file_id,
            "offset": checkpoint.offset,
            "extra": dict(checkpoint.extra),
            "saved_at": checkpoint.saved_at,
        }
        if checkpoint.tail is not None:
            doc["tail"] = checkpoint.tail
        if checkpoint.file_mtime_ns is not None:
            doc["file_mtime_ns"] = checkpoint.file_mtime_ns
        if checkpoint.head is not None:
            doc["head"] = checkpoint.head
        if checkpoint.file_born_ns is not None:
            doc["file_born_ns"] = checkpoint.file_born_ns
        if checkpoint.heads:
            doc["heads"] = dict(checkpoint.heads)
        try:
            data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint extra is not JSON: {e}") from None
        tmp = self.file.with_name(f".{self.file.name}.{os.getpid()}.tmp")
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.file)
            dfd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            where = e.filename or self.file
            raise CheckpointError(f"cannot save checkpoint {where}: {e.strerror}") from None
