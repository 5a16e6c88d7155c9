"""Container runtimes' log lines, written as the runtimes write them, around real vLLM output.

- CRI (containerd, CRI-O; the kubelet reads them in /var/log/pods): the kubelet's CRI logging
  format (kubernetes/design-proposals-archive, node/kubelet-cri-logging.md; containerd
  pkg/cri/io/logger.go): `RFC3339Nano-timestamp SP stream SP tag SP content LF`, tag `F` for a
  full line and `P` for a partial one, a line longer than the runtime's buffer
  (`max_container_log_line_size`, 16384 by default) split into P pieces and a last F piece. Only
  `\\n` ends a line: tqdm's `\\r` stays in the content.
- docker's json-file driver (docs.docker.com, "JSON File logging driver"): one object a line,
  `{"log":"<the line with its \\n>","stream":"stderr","time":"<RFC3339Nano>"}`, a line over
  16 KiB split into objects whose `log` has no `\\n` but the last.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

MAX_LINE = 16384


def _lines(data: bytes) -> Iterator[tuple[bytes, bool]]:
    """(line content, ended by \\n) in the order written."""
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            yield data[pos:], False
            return
        yield data[pos:nl], True
        pos = nl + 1


def _stamp(i: int) -> str:
    # the runtime's own clock; 9 digits of fraction as containerd writes them
    return f"2026-12-01T10:{(i // 600000) % 60:02d}:{(i // 10000) % 60:02d}.{i % 10**9:09d}Z"


def cri(data: bytes, stream: str = "stderr", max_line: int = MAX_LINE) -> bytes:
    out = bytearray()
    n = 0
    for content, _ended in _lines(data):
        pieces = [content[i : i + max_line] for i in range(0, len(content), max_line)] or [b""]
        for k, piece in enumerate(pieces):
            tag = b"F" if k == len(pieces) - 1 else b"P"
            out += f"{_stamp(n)} {stream} ".encode() + tag + b" " + piece + b"\n"
            n += 1
    return bytes(out)


def _utf8_pieces(content: bytes, max_line: int) -> list[bytes]:
    """Pieces of at most max_line bytes, none cutting a character in two. (docker cuts by bytes;
    its JSON encoder then writes a cut character as U+FFFD, which these tests keep out of the
    way so that the content compares equal.)"""
    pieces, pos = [], 0
    while pos < len(content):
        end = min(pos + max_line, len(content))
        while end < len(content) and end > pos + 1 and (content[end] & 0xC0) == 0x80:
            end -= 1
        pieces.append(content[pos:end])
        pos = end
    return pieces or [b""]


def docker(data: bytes, stream: str = "stderr", max_line: int = MAX_LINE) -> bytes:
    out = bytearray()
    n = 0
    for content, ended in _lines(data):
        pieces = _utf8_pieces(content, max_line)
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            text = piece.decode("utf-8", "replace") + ("\n" if last and ended else "")
            doc = {"log": text, "stream": stream, "time": _stamp(n)}
            line = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
            for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
                line = line.replace(ch, esc)  # Go's encoding/json escapes these three
            out += line.encode() + b"\n"
            n += 1
    return bytes(out)
