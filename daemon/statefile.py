"""One JSON document of the daemon's own in the state directory (the start history, the crash
loop under way): read bounded, written whole or not at all (daemon/tools/patch_files.py's
`atomic_write`: a temporary file, fsync, rename, fsync of the directory), mode 0600 in a 0700
directory. A file that cannot be read as its document (not JSON, another format, a wrong shape,
a value out of range, larger than its bound) is set aside as `<name>.corrupt` with one
`daemon.problem` line, and the daemon goes on with none; so does one that cannot be read at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from loadwatch.daemon.tools.patch_files import atomic_write

T = TypeVar("T")


class BadDocument(ValueError):
    """What is wrong with a state file, in a few words."""


def document(data: bytes, fmt: int, what: str) -> dict[str, Any]:
    """The JSON object of a state file of format `fmt`; BadDocument otherwise."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise BadDocument(f"not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise BadDocument(f"not {what} of format {fmt}")
    return doc


def bounded_list(doc: dict[str, Any], key: str, limit: int) -> list[Any]:
    """`doc[key]`, a list of at most `limit` items; BadDocument otherwise."""
    items = doc.get(key)
    if not isinstance(items, list) or len(items) > limit:
        raise BadDocument(f"its {key} are not a list of at most {limit}")
    return items


class StateFile(Generic[T]):
    """The file `name` of a state directory, holding what `parse` reads (raising ValueError on
    a bad document); `none` is what there is without one. `what` names it in the problem lines
    (`problem` says each)."""

    def __init__(
        self,
        state_dir: Path,
        name: str,
        *,
        what: str,
        max_bytes: int,
        parse: Callable[[bytes], T],
        none: T,
        problem: Callable[[str], None],
    ) -> None:
        self.path = state_dir / name
        self._what = what
        self._max_bytes = max_bytes
        self._parse = parse
        self._none = none
        self.problem = problem

    def load(self) -> T:
        """What the file holds; `none` when there is no file, or one set aside as corrupt."""
        try:
            with self.path.open("rb") as f:
                data = f.read(self._max_bytes + 1)
        except FileNotFoundError:
            return self._none
        except OSError as e:
            self._say(f"cannot read it: {e.strerror}")
            return self._none
        try:
            if len(data) > self._max_bytes:
                raise BadDocument(f"larger than {self._max_bytes} bytes")
            return self._parse(data)
        except ValueError as e:
            aside = self.path.with_name(self.path.name + ".corrupt")
            try:
                os.replace(self.path, aside)
                self._say(f"{e}; set aside as {aside.name}")
            except OSError as oe:
                self._say(f"{e}; cannot set it aside: {oe.strerror}")
            return self._none

    def save(self, data: bytes) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write(self.path, data, 0o600)
        except OSError as e:
            self._say(f"cannot write it: {e.strerror}")

    def remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as e:
            self._say(f"cannot remove it: {e.strerror}")

    def _say(self, line: str) -> None:
        self.problem(f"{self._what} {self.path}: {line}")
