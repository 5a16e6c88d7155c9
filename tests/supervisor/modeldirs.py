"""Copies of the model fixtures with shard files of chosen sizes (sparse, so cheap)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"


def copy_model(name: str, dest: Path, shard_bytes: int | None = 1000) -> Path:
    """Copy fixture ``name`` under ``dest``; create the indexed shards, shard i (1-based) with
    ``shard_bytes * i`` bytes, unless ``shard_bytes`` is None."""
    target = dest / name
    shutil.copytree(MODELS / name, target)
    index = target / "model.safetensors.index.json"
    if shard_bytes is not None and index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for i, shard in enumerate(names, start=1):
            with open(target / shard, "wb") as f:
                f.truncate(shard_bytes * i)
    return target
