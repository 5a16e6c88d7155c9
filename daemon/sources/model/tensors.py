"""Bytes per weight group, from the safetensors headers (8 bytes of length, then a JSON object
of name -> dtype, shape, data_offsets): what the memory plan needs to tell replicated tensors
from sharded ones exactly. Reading a header costs one small read per shard; a file without a
header (a sparse stand-in, a .bin checkpoint) makes the whole answer None, and the plan
estimates from config.json's shapes instead.

A header is read within bounds (modelfiles.py): its length at most the safetensors limit and
inside the file, its JSON bounded, and every tensor's ``data_offsets`` two integers that begin
at 0 or later, end no earlier than they begin, do not overlap another tensor's and end inside
the file. A header that breaks one is refused (`OutOfBounds`): the plan estimates, and says why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.model.geometry import FAMILIES
from loadwatch.daemon.sources.model.modelfiles import (
    ModelFileError,
    OutOfBounds,
    confinement,
    member,
    open_regular,
    parse_json,
    read_upto,
    shown,
)

MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


def read_header(model_dir: Path, name: str) -> dict[str, int]:
    """Bytes per tensor of shard ``name``, from its header; ModelFileError when the file has no
    header at all, OutOfBounds when its header breaks a bound (module doc)."""
    fd = open_regular(member(model_dir, name, confinement(model_dir)), name)
    try:
        size = os.fstat(fd).st_size
        head = os.read(fd, 8)
        length = int.from_bytes(head, "little") if len(head) == 8 else 0
        if length < 2 or 8 + length > size:
            raise ModelFileError(f"{shown(name)}: no safetensors header")
        if length > MAX_HEADER_BYTES:
            raise OutOfBounds(
                f"{shown(name)}: a safetensors header of {length} bytes, over the "
                f"{MAX_HEADER_BYTES} byte cap"
            )
        raw = read_upto(fd, name, length)
    finally:
        os.close(fd)
    if len(raw) != length:
        raise ModelFileError(f"{shown(name)}: safetensors header cut short")
    doc = parse_json(raw, name)
    if not isinstance(doc, dict):
        raise ModelFileError(f"{shown(name)}: no safetensors header")
    return _tensor_bytes(doc, name, size - 8 - length)


def _tensor_bytes(doc: dict[str, Any], name: str, data_bytes: int) -> dict[str, int]:
    spans: list[tuple[int, int, str]] = []
    for tensor, meta in doc.items():
        if tensor == "__metadata__":
            continue
        offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise OutOfBounds(
                f"{shown(name)}: tensor {shown(tensor)}: data_offsets must be two integers"
            )
        begin, end = offsets
        if begin < 0 or end < 0:
            raise OutOfBounds(f"{shown(name)}: tensor {shown(tensor)}: a negative data offset")
        if end < begin:
            raise OutOfBounds(f"{shown(name)}: tensor {shown(tensor)}: ends before it begins")
        if end > data_bytes:
            raise OutOfBounds(
                f"{shown(name)}: tensor {shown(tensor)} ends at byte {end}, past the end of the "
                f"file's {data_bytes} data bytes"
            )
        spans.append((begin, end, tensor))
    spans.sort()
    for (_, prev_end, prev), (begin, _, tensor) in pairwise(spans):  # sorted: neighbours tell
        if begin < prev_end:
            raise OutOfBounds(
                f"{shown(name)}: tensors {shown(prev)} and {shown(tensor)} overlap in the file"
            )
    return {tensor: end - begin for begin, end, tensor in spans}


def family_bytes(
    model_dir: Path, shard_names: Iterable[str], notes: list[str] | None = None
) -> tuple[tuple[str, int], ...]:
    """(family, bytes) for the families of geometry.FAMILIES found, plus ("all", total tensor
    bytes); () when a shard has no readable header. A header refused by the bounds adds one
    line to ``notes``."""
    sums: dict[str, int] = {}
    total = 0
    for name in shard_names:
        if not name.endswith(".safetensors"):
            return ()
        try:
            sizes = read_header(model_dir, name)
        except OutOfBounds as exc:
            if notes is not None:
                notes.append(f"{exc}: weight-group bytes estimated from config.json's shapes")
            return ()
        except (ModelFileError, OSError):
            return ()
        for tensor, nbytes in sizes.items():
            total += nbytes
            fam = next((f for f, frag in FAMILIES if frag in tensor), None)
            if fam is not None:
                sums[fam] = sums.get(fam, 0) + nbytes
    return (*sorted(sums.items()), ("all", total)) if total else ()
