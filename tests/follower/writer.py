"""A log writer in its own process, driven by a JSON plan; rotates the log the ways hosts do.

Run as ``python writer.py PATH PLAN_JSON``. Steps:
``["write", text]`` append text (one write), ``["lines", tag, first, count, batch]`` append
numbered lines, ``["wait"]`` say "waiting" on stdout and block until a line arrives on stdin, ``["sleep", s]``,
``["rotate", kind]`` with kind one of rename, copytruncate, delete, and dateext and
dateext_copytruncate (rename or copy to ``PATH-<date>``, as logrotate's ``dateext`` names them,
each rotation a later date), ``["truncate", size]``, and
``["append_file", path]`` (append a prepared file's bytes in one write).
The writer keeps one O_APPEND descriptor, as a process whose stdout is the log does, and reopens
the path after rename/delete, as a logging handler that follows rotation does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

KEEP = 5


def line(tag: str, i: int) -> bytes:
    return f"{tag} {i:07d} {'x' * (i % 23)}\n".encode()


def open_log(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)


def shift(path: str) -> None:
    """PATH.4 -> PATH.5, ..., PATH.1 -> PATH.2 (the oldest falls off)."""
    for i in range(KEEP - 1, 0, -1):
        if os.path.exists(f"{path}.{i}"):
            os.replace(f"{path}.{i}", f"{path}.{i + 1}")


def dated(path: str) -> str:
    """`PATH-<date>` for the next dateext rotation: an hour after the last one (`%Y%m%d%H`)."""
    base = os.path.basename(path) + "-"
    taken = [n for n in os.listdir(os.path.dirname(path)) if n.startswith(base)]
    return f"{path}-{2026113000 + len(taken)}"


def rotate(path: str, fd: int, kind: str) -> int:
    if kind == "dateext":
        os.close(fd)
        os.rename(path, dated(path))
        return open_log(path)
    if kind == "dateext_copytruncate":
        shutil.copyfile(path, dated(path))
        os.truncate(path, 0)
        return fd
    if kind == "rename":
        os.close(fd)
        shift(path)
        os.rename(path, f"{path}.1")
        return open_log(path)
    if kind == "copytruncate":
        shift(path)
        shutil.copyfile(path, f"{path}.1")
        os.truncate(path, 0)
        return fd
    if kind == "delete":
        os.close(fd)
        os.unlink(path)
        return open_log(path)
    raise ValueError(kind)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    path, plan = sys.argv[1], json.loads(sys.argv[2])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = open_log(path)
    for step in plan:
        op = step[0]
        if op == "write":
            write_all(fd, step[1].encode())
        elif op == "lines":
            tag, first, count, batch = step[1:]
            for start in range(first, first + count, batch):
                stop = min(first + count, start + batch)
                write_all(fd, b"".join(line(tag, i) for i in range(start, stop)))
        elif op == "wait":
            sys.stdout.write("waiting\n")
            sys.stdout.flush()
            sys.stdin.readline()
        elif op == "sleep":
            time.sleep(step[1])
        elif op == "rotate":
            fd = rotate(path, fd, step[1])
        elif op == "truncate":
            os.truncate(path, step[1])
        elif op == "append_file":
            with open(step[1], "rb") as src:
                write_all(fd, src.read())
        else:
            raise ValueError(op)
    os.close(fd)


if __name__ == "__main__":
    main()
