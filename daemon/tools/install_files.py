"""`loadwatch install-files DIR`: the ops files that came with the package, written out.

The wheel carries the systemd units and example configs, the Prometheus alerts and their tests,
the Grafana dashboard, the Kubernetes manifests and Containerfile, and the docs (as
`loadwatch.ops.*` package data), so an install from a wheel, with no checkout at hand, has them:

    /opt/loadwatch/bin/loadwatch install-files /opt/loadwatch/share
    install -m 0644 /opt/loadwatch/share/systemd/loadwatch.service /etc/systemd/system/

DIR gets `systemd/`, `prometheus/`, `grafana/`, `k8s/` and `docs/`. A file already there with
the same bytes is left alone; one with other bytes (edited by hand) is not overwritten unless
`--force`: exit 73 naming it, and nothing written.
"""

from __future__ import annotations

import os
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


def install_files(target: Path, *, force: bool = False) -> tuple[list[str], list[str]]:
    """Write the ops files under `target`; (written, unchanged). OSError or FileExistsError."""
    wanted = ops_files()
    written: list[str] = []
    same: list[str] = []
    differ: list[str] = []
    for rel, data in wanted.items():
        path = target / rel
        try:
            have = path.read_bytes()
        except FileNotFoundError:
            continue
        (same if have == data else differ).append(rel)
    if differ and not force:
        raise FileExistsError(f"{target / differ[0]} differs from the packaged file (--force)")
    for rel, data in wanted.items():
        if rel in same:
            continue
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # atomic: a unit is never seen half written
        written.append(rel)
    return written, same


def install_files_command(target: Path, *, force: bool) -> int:
    try:
        written, same = install_files(target, force=force)
    except FileExistsError as exc:
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
