"""Which file system a path lies on (from the mount table), and which kinds give no change events
for writes made on other hosts: the waker (wake.py) polls those."""

from __future__ import annotations

import os
from pathlib import Path

# File systems where writes from other hosts raise no inotify event on this one.
REMOTE_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "lustre",
        "gpfs",
        "glusterfs",
        "beegfs",
        "afs",
        "9p",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
        "fuse.ceph-fuse",
        "fuse.lxcfs",
    }
)


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        c = field[i]
        octal = field[i + 1 : i + 4]
        if c == "\\" and len(octal) == 3 and all(d in "01234567" for d in octal):
            out.append(chr(int(octal, 8)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


def fs_type(path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The file-system type the path (or its nearest existing ancestor) lies on, if known."""
    p = Path(os.path.abspath(os.fspath(path)))
    while p != p.parent:
        try:
            os.stat(p)
            break
        except OSError:  # missing, or unreachable (EACCES, ENAMETOOLONG): its parent tells
            p = p.parent
    target = os.path.realpath(p)
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount = _unescape_mount(fields[4])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) >= best[0]):
            best = (len(mount), right.split()[0])
    return None if best is None else best[1]
