"""`loadwatch patch-model` on a Hugging Face cache snapshot, where each file is a relative link
into the repository's `blobs/` (`snapshots/HASH/config.json -> ../../blobs/SHA`) and a blob can
be shared by several snapshots. The patch replaces only the links of the files it changes, with
regular files; no blob is ever written; `--revert` puts the very links back.

Each case runs the installed `loadwatch` command on a tree of real links built here."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.tools.patch import BACKUP_SUFFIX
from tests.supervisor.modeldirs import MODELS

LOADWATCH = Path(sys.executable).with_name("loadwatch")
FIXTURE = MODELS / "kimi-k25-nvfp4"


def loadwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LOADWATCH), *args], capture_output=True, text=True, timeout=60, check=False
    )


def hf_cache(root: Path, revisions: tuple[str, ...]) -> Path:
    """`hub/models--ORG--NAME` as huggingface_hub lays it out: every file of the fixture once in
    blobs/ (named by its hash), each revision's snapshot a directory of relative links to them."""
    repo = root / "hub" / "models--nvidia--Kimi-K2.5-NVFP4"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revisions[0])
    for src in sorted(FIXTURE.iterdir()):
        data = src.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.chmod(repo / "blobs" / blob, 0o644)
        for rev in revisions:
            snap = repo / "snapshots" / rev
            snap.mkdir(parents=True, exist_ok=True)
            (snap / src.name).symlink_to(f"../../blobs/{blob}")
    return repo


def tree(repo: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under the repository: a link's own text, a file's bytes."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for p in sorted(repo.rglob("*")):
        rel = str(p.relative_to(repo))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", p.read_bytes())
    return out


def test_a_snapshot_of_links_is_patched_without_touching_a_blob_and_reverted_exactly(
    tmp_path: Path,
) -> None:
    repo = hf_cache(tmp_path, ("a" * 40, "b" * 40))  # two revisions share every blob
    snap, other = repo / "snapshots" / ("a" * 40), repo / "snapshots" / ("b" * 40)
    before = tree(repo)
    blobs = {k: v for k, v in before.items() if k.startswith("blobs/")}
    assert read_model_dir(snap).checkpoint_kv_dtype == "fp8"

    r = loadwatch("patch-model", str(snap), "--drop-fp8-kv-cache")
    assert r.returncode == 0, r.stderr
    after = tree(repo)
    assert {k: v for k, v in after.items() if k.startswith("blobs/")} == blobs  # byte for byte
    assert {k: v for k, v in after.items() if k.startswith(f"snapshots/{'b' * 40}")} == {
        k: v for k, v in before.items() if k.startswith(f"snapshots/{'b' * 40}")
    }  # the other revision, on the same blobs, still declares its FP8 KV cache
    assert read_model_dir(other).checkpoint_kv_dtype == "fp8"
    assert read_model_dir(snap).checkpoint_kv_dtype is None  # what vLLM reads there is patched
    for name in ("config.json", "hf_quant_config.json"):
        assert not (snap / name).is_symlink() and (snap / name).is_file(), name
        assert oct((snap / name).stat().st_mode & 0o777) == oct(0o644)  # the blob's mode
        backup = snap / (name + BACKUP_SUFFIX)
        assert (
            backup.is_symlink() and os.readlink(backup) == before[f"snapshots/{'a' * 40}/{name}"][1]
        )
    untouched = [p.name for p in snap.iterdir() if p.is_symlink() and BACKUP_SUFFIX not in p.name]
    assert sorted(untouched) == sorted(
        n for n in os.listdir(FIXTURE) if n not in ("config.json", "hf_quant_config.json")
    )  # only the links of the files that changed were replaced

    r = loadwatch("patch-model", str(snap), "--revert")
    assert r.returncode == 0, r.stderr
    assert tree(repo) == before  # the links (their text) and the blobs, exactly as they were
    assert read_model_dir(snap).checkpoint_kv_dtype == "fp8"


def test_a_second_patch_changes_nothing_and_the_revert_dry_run_writes_nothing(
    tmp_path: Path,
) -> None:
    repo = hf_cache(tmp_path, ("c" * 40,))
    snap = repo / "snapshots" / ("c" * 40)
    assert loadwatch("patch-model", str(snap), "--drop-fp8-kv-cache").returncode == 0
    patched = tree(repo)
    r = loadwatch("patch-model", str(snap), "--drop-fp8-kv-cache")
    assert r.returncode == 0 and "nothing to change" in r.stdout, r.stdout + r.stderr
    r = loadwatch("patch-model", str(snap), "--revert", "--dry-run")
    assert r.returncode == 0 and "would restore" in r.stdout, r.stdout + r.stderr
    assert tree(repo) == patched


def test_a_backup_link_whose_blob_is_gone_is_not_restored(tmp_path: Path) -> None:
    repo = hf_cache(tmp_path, ("d" * 40,))
    snap = repo / "snapshots" / ("d" * 40)
    assert loadwatch("patch-model", str(snap), "--drop-fp8-kv-cache").returncode == 0
    (
        repo / "blobs" / os.readlink(snap / ("config.json" + BACKUP_SUFFIX)).rsplit("/", 1)[1]
    ).unlink()
    patched = tree(repo)
    r = loadwatch("patch-model", str(snap), "--revert")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "config.json.loadwatch-orig links to" in r.stderr and "nothing changed" in r.stderr
    assert tree(repo) == patched
