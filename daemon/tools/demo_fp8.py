"""The demo's `fp8-kv-on-sm120` scenario beside the load (demo.py): the remedies the supervisor
applied, each shown once with what it changed and what it costs, and, after the remedy's patch,
`loadwatch patch-model --revert` with the check that the checkpoint's files are as they were."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadwatch.daemon.tools.patch import patch_model_cli


def config_files(model: Path) -> dict[str, bytes]:
    """The checkpoint's files but its (sparse) shards, byte for byte."""
    return {
        p.name: p.read_bytes()
        for p in sorted(model.iterdir())
        if p.is_file() and p.suffix != ".safetensors"
    }


def revert_patch(model: Path, originals: dict[str, bytes], console: Any) -> bool:
    """`loadwatch patch-model --revert` after the remedy's patch: the files as they were."""
    console.rule("loadwatch patch-model --revert")
    text, code = patch_model_cli(str(model), revert=True)
    console.print(text.rstrip("\n"), highlight=False, soft_wrap=True, markup=False)
    same = code == 0 and config_files(model) == originals
    said = "byte for byte as before the patch" if same else "NOT as they were before the patch"
    console.print(f"the checkpoint's files are {said}", highlight=False)
    return same


def show_remedies(snap: Any, shown: int, console: Any) -> int:
    """Each remedy the supervisor applied, once: what it changed and why (for the FP8 KV cache,
    the KV tokens the model-dtype cache costs); the count shown."""
    steps = [s for s in snap.remedies if s.outcome != "none"]
    for step in steps[shown:]:  # (seen applied, or only once it helped)
        lines = [f"remedy {step.remedy} {step.outcome}: {step.reason}", *step.diff]
        console.print("\n".join(lines), highlight=False, markup=False, soft_wrap=True)
    return max(shown, len(steps))


__all__ = ["config_files", "revert_patch", "show_remedies"]
