"""Container log files: what vLLM wrote, out of the line format the container runtime wraps it in.

Two formats, both one line per write of the container's output, split by the runtime at 16 KiB:

- CRI (the kubelet's `/var/log/pods/NS_POD_UID/CONTAINER/N.log`, containerd and CRI-O), as the
  kubelet's CRI logging spec gives it: `TIMESTAMP STREAM TAG CONTENT\\n`, e.g.
  `2026-01-05T10:00:00.123456789Z stderr F INFO ... Starting vLLM API server`. TAG is `F` (the
  line is full) or `P` (partial: the runtime split a long line, and the next lines go on with
  it), possibly followed by more tags after `:`. The content is the bytes as written, without
  the newline, `\\r` kept (tqdm's bars).
- docker's json-file driver (`/var/lib/docker/containers/ID/ID-json.log`): one JSON object per
  line, `{"log":"...\\n","stream":"stderr","time":"2026-...Z"}`; a `log` without its final
  `\\n` is a partial line, continued by the next object.

`ContainerLogDecoder.decode` turns the follower's chunks into chunks of the content, with the
same offsets, so that resume, checkpoints and the emit mark work on the file as they do for a
plain log. The follower must cut chunks at newlines only (`split_cr=False`): a `\\r` inside the
content is not the end of a runtime line. Each runtime line becomes one chunk whose
`next_offset` is that line's end; its offset is where the content begins in the file (CRI: the
content is verbatim, so every record's offset is its place in the file) or the line's start
(docker: the content is JSON-escaped; a record's offset is its line's start plus its place in
the decoded text). A partial line's content is delivered up to its last `\\r` or `\\n`; the rest
waits for the line's continuation and is put in front of it. What waits is in memory only: a
daemon stopped in the middle of a long partial line resumes after the lines it read, so the piece
of the one record that was waiting is not read again (a record of more than 16 KiB, split by
the runtime, and a kill at that moment).

The timestamp and the stream are dropped: vLLM stamps its own lines, and no decision here may
rest on a stamp (DESIGN.md). A line that is not in the format (a file that is not a container
log after all, or a start in the middle of a line) is passed on as it is.
"""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Literal, Protocol

from loadwatch.daemon.sources.inputs import Chunk

ContainerFormat = Literal["cri", "docker"]
LogFormat = Literal["plain", "cri", "docker"]
_TERMINATORS = b"\r\n"
_STREAMS = (b"stdout", b"stderr")


def guess_format(path: Path, head: bytes = b"") -> LogFormat:
    """The format a path's name or its first line says: the kubelet's and docker's places, or
    the first line itself."""
    text = str(path)
    if "/var/log/pods/" in text or "/var/log/containers/" in text:
        return "cri"
    if text.endswith("-json.log"):
        return "docker"
    line = head.split(b"\n", 1)[0]
    if _cri_split(line) is not None:
        return "cri"
    if _docker_content(line) is not None:
        return "docker"
    return "plain"


def resolve_format(configured: str, path: Path) -> LogFormat:
    """`[log] format`: as given, or for auto what the path or its first line (if any) says."""
    if configured in ("plain", "cri", "docker"):
        return configured  # type: ignore[return-value]
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        head = b""
    return guess_format(path, head)


def _cri_split(line: bytes) -> tuple[int, bool] | None:
    """(where the content begins, whether the line is partial), or None if not a CRI line."""
    first = line.find(b" ")
    if first < 20 or not line[:4].isdigit() or line[4:5] != b"-" or b"T" not in line[:first]:
        return None
    second = line.find(b" ", first + 1)
    if second < 0 or line[first + 1 : second] not in _STREAMS:
        return None
    third = line.find(b" ", second + 1)
    tags = line[second + 1 : third if third >= 0 else len(line)]
    tag = tags.split(b":", 1)[0]
    if tag not in (b"F", b"P"):
        return None
    return (third + 1 if third >= 0 else len(line)), tag == b"P"


def _docker_content(line: bytes) -> bytes | None:
    if not line.startswith(b"{"):
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    log = doc.get("log") if isinstance(doc, dict) else None
    return log.encode("utf-8", "surrogateescape") if isinstance(log, str) else None


