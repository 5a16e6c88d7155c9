"""``loadwatch patch-model DIR --drop-fp8-kv-cache``: remove the checkpoint's FP8 KV-cache declaration.

Why: on GPUs whose only MLA backend refuses an FP8 KV cache (see preflight.py), a checkpoint that
declares one cannot start. Without the declaration vLLM keeps the KV cache in the model dtype and
the checkpoint's k/v scales are merely reported as not loaded.

Safety: every check runs before anything is written; originals are saved byte for byte as
``NAME.loadwatch-orig`` (kept if already there, so a second patch never overwrites the true
original); files are replaced atomically (temp file in the same directory, fsync, rename, the
file mode kept); ``--revert`` puts the originals back byte for byte and removes the backups.
Key order and formatting are kept by re-serialising with the style detected in the file.
Files are read within bounds (sources/model/modelfiles.py): a FIFO, an oversized or hostile JSON
file is one line, nothing changed. ``--revert`` refuses, naming them, when files changed after
the patch (neither the patched text nor the original): putting the original back would discard
those edits; ``--force`` reverts anyway.

A file that is a symbolic link (a Hugging Face cache snapshot: ``snapshots/HASH/config.json ->
../../blobs/SHA``) is never written through: its target can be shared (every snapshot with the
same file links to one blob) and is named by its content. The link itself is what gets replaced,
by the patched file as a regular file in the directory (the layout huggingface_hub itself makes
where it cannot link, so its cache tools and ``from_pretrained`` take it as it is), and the
backup is a link with the same text; ``--revert`` renames it back over the file, so the link
returns exactly as it was and no blob ever changes. A new blob with the link re-pointed at it is
not done: a blob's name is its content's hash in the repository, which a patched file is not. A
link is followed only within the directory, or a snapshot's repository folder (modelfiles.py).
"""

from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.model.model_info import CONFIG, HF_QUANT_CONFIG
from loadwatch.daemon.sources.model.modelfiles import (
    DEFAULT_MAX_BYTES,
    MAX_BYTES,
    ModelFileError,
    member,
    open_regular,
    parse_json,
    read_capped,
)
from loadwatch.daemon.tools.patch_files import (
    atomic_symlink,
    atomic_write,
    file_mode,
    fsync_dir,
)

BACKUP_SUFFIX = ".loadwatch-orig"
_KV_KEYS = ("kv_cache_scheme", "kv_cache_quant_algo")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


class PatchError(Exception):
    """An expected fault: one line for the user, nothing changed."""


# -- JSON with the file's own formatting -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JsonStyle:
    indent: int | str | None
    separators: tuple[str, str]
    ensure_ascii: bool
    trailing_newline: bool
    exact: bool  # re-serialising the unchanged document gives back the file's exact text

    def dump(self, data: Any) -> str:
        text = json.dumps(
            data, indent=self.indent, separators=self.separators, ensure_ascii=self.ensure_ascii
        )
        return text + "\n" if self.trailing_newline else text


def _detect_indent(text: str) -> int | str | None:
    for line in text.splitlines()[1:]:
        stripped = line.lstrip(" \t")
        if stripped and len(stripped) < len(line):
            unit = line[: len(line) - len(stripped)]
            return len(unit) if set(unit) == {" "} else unit
    return None


def detect_style(text: str, data: Any) -> JsonStyle:
    """The json.dumps settings that reproduce ``text`` from ``data``, or the closest guess."""
    indent = _detect_indent(text)
    trailing = text.endswith("\n")
    ascii_only = text.isascii()
    item_seps = (",", ", ") if indent is not None else (", ", ",")
    for item in item_seps:
        for key in (": ", ":"):
            for ensure_ascii in (ascii_only, not ascii_only):
                style = JsonStyle(indent, (item, key), ensure_ascii, trailing, exact=True)
                if style.dump(data) == text:
                    return style
    return JsonStyle(indent, (item_seps[0], ": "), ascii_only, trailing, exact=False)


# -- what to remove ------------------------------------------------------------------------------


def _is_fp8(value: Any) -> bool:
    if isinstance(value, dict):
        return value.get("type") == "float" and value.get("num_bits") == 8
    return isinstance(value, str) and value.lower().startswith("fp8")


