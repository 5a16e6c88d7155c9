"""`loadwatch install-files DIR` run by root into a directory others can write: links planted
there (at a temporary name, as a sub-directory, as a target file) never make it write outside.
Each case runs the installed command line and checks that a file outside is unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LOADWATCH = Path(sys.executable).with_name("loadwatch")
KEEP = b"outside: must stay as it is\n"


def install(target: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOADWATCH), "install-files", str(target), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.umask(0o022),  # the files' mode follows the umask, as `install`
    )


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "victim").write_bytes(KEEP)
    (d / "loadwatch.service").write_bytes(KEEP)
    return d


def test_a_link_at_the_old_temporary_name_is_not_followed(tmp_path: Path, outside: Path) -> None:
    target = tmp_path / "share"
    (target / "systemd").mkdir(parents=True)
    planted = target / "systemd" / ".loadwatch.service.tmp"
    planted.symlink_to(outside / "victim")
    r = install(target)
    assert r.returncode == 0, r.stderr
    assert (outside / "victim").read_bytes() == KEEP
    unit = target / "systemd" / "loadwatch.service"
    assert not unit.is_symlink() and b"ExecStart" in unit.read_bytes()
    assert oct(unit.stat().st_mode & 0o777) == "0o644"
    leftovers = [p.name for p in (target / "systemd").iterdir() if p.name.startswith(".")]
    assert leftovers == [planted.name]  # no temporary of ours is left behind


@pytest.mark.parametrize("force", [False, True])
def test_a_linked_sub_directory_is_refused(tmp_path: Path, outside: Path, force: bool) -> None:
    target = tmp_path / "share"
    target.mkdir()
    (target / "systemd").symlink_to(outside)
    (outside / "loadwatch.service").unlink()  # absent: the old code wrote it, with no --force
    r = install(target, *(["--force"] if force else []))
    assert r.returncode != 0 and r.stdout == "", r.stdout
    assert r.stderr.startswith("loadwatch: ") and r.stderr.count("\n") == 1, r.stderr
    assert "symbolic link" in r.stderr and str(target / "systemd") in r.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == KEEP
    assert sorted(p.name for p in target.iterdir()) == ["systemd"]  # nothing else written


def test_a_linked_target_file_is_refused_even_with_force(tmp_path: Path, outside: Path) -> None:
    target = tmp_path / "share"
    (target / "systemd").mkdir(parents=True)
    link = target / "systemd" / "loadwatch.service"
    link.symlink_to(outside / "loadwatch.service")
    for flags in ((), ("--force",)):
        r = install(target, *flags)
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert "symbolic link" in r.stderr and str(link) in r.stderr
        assert link.is_symlink() and (outside / "loadwatch.service").read_bytes() == KEEP
    assert not (target / "prometheus").exists()  # refused before anything was written


def test_the_target_itself_may_be_a_link(tmp_path: Path) -> None:
    """DIR is the operator's choice (/opt/loadwatch/share -> a versioned directory)."""
    real = tmp_path / "share-0.1.0"
    real.mkdir()
    (tmp_path / "share").symlink_to(real)
    r = install(tmp_path / "share")
    assert r.returncode == 0, r.stderr
    assert (real / "systemd" / "loadwatch.service").is_file()
    again = install(tmp_path / "share")
    assert again.returncode == 0 and again.stdout == "" and "unchanged" in again.stderr


def test_a_directory_that_does_not_exist_yet_is_made(tmp_path: Path) -> None:
    """The README's `install-files /opt/loadwatch/share`: the venv has no share/ before it."""
    target = tmp_path / "opt" / "loadwatch" / "share"
    result = install(target)
    assert result.returncode == 0, result.stderr
    assert (target / "systemd" / "loadwatch.service").is_file()
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)
