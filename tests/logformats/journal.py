"""Journal files written by systemd's own tools, with real vLLM output as a unit's entries.

`systemd-journal-remote -o FILE -` reads the journal export format (systemd.io, "Journal Export
Format") and writes a real journal file, appending to one that exists; `journalctl --file FILE`
then reads it as it reads the host's journal. Each line vLLM wrote is one entry, as journald
stores a service's stdout (split at `\\n`; a `\\r` of tqdm stays in MESSAGE, which journald then
keeps as binary data).
"""

from __future__ import annotations

import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.ops.common import require

BOOT = "0123456789abcdef0123456789abcdef"


def _field(name: str, value: bytes) -> bytes:
    if b"\n" in value or b"\r" in value or any(b < 32 and b != 9 for b in value):
        return name.encode() + b"\n" + struct.pack("<Q", len(value)) + value + b"\n"
    return name.encode() + b"=" + value + b"\n"


def export(lines: Sequence[bytes], unit: str, first: int = 0) -> bytes:
    out = bytearray()
    for i, line in enumerate(lines, start=first):
        out += _field("__REALTIME_TIMESTAMP", str(1796020000000000 + i * 1000).encode())
        out += _field("__MONOTONIC_TIMESTAMP", str(5_000_000 + i * 1000).encode())
        out += _field("_BOOT_ID", BOOT.encode())
        out += _field("_SYSTEMD_UNIT", unit.encode())
        out += _field("SYSLOG_IDENTIFIER", b"python3")
        out += _field("MESSAGE", line)
        out += b"\n"
    return bytes(out)


def journal_remote() -> str:
    for path in ("/usr/lib/systemd/systemd-journal-remote", "/lib/systemd/systemd-journal-remote"):
        if Path(path).exists():
            return path
    return require("systemd-journal-remote")


def append(journal: Path, entries: bytes) -> None:
    subprocess.run(
        [journal_remote(), "-o", str(journal), "-"],
        input=entries,
        capture_output=True,
        check=True,
        timeout=60,
    )


def vllm_lines(raw: bytes) -> list[bytes]:
    """What journald makes of a service's output: one entry per line, the newline dropped."""
    return raw.split(b"\n")[:-1] if raw.endswith(b"\n") else raw.split(b"\n")
