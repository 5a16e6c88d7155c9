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
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.model.model_info import CONFIG, HF_QUANT_CONFIG
from loadwatch.daemon.sources.model.modelfiles import (
    DEFAULT_MAX_BYTES,
    MAX_BYTES,
    ModelFileError,
    open_regular,
    parse_json,
    read_capped,
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
    path: Path  # the bytes' location: the file itself, or an in-directory symlink's target
    backup: Path


def _check_writable_dir(d: Path, shown: str) -> None:
    st = d.stat()
    # Root may write anywhere; a directory with no write bits was made read-only on purpose.
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PatchError(f"{shown} is read-only (mode {stat.S_IMODE(st.st_mode):04o})")
    if not os.access(d, os.W_OK | os.X_OK):
        raise PatchError(f"{shown} is not writable")


def _check_writable_file(target: _Target) -> None:
    mode = _mode(target.path)
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise PatchError(f"{target.name} is read-only (mode {mode:04o})")


def _resolve(model_dir: Path, name: str) -> _Target | None:
    """The target for ``name``, None when absent; PatchError for a file we must not touch."""
    link = model_dir / name
    backup = model_dir / (name + BACKUP_SUFFIX)
    if link.is_symlink():
        real = link.resolve()
        if not real.is_relative_to(model_dir.resolve()):
            raise PatchError(
                f"{name} is a symlink to {real}, outside the model directory (replace the link "
                "with a copy of the file to patch it)"
            )
        path = real
    else:
        path = link
    if not path.exists():
        return None
    if not path.is_file():
        raise PatchError(f"{name} is not a regular file")
    if backup.is_symlink() or (backup.exists() and not backup.is_file()):
        raise PatchError(f"{backup.name} exists and is not a regular file")
    return _Target(name, path, backup)


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
    raw = _read_bytes(target.path, target.name)
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


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` via a temp file in the same directory: fsync, chmod, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        if t.backup.exists() and _read_bytes(t.backup, t.backup.name) != raw:
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
            for d in {p.target.path.parent for p in plans} | {root}:
                _check_writable_dir(d, "model directory" if d == root else str(d))
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


def _apply(plans: list[_Plan]) -> None:
    """Back up, then replace; on a failure put back what was already replaced."""
    made_backups: list[Path] = []
    replaced: list[_Plan] = []
    try:
        for p in plans:
            if not p.target.backup.exists():
                atomic_write(p.target.backup, p.old_raw, _mode(p.target.path))
                made_backups.append(p.target.backup)
        for p in plans:
            atomic_write(p.target.path, p.new_raw, _mode(p.target.path))
            replaced.append(p)
    except OSError:
        for p in replaced:
            try:
                atomic_write(p.target.path, p.old_raw, _mode(p.target.path))
            except OSError:
                pass
        for b in made_backups:
            try:
                b.unlink()
            except OSError:
                pass
        raise


def revert_model(
    model_dir: str | os.PathLike[str], dry_run: bool = False, force: bool = False
) -> tuple[str, int]:
    """Restore the ``.loadwatch-orig`` originals byte for byte and remove them; refuse when a
    file changed after the patch, unless ``force``."""
    root = Path(model_dir)
    try:
        if not root.is_dir():
            what = "not a directory" if root.exists() else "no such directory"
            raise PatchError(f"model directory {root}: {what}")
        pending: list[tuple[_Target, bytes, bytes | None]] = []
        for name in (CONFIG, HF_QUANT_CONFIG):
            backup = root / (name + BACKUP_SUFFIX)
            if not backup.exists() and not backup.is_symlink():
                continue
            if backup.is_symlink() or not backup.is_file():
                raise PatchError(f"{backup.name} is not a regular file")
            target = _resolve(root, name) or _Target(name, root / name, backup)
            current = _read_bytes(target.path, name) if target.path.exists() else None
            pending.append((target, _read_bytes(backup, backup.name), current))
        if not pending:
            return f"nothing to revert: no {BACKUP_SUFFIX} backups in {root}\n", EXIT_OK
        edited = [
            t.name
            for t, original, current in pending
            if current is not None and current != original and current != _patched(t.name, original)
        ]
        if edited and not force:
            raise PatchError(
                f"{', '.join(edited)} changed since the patch (neither the patched file nor the "
                "original): reverting would discard those edits; give --force to revert anyway"
            )
        if not dry_run:
            for d in {t.path.parent for t, _, _ in pending} | {root}:
                _check_writable_dir(d, "model directory" if d == root else str(d))
            for target, original, current in pending:
                if current != original:
                    atomic_write(target.path, original, _mode(target.backup))
                target.backup.unlink()
                _fsync_dir(target.backup.parent)
    except PatchError as exc:
        return f"patch-model: {exc}; nothing changed\n", EXIT_ERROR
    except OSError as exc:
        return f"patch-model: {_os_error(exc)}\n", EXIT_ERROR
    out = []
    for target, original, current in pending:
        old = (current or b"").decode("utf-8", "replace")
        out.append(_diff(target.name, old, original.decode("utf-8", "replace")))
        verb = "would restore" if dry_run else "restored"
        out.append(f"{target.name}: {verb} from {target.backup.name}")
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


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"
