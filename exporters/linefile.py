"""Whole lines to a regular file: a write that fails part way leaves no half line behind.

The kernel may take the first part of a write and refuse the rest: a file-size limit
(`ulimit -f`, RLIMIT_FSIZE) takes the bytes up to the limit and then says EFBIG, a disk that
fills mid-write says ENOSPC. Python's buffered files keep or drop the rest as it comes, so a
reader of a JSON-lines log would find a torn last line, or the next line glued to it. Here lines
go out in unbuffered writes; when one fails part way, the part of a line it wrote is cut off
again (the file truncated back to where the line began, which a size limit and a full disk both
allow), and the lines it wrote whole stay.
Where even that fails, the next line written starts with a newline, so only the fragment is
unreadable. The same holds for a torn line an earlier writer left at the end of the file.
"""

from __future__ import annotations

import fcntl
import os


class LineFile:
    def __init__(self, fd: int, *, own: bool) -> None:
        """`fd`: a regular file, open for writing (O_APPEND or at its current offset);
        `own`: closed by `close()`."""
        self.fd = fd
        self._own = own
        self._check_end = True  # the file may end in a fragment: looked at before the next line

    def write(self, lines: bytes) -> None:
        """Write `lines` (each ending in a newline), or raise OSError with those the kernel
        took whole written and no part of another left."""
        if self._check_end:
            lines = self._after_fragment(lines)
        done = 0
        try:
            while done < len(lines):
                done += os.write(self.fd, lines[done:])
        except OSError:
            part = done - (lines.rfind(b"\n", 0, done) + 1)  # of a line the kernel took in part
            if part:
                self._cut(part)
            raise

    def _after_fragment(self, line: bytes) -> bytes:
        """`line`, after a newline when what precedes it is a fragment."""
        if fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_APPEND:
            end = os.fstat(self.fd).st_size  # where the next write goes
        else:
            end = os.lseek(self.fd, 0, os.SEEK_CUR)
        self._check_end = False
        if end > 0 and os.pread(self.fd, 1, end - 1) != b"\n":
            return b"\n" + line
        return line

    def _cut(self, written: int) -> None:
        """Take back the `written` bytes of a line the kernel took in part."""
        try:
            begin = os.lseek(self.fd, 0, os.SEEK_CUR) - written
            os.ftruncate(self.fd, begin)
            os.lseek(self.fd, begin, os.SEEK_SET)
        except OSError:
            self._check_end = True

    def close(self) -> None:
        if self._own:
            os.close(self.fd)
