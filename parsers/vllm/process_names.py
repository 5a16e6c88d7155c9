"""The processes a log shows, for a post-mortem's list (`loadwatch analyze`): every distinct
`(NAME ... pid=N)` prefix, found in a chunk at once (in C where _scan.c is built), each read
once. The live path never runs it: the grammar reads each record's own prefix (lines.py)."""

from __future__ import annotations

import re
from collections.abc import Callable

# A process prefix, read into its name's parts
_PREFIX_BYTES = re.compile(
    rb"\((?P<name>[A-Za-z][A-Za-z0-9_-]{0,63}+)(?: rank=(?P<rank>[0-9]{1,6}+))?"
    rb"(?: (?P<ranks>[A-Z]{1,8}+[0-9]{1,6}+(?:_[A-Z]{1,8}+[0-9]{1,6}+){0,7}+))?"
    rb" pid=[0-9]{1,10}+(?:, ip=[0-9A-Fa-f.:]{1,64}+)?\)"
)
# The same, whole: a chunk's prefixes are listed in C (`findall`), and each distinct one is read
# once (a log repeats a few prefixes on nearly every line).
_PREFIX_WHOLE = re.compile(
    rb"\([A-Za-z][A-Za-z0-9_-]{0,63}+(?: rank=[0-9]{1,6}+)?"
    rb"(?: [A-Z]{1,8}+[0-9]{1,6}+(?:_[A-Z]{1,8}+[0-9]{1,6}+){0,7}+)?"
    rb" pid=[0-9]{1,10}+(?:, ip=[0-9A-Fa-f.:]{1,64}+)?\)"
)
_native_prefixes: Callable[[bytes, int], list[bytes]] | None
try:
    from loadwatch.parsers._scan import prefixes as _native_prefixes
except ImportError:  # built without a C compiler: the regex, same names
    _native_prefixes = None
MAX_PROCESS_NAMES = 256
MAX_PREFIXES_READ = 4096  # distinct prefixes remembered as read (a process per pid: bounded)


def distinct_prefixes_py(data: bytes) -> list[bytes]:
    """Every distinct `_PREFIX_WHOLE` in `data`, in order of first appearance (_scan.c's
    `prefixes` returns the same, without a match object per line)."""
    return list(dict.fromkeys(_PREFIX_WHOLE.findall(data)))


def distinct_prefixes(data: bytes) -> list[bytes]:
    if _native_prefixes is None:
        return distinct_prefixes_py(data)
    return _native_prefixes(data, MAX_PREFIXES_READ)


class ProcessNames:
    """The distinct process prefixes of a log, in order of first appearance (bounded)."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}
        self._read: set[bytes] = set()

    def feed(self, data: bytes) -> None:
        if b" pid=" not in data or len(self.names) >= MAX_PROCESS_NAMES:
            return
        names, read = self.names, self._read
        for prefix in distinct_prefixes(data):
            if prefix in read:
                continue
            if len(read) >= MAX_PREFIXES_READ:
                read.clear()
            read.add(prefix)
            m = _PREFIX_BYTES.fullmatch(prefix)
            if m is None or len(names) >= MAX_PROCESS_NAMES:
                continue
            name = m["name"].decode()
            if m["ranks"]:
                name = f"{name}_{m['ranks'].decode()}"
            elif m["rank"]:
                name = f"{name}_rank{m['rank'].decode()}"
            names.setdefault(name, None)
