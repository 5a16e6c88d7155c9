"""`loadwatch install-files DIR`: the ops files that came with the package, written out.

The wheel carries the systemd units and example configs, the Prometheus alerts and their tests,
the Grafana dashboard, the Kubernetes manifests and Containerfile, and the docs (as
`loadwatch.ops.*` package data), so an install from a wheel, with no checkout at hand, has them:

    /opt/loadwatch/bin/loadwatch install-files /opt/loadwatch/share
    install -m 0644 /opt/loadwatch/share/systemd/loadwatch.service /etc/systemd/system/

DIR gets `systemd/`, `prometheus/`, `grafana/`, `k8s/` and `docs/`. A file already there with
the same bytes is left alone; one with other bytes (edited by hand) is not overwritten unless
`--force`: exit 73 naming it, and nothing written.

Root may run it into a directory others can write, so nothing planted there is followed: a
sub-directory or a file inside DIR that is a symbolic link is refused (exit 73, one line, nothing
written), and each file is written to a temporary of a fresh name, created exclusively, synced
and renamed into place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import sys
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

EX_CANTCREAT = 73
FOLDERS = {
    "systemd": "loadwatch.ops.systemd",
    "prometheus": "loadwatch.ops.prometheus",
    "prometheus/tests": "loadwatch.ops.prometheus.tests",
    "grafana": "loadwatch.ops.grafana",
    "grafana/provisioning": "loadwatch.ops.grafana.provisioning",
    "k8s": "loadwatch.ops.k8s",
    "docs": "loadwatch.ops.docs",
}


def ops_files() -> dict[str, bytes]:
    """Relative path -> content, for every ops file the install holds."""
    out: dict[str, bytes] = {}
    for folder, package in FOLDERS.items():
        root: Traversable = files(package)
        for item in sorted(root.iterdir(), key=lambda t: t.name):
            if item.is_file() and not item.name.endswith((".py", ".pyc")):
                out[f"{folder}/{item.name}"] = item.read_bytes()
    return out


class InstallRefused(Exception):
    """A link planted inside DIR: following it would write outside (as root, anywhere)."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_dir(target: Path, folder: str, *, create: bool) -> int | None:
    """A descriptor of `target/folder`, each step inside `target` opened without following a
    link (a link is refused); None when a step is missing and `create` is off. `target` itself
    may be a link: it is the operator's choice."""
    fd = os.open(target, _DIR_FLAGS)
    where = target
    try:
        for part in folder.split("/"):
            where = where / part
            try:
                step = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, 0o755, dir_fd=fd)
                step = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, part):
                    raise InstallRefused(
                        f"{where} is a symbolic link: refusing to write through it"
                    ) from None
                raise
            os.close(fd)
            fd = step
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_existing(dir_fd: int, name: str, shown: Path) -> bytes | None:
    if _is_link(dir_fd, name):
        raise InstallRefused(f"{shown} is a symbolic link: refusing to replace it")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Write `data` as `name` atomically: a temporary of a fresh random name created with
    O_EXCL (a name planted in advance is never opened, let alone followed), written, synced,
    renamed over `name` (a rename replaces a link, never writes through it)."""
    while True:
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(tmp, flags, 0o666, dir_fd=dir_fd)  # the umask decides, as before
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def install_files(target: Path, *, force: bool = False) -> tuple[list[str], list[str]]:
    """Write the ops files under `target`; (written, unchanged). InstallRefused for a link
    inside `target`, FileExistsError for an edited file, OSError. Everything is checked before
    anything is written."""
    wanted = ops_files()
    by_folder: dict[str, list[str]] = {}
    for rel in wanted:
        by_folder.setdefault(rel.rpartition("/")[0], []).append(rel)
    same: list[str] = []
    differ: list[str] = []
    # DIR itself is the operator's choice (`/opt/loadwatch/share`: a fresh venv has none): made
    # with its parents when missing; only the steps inside it are checked for links.
    existed = os.path.lexists(target)
    for folder, rels in by_folder.items() if existed else ():
        dir_fd = _open_dir(target, folder, create=False)
        if dir_fd is None:
            continue
        try:
            for rel in rels:
                have = _read_existing(dir_fd, rel.rpartition("/")[2], target / rel)
                if have is not None:
                    (same if have == wanted[rel] else differ).append(rel)
        finally:
            os.close(dir_fd)
    if differ and not force:
        raise FileExistsError(f"{target / differ[0]} differs from the packaged file (--force)")
    written: list[str] = []
    if not existed:
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
    for folder, rels in by_folder.items():
        todo = [rel for rel in rels if rel not in same]
        if not todo:
            continue
        dir_fd = _open_dir(target, folder, create=True)
        assert dir_fd is not None
        try:
            for rel in todo:
                _write_new(dir_fd, rel.rpartition("/")[2], wanted[rel])
                written.append(rel)
            os.fsync(dir_fd)  # the renames reach the disk
        finally:
            os.close(dir_fd)
    return written, same


def install_files_command(target: Path, *, force: bool) -> int:
    try:
        written, same = install_files(target, force=force)
    except (FileExistsError, InstallRefused) as exc:
        print(f"loadwatch: {exc}", file=sys.stderr)
        return EX_CANTCREAT
    except OSError as exc:
        print(f"loadwatch: cannot write {exc.filename or target}: {exc.strerror}", file=sys.stderr)
        return EX_CANTCREAT
    for rel in written:
        print(target / rel)
    if same:
        print(f"({len(same)} unchanged)", file=sys.stderr)
    return 0
