"""Reading records out of an open file: `RecordReader`.

It reads with `pread` from the start of the first undelivered record, handing over everything up
to the last terminator (``\\n`` or ``\\r``, found with `rfind`; no per-record work). A read is of
``READ_BYTES`` (at most ``max_read_bytes``, at least ``cap_bytes``) when the C scanner can tell
the longest record in it in one pass; one that holds a record of the cap or more (its terminator
not counted) is taken as a read of ``cap_bytes`` at the same place would be, which is what every
read is without the C scanner (a backlog then costs a `pread`, and a join, per ``cap_bytes``). A
partial record at end of file stays in the file and is read again next time. A read of
``cap_bytes`` with no terminator is a record longer than the cap: its first ``cap_bytes`` are
kept, the rest is skipped read by read without buffering, and once its terminator arrives it is
delivered alone as ``head + b"\\n"`` with ``cut=True``. A record left without its terminator in a
file we leave is delivered with ``b"\\n"`` appended and ``cut=True`` (counted as unterminated).
After every read it asks the `FileSet` whether the file was replaced under it (a copytruncate
while a backlog is read).
"""

from __future__ import annotations

import os

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.files import OpenFile
from loadwatch.daemon.sources.log.follow_files import FileSet
from loadwatch.parsers.scan import NATIVE, count_records, long_record

_LF, _CR = 10, 13
READ_BYTES = 256 * 1024  # a read's size, with the C scanner (a backlog in few reads)


def _first_terminator(buf: bytes) -> int:
    lf = buf.find(b"\n")
    cr = buf.find(b"\r", 0, lf if lf >= 0 else len(buf))
    return cr if cr >= 0 else lf


class RecordReader:
    """Chunks of whole records out of the files of a `FileSet`, and what was read in all."""

    def __init__(self, files: FileSet, *, cap_bytes: int, split_cr: bool, read_bytes: int) -> None:
        """`read_bytes`: a read's size (at least `cap_bytes`) where the C scanner is built."""
        self._files = files
        self._cap = cap_bytes
        self._read = max(read_bytes, cap_bytes) if NATIVE else cap_bytes
        # A container runtime's log (container.py) ends its lines with \n only; a \r is content.
        self._split_cr = split_cr
        self.records = 0
        self.bytes = 0  # consumed: delivered plus skipped
        self.cuts = 0  # records longer than the cap
        self.unterminated = 0  # records delivered without terminator: their file was left

    def drain(self, src: OpenFile, out: list[Chunk], budget: int) -> tuple[int, bool]:
        """Read `src` to its end, or until another read could pass `budget`; returns the budget
        left and whether it stopped there (a backlog)."""
        fd, cap, want, pread = src.fd, self._cap, self._read, os.pread
        while True:
            if budget < want:
                return budget, True
            if src.skipping:
                buf = pread(fd, cap, src.skip_pos)
                if not buf:
                    return budget, False
                if src.prefix and pread(fd, len(src.prefix), 0) != src.prefix:
                    if self._files.replaced_while_reading(src):
                        return budget, False
                    continue
                t = _first_terminator(buf) if self._split_cr else buf.find(b"\n")
                if t < 0:
                    src.skip_pos += len(buf)
                    self.bytes += len(buf)
                    budget -= len(buf)
                    if len(buf) < cap:
                        return budget, False
                    continue
                end = src.skip_pos + t + 1
                self.bytes += t + 1
                budget -= t + 1
                ident = src.ident or self._files.fix_identity(src)
                out.append(Chunk(src.head + b"\n", src.rs, ident, end, True))
                self.cuts += 1
                self.records += 1
                src.cr_end = buf[t] == _CR
                src.rs, src.skipping, src.head = end, False, b""
                src.forget()  # a cut record is not the file's bytes
                continue
            rs = src.rs
            buf = pread(fd, want, rs)
            n = len(buf)
            if n == 0:
                return budget, False
            if src.prefix and pread(fd, len(src.prefix), 0) != src.prefix:
                if self._files.replaced_while_reading(src):
                    return budget, False
                continue
            full = want  # what a read that did not reach the end of the file returns
            if n > cap and long_record(buf, cap, self._split_cr):
                buf, n, full = buf[:cap], cap, cap  # as a read of the cap here would be
            last = buf.rfind(b"\n")
            cr = buf.rfind(b"\r", last + 1) if self._split_cr else -1
            if cr > last:
                last = cr
            if last < 0:  # (then the read was of the cap: a longer one holds a terminator)
                if n < full:  # a partial record at the end: it stays in the file until whole
                    return budget, False
                src.skipping, src.head, src.skip_pos = True, buf, rs + n
                self.bytes += n
                budget -= n
                continue
            size = last + 1
            data = buf if size == n else buf[:size]
            out.append(
                Chunk(data, rs, src.ident or self._files.fix_identity(src), rs + size, False)
            )
            src.remember(rs, data)
            src.rs = rs + size
            self.bytes += size
            budget -= size
            records = count_records(data)
            if src.cr_end and data[0] == _LF:
                records -= 1
            src.cr_end = data[-1] == _CR
            self.records += records
            if n < full:
                return budget, False

    def finish(self, src: OpenFile, out: list[Chunk]) -> int | None:
        """A file we moved past, drained: deliver an unterminated last record. Returns where
        reading it ended, or None when it grew since the drain (drain it again)."""
        start = src.skip_pos if src.skipping else src.rs
        tail = os.pread(src.fd, self._cap, start)
        if _first_terminator(tail) >= 0 or len(tail) == self._cap:
            return None
        rs = src.rs
        if src.skipping or tail:
            ident = src.ident or self._files.fix_identity(src)
            end = start + len(tail)
            data = src.head if src.skipping else tail
            out.append(Chunk(data + b"\n", src.rs, ident, end, True))
            self.bytes += len(tail)
            self.records += 1
            if src.skipping:
                self.cuts += 1
            else:
                self.unterminated += 1
            rs = end
        return rs
