"""Bounded reads of a model directory's files: a checkpoint is downloaded data, so nothing in it
may hang, exhaust or crash whoever reads it.

Every JSON file of the directory (config.json, hf_quant_config.json, generation_config.json,
tokenizer_config.json, the safetensors index) is read here, and the safetensors headers
(tensors.py) parse through `parse_json`:

- Where: a name is relative, without ``..``, and the file it names, links followed, lies inside
  the directory, or, for a snapshot of the Hugging Face cache (``models--ORG--NAME/snapshots/REV``),
  inside that repository folder, whose ``blobs/`` its links point into.
- What: a regular file. It is opened non-blocking and without following a last link (the path
  is already resolved), then checked with fstat: a FIFO or a device is refused at once.
- How much: a cap per kind (`MAX_BYTES`), checked before reading; the read stops at the cap.
- What is inside: nesting at most `MAX_DEPTH` deep (checked before parsing: the json module
  recurses and fails with RecursionError somewhere near a thousand), integers within int64 (a
  longer digit string is refused before it is converted), no NaN or Infinity (nor a float that
  overflows to one), so the arithmetic on the values stays in range.

Errors: `ModelFileError`, one line that starts with the file's name. `OutOfBounds`, its subclass,
is a file refused by these bounds; the plain class is an ordinary fault (malformed JSON, not
UTF-8, unreadable). A missing file is FileNotFoundError, as open() says it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

MIB = 2**20
# Caps per kind. Real files are far below them: configs are a few KB (the largest, vision models
# with label tables, under 1 MiB); ModelOpt's exclude lists and generation configs are smaller;
# a tokenizer config may embed chat templates and a table of added tokens (a few MB); the
# safetensors index holds one entry per tensor, about 30 MB for a 1T-parameter MoE checkpoint
# with per-expert scales. The cap bounds the memory of one parse (a few times the file).
MAX_BYTES: dict[str, int] = {
    "config.json": 4 * MIB,
    "hf_quant_config.json": 4 * MIB,
    "generation_config.json": 1 * MIB,
    "tokenizer_config.json": 16 * MIB,
    "model.safetensors.index.json": 64 * MIB,
}
DEFAULT_MAX_BYTES = 4 * MIB
MAX_DEPTH = 64  # Hugging Face configs nest 4 or 5 deep
MAX_INT = 2**63 - 1  # every shape, count and byte offset fits in int64
_MAX_DIGITS = len(str(MAX_INT))
_SHOWN = 120  # a name from the directory, cut for the message
_BRACKETS = frozenset(b"[]{}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)


class ModelFileError(Exception):
    """A file of a model directory that could not be used; the message is one line."""


class OutOfBounds(ModelFileError):
    """A file refused by the bounds: not a regular file, outside the directory, over its size
    cap, nested too deep, a number out of range."""


def shown(name: str, limit: int = _SHOWN) -> str:
    """A name taken from the directory (or a path from the log), as a message may show it: one
    line, at most ``limit`` characters."""
    text = name if name.isprintable() else name.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- where --------------------------------------------------------------------------------------


def confinement(model_dir: Path) -> Path:
    """The folder a model directory's files may resolve into: the directory itself, or for a
    Hugging Face cache snapshot the repository folder holding its blobs."""
    real = Path(os.path.realpath(model_dir))
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def member(model_dir: Path, name: str, root: Path | None = None) -> Path:
    """The real path of file ``name`` of the model directory; OutOfBounds when the name or a
    link on the way leads out of ``root`` (default: ``confinement(model_dir)``)."""
    pure = PurePosixPath(name)
    if not name or "\0" in name or pure.is_absolute() or ".." in pure.parts:
        raise OutOfBounds(f"{shown(name)}: names a file outside the model directory")
    root = root if root is not None else confinement(model_dir)
    real = Path(os.path.realpath(model_dir / name))
    if not real.is_relative_to(root):
        raise OutOfBounds(f"{shown(name)}: a link to a file outside the model directory")
    return real


def open_regular(path: Path, name: str) -> int:
    """A read-only descriptor of the regular file at ``path`` (already resolved); never blocks
    on a FIFO. FileNotFoundError when absent."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the resolved path became a link since
            raise OutOfBounds(f"{shown(name)}: a link that changed while read") from None
        raise ModelFileError(f"{shown(name)}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OutOfBounds(f"{shown(name)}: not a regular file ({_kind(mode)})")
    return fd


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a file"


def read_capped(fd: int, name: str, cap: int) -> bytes:
    """All of the file at ``fd`` when it holds at most ``cap`` bytes; OutOfBounds otherwise."""
    size = os.fstat(fd).st_size
    if size > cap:
        raise OutOfBounds(f"{shown(name)}: {size} bytes, over the {cap // MIB} MiB cap")
    raw = read_upto(fd, name, cap + 1)
    if len(raw) > cap:  # it grew while read
        raise OutOfBounds(f"{shown(name)}: more than the {cap // MIB} MiB cap")
    return raw


def read_upto(fd: int, name: str, n: int) -> bytes:
    """The next ``n`` bytes at ``fd``, fewer at the end of the file."""
    chunks: list[bytes] = []
    got = 0
    try:
        while got < n:
            chunk = os.read(fd, min(n - got, 4 * MIB))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise ModelFileError(f"{shown(name)}: cannot read: {exc.strerror or exc}") from None
    return b"".join(chunks)


# -- what is inside -----------------------------------------------------------------------------


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep arrays and objects nest in ``raw`` (brackets in strings do not count): the depth,
    or any number up to ``limit`` when it is no deeper; counting stops one past ``limit``."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return 0  # cannot nest deeper than it has brackets
    # Drop escaped backslashes, then escaped quotes: every quote left opens or closes a string.
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[0::2])
    depth = deepest = 0
    for b in outside.translate(None, _NOT_BRACKETS):
        if b in b"[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def parse_json(raw: bytes, name: str) -> Any:
    """``raw`` as JSON within the bounds (module doc)."""
    if nesting_depth(raw) > MAX_DEPTH:
        raise OutOfBounds(f"{shown(name)}: arrays or objects nested deeper than {MAX_DEPTH}")

    def integer(text: str) -> int:
        digits = len(text.lstrip("-"))
        value = int(text) if digits <= _MAX_DIGITS else None  # (a long one is never converted)
        if value is None or abs(value) > MAX_INT:
            raise OutOfBounds(f"{shown(name)}: an integer of {digits} digits is out of range")
        return value

    def real(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise OutOfBounds(f"{shown(name)}: {shown(text[:24])} is not a finite number")
        return value

    def constant(text: str) -> Any:
        raise OutOfBounds(f"{shown(name)}: {text} is not a finite number")

    try:
        return json.loads(raw, parse_int=integer, parse_float=real, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ModelFileError(
            f"{shown(name)}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ModelFileError(
            f"{shown(name)}: not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    except RecursionError:  # (the depth check keeps it from happening; never a traceback)
        raise OutOfBounds(f"{shown(name)}: nested too deeply to parse") from None


def read_json(model_dir: Path, name: str, root: Path | None = None) -> Any:
    """File ``name`` of the model directory, parsed within the bounds of its kind."""
    path = member(model_dir, name, root)
    fd = open_regular(path, name)
    try:
        raw = read_capped(fd, name, MAX_BYTES.get(PurePosixPath(name).name, DEFAULT_MAX_BYTES))
    finally:
        os.close(fd)
    return parse_json(raw, name)
