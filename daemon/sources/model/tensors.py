"""Bytes per weight group, from the safetensors headers (8 bytes of length, then a JSON object
of name -> dtype, shape, data_offsets): what the memory plan needs to tell replicated tensors
from sharded ones exactly. Reading a header costs one small read per shard; a file without a
valid header (a sparse stand-in, a .bin checkpoint) makes the whole answer None, and the plan
estimates from config.json's shapes instead."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from loadwatch.daemon.sources.model.geometry import FAMILIES

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


def _header(path: Path) -> dict[str, object] | None:
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= MAX_HEADER_BYTES:
                return None
            raw = f.read(size)
    except OSError:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def family_bytes(model_dir: Path, shard_names: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """(family, bytes) for the families of geometry.FAMILIES found, plus ("all", total tensor
    bytes); () when a shard has no readable header."""
    sums: dict[str, int] = {}
    total = 0
    for name in shard_names:
        if not name.endswith(".safetensors"):
            return ()
        header = _header(model_dir / name)
        if header is None:
            return ()
        for tensor, meta in header.items():
            offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
            if tensor == "__metadata__" or not isinstance(offsets, list) or len(offsets) != 2:
                continue
            nbytes = int(offsets[1]) - int(offsets[0])
            total += nbytes
            fam = next((f for f, frag in FAMILIES if frag in tensor), None)
            if fam is not None:
                sums[fam] = sums.get(fam, 0) + nbytes
    return (*sorted(sums.items()), ("all", total)) if total else ()