class ContainerLogDecoder:
    """Chunks of a CRI or docker json-file log in, chunks of the container's output out."""

    def __init__(self, fmt: ContainerFormat, cap_bytes: int = 1 << 16) -> None:
        self.format = fmt
        self._waiting = b""  # a partial line's content after its last terminator
        self._waiting_in = ""  # the file it came from
        self._waiting_at = 0  # where that content begins
        # A record the runtime split into more pieces than the cap holds (the follower's cap on
        # a plain log's record): the cap's worth is kept and the rest of the record dropped as
        # it comes, so joining costs what the pieces weigh, not their square.
        self.cap = cap_bytes
        self._over = False  # the waiting record is past the cap: its rest is being dropped
        self.lines = 0
        self.foreign = 0  # lines that were not in the format, passed on as they are
        self.cuts = 0  # records longer than the cap, cut

    def decode(self, chunks: Iterable[Chunk]) -> list[Chunk]:
        out: list[Chunk] = []
        for chunk in chunks:
            if chunk.cut:  # a line longer than the cap: not the runtime's, pass it on
                self._flush(out, chunk)
                out.append(chunk)
                continue
            self._lines(chunk, out)
        return out

    def _lines(self, chunk: Chunk, out: list[Chunk]) -> None:
        data, base = chunk.data, chunk.offset
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\n", pos)
            end = n if nl < 0 else nl + 1
            self._line(data[pos:end], base + pos, chunk.file_id, out)
            pos = end

    def _line(self, raw: bytes, at: int, file_id: str, out: list[Chunk]) -> None:
        self.lines += 1
        line = raw[:-1] if raw.endswith(b"\n") else raw
        content: bytes | None
        if self.format == "cri":
            split = _cri_split(line)
            if split is None:
                content, partial, start = None, False, at
            else:
                begin, partial = split
                content, start = line[begin:], at + begin
        else:
            content, start = _docker_content(line), at
            partial = content is not None and not content.endswith(b"\n")
            if content is not None and not partial:
                content = content[:-1]
        if content is None:
            self.foreign += 1
            self._flush_into(out, file_id, at)
            out.append(Chunk(raw, at, file_id, at + len(raw)))
            return
        end = at + len(raw)
        if self._over and self._waiting_in == file_id:
            # the rest of a record past the cap: dropped up to its end, then on as usual
            stop = _first_terminator(content) if partial else len(content)
            if stop < 0:
                return
            self._cut_record(out, file_id, start + stop + 1 if partial else end)
            content, start = content[stop + 1 :], start + stop + 1
            if not content and not partial:
                return
        elif self._waiting and self._waiting_in == file_id:
            content = self._waiting + content
            start = self._waiting_at
        self._waiting, self._waiting_in, self._over = b"", file_id, False
        if partial:
            cut = max(content.rfind(b"\n"), content.rfind(b"\r")) + 1
            content, self._waiting, self._waiting_at = content[:cut], content[cut:], start + cut
            if len(self._waiting) > self.cap:
                self._waiting, self._over = self._waiting[: self.cap], True
            if not content:
                return
        else:
            content += b"\n"
        out.append(Chunk(content, start, file_id, end))

    def _cut_record(self, out: list[Chunk], file_id: str, next_offset: int) -> None:
        """The record past the cap ends: its first `cap` bytes, marked cut (the follower's way)."""
        self.cuts += 1
        out.append(Chunk(self._waiting + b"\n", self._waiting_at, file_id, next_offset, cut=True))
        self._waiting, self._over = b"", False

    def _flush(self, out: list[Chunk], chunk: Chunk) -> None:
        self._flush_into(out, chunk.file_id, chunk.offset)

    def _flush_into(self, out: list[Chunk], file_id: str, at: int) -> None:
        """A partial line that the next line does not continue: it ends there."""
        if self._over and self._waiting_in == file_id:
            self._cut_record(out, file_id, at)
            return
        self._over = False
        if self._waiting and self._waiting_in == file_id:
            piece = self._waiting + b"\n"
            out.append(Chunk(piece, max(at - len(piece), 0), file_id, at))
        self._waiting = b""


def _first_terminator(data: bytes) -> int:
    """Where the first `\n` or `\r` of `data` is, -1 when none."""
    nl, cr = data.find(b"\n"), data.find(b"\r")
    return nl if cr < 0 else cr if nl < 0 else min(nl, cr)


def decode_bytes(data: bytes, fmt: LogFormat) -> bytes:
    """A whole log's content at once: the same decoding, offsets dropped."""
    out = io.BytesIO()
    decode_stream(io.BytesIO(data), out, fmt)
    return out.getvalue()


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def decode_stream(src: Readable, dst: IO[bytes], fmt: LogFormat, block: int = 1 << 20) -> int:
    """Copy `src` to `dst` decoded (analyze and events read a container log, or stdin, this
    way); bounded memory. Returns the bytes read."""
    decoder = ContainerLogDecoder(fmt) if fmt != "plain" else None
    carry = b""
    total = 0
    while True:
        data = src.read(block)
        total += len(data)
        if not data:
            break
        if decoder is None:
            dst.write(data)
            continue
        data = carry + data
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        for c in decoder.decode([Chunk(data[:cut], total, "", total + cut)]):
            dst.write(c.data)
    if decoder is not None:
        chunks = decoder.decode([Chunk(carry + b"\n", total, "", total)]) if carry else []
        for c in chunks:
            dst.write(c.data)
        if decoder._waiting:  # a partial line the log ends in
            dst.write(decoder._waiting + b"\n")
    return total


def spool(src: Readable, path_hint: Path, fmt: LogFormat | Literal["auto"] = "auto") -> IO[bytes]:
    """`src` (stdin, or a container log) decoded into a named temporary file, deleted when
    closed: what a reader that wants a file (the follower) reads instead."""
    head = src.read(SNIFF_BYTES) if fmt == "auto" else b""
    chosen: LogFormat = guess_format(path_hint, head) if fmt == "auto" else fmt
    tmp = tempfile.NamedTemporaryFile(prefix="loadwatch-log-", suffix=".log")  # noqa: SIM115
    decode_stream(_Prepend(head, src), tmp, chosen)
    tmp.flush()
    return tmp


def spool_if_container(source: Path, hint: Path) -> IO[bytes] | None:
    """A container log's content in a temporary file; None for a plain log (read as it is)."""
    with open(source, "rb") as fh:
        fmt = guess_format(hint, fh.read(SNIFF_BYTES))
        if fmt == "plain":
            return None
        fh.seek(0)
        return spool(fh, hint, fmt)


SNIFF_BYTES = 64 * 1024


class _Prepend(io.RawIOBase):
    """`head` then the rest of `src`: a stream that was sniffed, read from its start."""

    def __init__(self, head: bytes, src: Readable) -> None:
        self._head = head
        self._src = src

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self._head:
            out, self._head = self._head, b""
            return out
        return self._src.read(n)