def _drop_from(obj: Any, path: str, removed: list[str], kept: list[str]) -> None:
    if not isinstance(obj, dict):
        return
    for key in _KV_KEYS:
        if key not in obj or obj[key] is None:
            continue
        if _is_fp8(obj[key]):
            del obj[key]
            removed.append(path + key)
        else:
            kept.append(f"{path}{key} ({json.dumps(obj[key])}: not FP8)")


def drop_fp8_fields(name: str, data: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Remove FP8 KV declarations in place: (removed key paths, declarations left alone)."""
    removed: list[str] = []
    kept: list[str] = []
    if name == CONFIG:
        quant = data.get("quantization_config")
        _drop_from(quant, "quantization_config.", removed, kept)
        if isinstance(quant, dict):
            _drop_from(
                quant.get("quantization"), "quantization_config.quantization.", removed, kept
            )
    else:
        _drop_from(data.get("quantization"), "quantization.", removed, kept)
        _drop_from(data, "", removed, kept)
    return removed, kept


# -- files ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    name: str
    file: Path  # DIR/NAME: what the patch replaces
    source: Path  # where its bytes are read: the file itself, or the target of its link
    link: str | None  # the link's own text when the file is a symbolic link
    backup: Path


def _check_writable_dir(d: Path, shown: str) -> None:
    st = d.stat()
    # Root may write anywhere; a directory with no write bits was made read-only on purpose.
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PatchError(f"{shown} is read-only (mode {stat.S_IMODE(st.st_mode):04o})")
    if not os.access(d, os.W_OK | os.X_OK):
        raise PatchError(f"{shown} is not writable")


def _check_writable_file(target: _Target) -> None:
    if target.link is not None:
        return  # the link is replaced, its target never written
    mode = file_mode(target.file)
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PatchError(f"{target.name} is read-only (mode {mode:04o})")


def _real(model_dir: Path, name: str) -> Path:
    """Where file ``name`` of the directory leads, links followed, within its bounds."""
    try:
        return member(model_dir, name)
    except ModelFileError as exc:
        raise PatchError(str(exc)) from None


def _resolve(model_dir: Path, name: str) -> _Target | None:
    """The target for ``name``, None when absent; PatchError for a file we must not touch."""
    file = model_dir / name
    backup = model_dir / (name + BACKUP_SUFFIX)
    link = os.readlink(file) if file.is_symlink() else None
    source = _real(model_dir, name) if link is not None else file
    if not source.exists():
        return None
    if not source.is_file():
        raise PatchError(f"{name} is not a regular file")
    if not backup.is_symlink() and backup.exists() and not backup.is_file():
        raise PatchError(f"{backup.name} exists and is not a regular file")
    return _Target(name, file, source, link, backup)


def _backup_differs(model_dir: Path, target: _Target, raw: bytes) -> bool:
    """A backup already there that is not the original of ``target`` as it is now."""
    backup = target.backup
    if backup.is_symlink():
        if target.link is not None:
            return os.readlink(backup) != target.link
        return _read_bytes(_real(model_dir, backup.name), backup.name) != raw
    if not backup.exists():
        return False
    return target.link is not None or _read_bytes(backup, backup.name) != raw


def _read_bytes(path: Path, name: str) -> bytes:
    """The file's bytes, within the cap of its kind (``name`` without the backup suffix)."""
    cap = MAX_BYTES.get(name.removesuffix(BACKUP_SUFFIX), DEFAULT_MAX_BYTES)
    try:
        fd = open_regular(path, name)
        try:
            return read_capped(fd, name, cap)
        finally:
            os.close(fd)
    except ModelFileError as exc:
        raise PatchError(str(exc)) from None


def _parse(name: str, raw: bytes) -> tuple[str, dict[str, Any]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"{name}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = parse_json(raw, name)
    except ModelFileError as exc:
        raise PatchError(str(exc)) from None
    if not isinstance(data, dict):
        raise PatchError(f"{name}: expected a JSON object")
    return text, data


def _read_json(target: _Target) -> tuple[bytes, str, dict[str, Any]]:
    raw = _read_bytes(target.source, target.name)
    text, data = _parse(target.name, raw)
    return raw, text, data


def _patched(name: str, original: bytes) -> bytes | None:
    """What ``--drop-fp8-kv-cache`` writes for the original ``original``; None when it writes
    nothing or the original cannot be read."""
    try:
        text, data = _parse(name, original)
    except PatchError:
        return None
    style = detect_style(text, data)
    removed, _ = drop_fp8_fields(name, data)
    return style.dump(data).encode("utf-8") if removed else None


def _diff(name: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    out = []
    for line in lines:
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def _targets(model_dir: Path) -> list[_Target]:
    if not model_dir.is_dir():
        what = "not a directory" if model_dir.exists() else "no such directory"
        raise PatchError(f"model directory {model_dir}: {what}")
    found = [_resolve(model_dir, n) for n in (CONFIG, HF_QUANT_CONFIG)]
    return [t for t in found if t is not None]


# -- the two operations ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    target: _Target
    old_raw: bytes
    new_raw: bytes
    removed: tuple[str, ...]
    exact: bool


def _plan_drop(model_dir: Path) -> tuple[list[_Plan], list[str]]:
    targets = _targets(model_dir)
    if not any(t.name == CONFIG for t in targets):
        raise PatchError(f"{CONFIG}: missing in {model_dir}")
    plans: list[_Plan] = []
    notes: list[str] = []
    for t in targets:
        raw, text, data = _read_json(t)
        style = detect_style(text, data)
        removed, kept = drop_fp8_fields(t.name, data)
        notes += [f"{t.name}: left {k}" for k in kept]
        if not removed:
            continue
        if _backup_differs(model_dir, t, raw):
            raise PatchError(
                f"{t.backup.name} exists and differs from {t.name}: run --revert or remove the "
                "backup first"
            )
        plans.append(_Plan(t, raw, style.dump(data).encode("utf-8"), tuple(removed), style.exact))
    return plans, notes


def drop_fp8_kv_cache(model_dir: str | os.PathLike[str], dry_run: bool = False) -> tuple[str, int]:
    """Remove FP8 KV-cache declarations; (report text with a unified diff, exit code)."""
    root = Path(model_dir)
    try:
        plans, notes = _plan_drop(root)
        if plans and not dry_run:
            _check_writable_dir(root, "model directory")
            for p in plans:
                _check_writable_file(p.target)
            _apply(plans)
    except PatchError as exc:
        return f"patch-model: {exc}; nothing changed\n", EXIT_ERROR
    except OSError as exc:
        return f"patch-model: {_os_error(exc)}; nothing changed\n", EXIT_ERROR
    if not plans:
        lines = [f"nothing to change: no FP8 KV-cache declaration in {root}", *notes]
        return "\n".join(lines) + "\n", EXIT_OK
    out = [_diff(p.target.name, p.old_raw.decode(), p.new_raw.decode()) for p in plans]
    for p in plans:
        verb = "would remove" if dry_run else "removed"
        out.append(f"{p.target.name}: {verb} {', '.join(p.removed)}")
        if not dry_run:
            out[-1] += f" (original kept as {p.target.backup.name})"
        if not p.exact:
            out.append(f"{p.target.name}: formatting could not be reproduced exactly")
    out += notes
    if dry_run:
        out.append("dry run: nothing written")
    return "\n".join(s.rstrip("\n") for s in out) + "\n", EXIT_OK


def _put_back(t: _Target, old_raw: bytes, mode: int) -> None:
    if t.link is not None:
        atomic_symlink(t.file, t.link)
    else:
        atomic_write(t.file, old_raw, mode)


def _apply(plans: list[_Plan]) -> None:
    """Back up, then replace; on a failure put back what was already replaced."""
    made_backups: list[Path] = []
    replaced: list[_Plan] = []
    modes = {p.target.name: file_mode(p.target.source) for p in plans}  # a link: its target's
    try:
        for p in plans:
            t = p.target
            if not t.backup.exists() and not t.backup.is_symlink():
                if t.link is not None:
                    atomic_symlink(t.backup, t.link)
                else:
                    atomic_write(t.backup, p.old_raw, modes[t.name])
                made_backups.append(t.backup)
        for p in plans:
            atomic_write(p.target.file, p.new_raw, modes[p.target.name])
            replaced.append(p)
    except OSError:
        for p in replaced:
            try:
                _put_back(p.target, p.old_raw, modes[p.target.name])
            except OSError:
                pass
        for b in made_backups:
            try:
                b.unlink()
            except OSError:
                pass
        raise


@dataclass(frozen=True, slots=True)
class _Restore:
    name: str
    file: Path
    backup: Path
    original: bytes
    current: bytes | None
    write_to: Path | None  # where a copy's bytes go back; None: the backup is a link, renamed


def _restore_plan(root: Path, name: str) -> _Restore | None:
    """How ``name`` goes back to its original, None without a backup; PatchError when it can't."""
    file, backup = root / name, root / (name + BACKUP_SUFFIX)
    if backup.is_symlink():
        real = _real(root, backup.name)
        if not real.is_file():
            raise PatchError(f"{backup.name} links to {os.readlink(backup)}, which is not a file")
        current = _read_bytes(_real(root, name), name) if file.exists() else None
        return _Restore(name, file, backup, _read_bytes(real, backup.name), current, None)
    if not backup.exists():
        return None
    if not backup.is_file():
        raise PatchError(f"{backup.name} is not a regular file")
    write_to = file
    if file.is_symlink():  # a link inside the directory that an earlier version patched through
        write_to = file.resolve()
        if not write_to.is_relative_to(root.resolve()):
            raise PatchError(f"{name} links out of the model directory and {backup.name} is a copy")
    current = _read_bytes(write_to, name) if write_to.exists() else None
    return _Restore(name, file, backup, _read_bytes(backup, backup.name), current, write_to)


def revert_model(
    model_dir: str | os.PathLike[str], dry_run: bool = False, force: bool = False
) -> tuple[str, int]:
    """Restore the ``.loadwatch-orig`` originals byte for byte (a link as the very link it was)
    and remove them; refuse when a file changed after the patch, unless ``force``."""
    root = Path(model_dir)
    try:
        if not root.is_dir():
            what = "not a directory" if root.exists() else "no such directory"
            raise PatchError(f"model directory {root}: {what}")
        found = [_restore_plan(root, name) for name in (CONFIG, HF_QUANT_CONFIG)]
        pending = [r for r in found if r is not None]
        if not pending:
            return f"nothing to revert: no {BACKUP_SUFFIX} backups in {root}\n", EXIT_OK
        edited = [
            r.name
            for r in pending
            if r.current not in (None, r.original, _patched(r.name, r.original))
        ]
        if edited and not force:
            raise PatchError(
                f"{', '.join(edited)} changed since the patch (neither the patched file nor the "
                "original): reverting would discard those edits; give --force to revert anyway"
            )
        if not dry_run:
            dirs = {r.write_to.parent for r in pending if r.write_to is not None} | {root}
            for d in dirs:
                _check_writable_dir(d, "model directory" if d == root else str(d))
            for r in pending:
                if r.write_to is None:
                    os.replace(r.backup, r.file)  # the link itself, its text as it was
                else:
                    if r.current != r.original:
                        atomic_write(r.write_to, r.original, file_mode(r.backup))
                    r.backup.unlink()
                fsync_dir(root)
    except PatchError as exc:
        return f"patch-model: {exc}; nothing changed\n", EXIT_ERROR
    except OSError as exc:
        return f"patch-model: {_os_error(exc)}\n", EXIT_ERROR
    out = []
    for r in pending:
        old = (r.current or b"").decode("utf-8", "replace")
        out.append(_diff(r.name, old, r.original.decode("utf-8", "replace")))
        verb = "would restore" if dry_run else "restored"
        out.append(f"{r.name}: {verb} from {r.backup.name}")
    if edited:
        lost = "would be discarded" if dry_run else "discarded"
        out.append(f"{', '.join(edited)}: edits made after the patch {lost} (--force)")
    if dry_run:
        out.append("dry run: nothing written")
    return "\n".join(s.rstrip("\n") for s in out if s) + "\n", EXIT_OK


def patch_model_cli(
    model_dir: str,
    *,
    drop_fp8: bool = False,
    revert: bool = False,
    dry_run: bool = False,
    force: bool = False,
) -> tuple[str, int]:
    """``loadwatch patch-model``: (text to print, exit code)."""
    if drop_fp8 == revert:
        return "patch-model: give exactly one of --drop-fp8-kv-cache and --revert\n", EXIT_USAGE
    if revert:
        return revert_model(model_dir, dry_run=dry_run, force=force)
    return drop_fp8_kv_cache(model_dir, dry_run=dry_run)


def _os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"
