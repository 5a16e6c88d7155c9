"""Read what a model directory declares: architecture, attention type, quantisation, shards.

Facts from vLLM's source that this follows (checked on its main branch, 2026-05):

- Shard list: the loader globs ``*.safetensors`` in the model directory (or, when none are at the
  top level, takes the files ``model.safetensors.index.json`` names), then drops files the index
  does not name. Without safetensors it falls back to ``*.bin`` (minus training state) and then
  ``*.pt``.
- Shard order: since 2026-02-05 the default safetensors iterator (and the fastsafetensors one
  since 2026-02-10) sorts the files by a natural key over the base name: runs of digits compare
  as integers, the text between them as plain (case-sensitive) strings. Before that the order was
  whatever ``glob`` returned, i.e. directory order, unsorted. The multi-thread loader yields shards
  as they complete. For the usual ``model-00001-of-00042.safetensors`` names natural order equals
  plain sorted order, so natural order is the best single answer for every version.
- Quantisation config: config.json's ``quantization_config`` wins; ``hf_quant_config.json`` is read
  only when config.json has none (ModelOpt 0.29 and older wrote only the separate file).
- KV-cache dtype declared by a ModelOpt config: ``kv_cache_scheme`` (``{"type": "float",
  "num_bits": 8}`` is FP8, 4 bits is NVFP4) or the ``kv_cache_quant_algo`` string, looked up inside
  ``quantization`` first, then at the top of the quantisation dict.
- MLA: vLLM treats the DeepSeek family (``deepseek_v2``, ``deepseek_v3``, ``kimi_k2``, ...) as MLA
  when the text config has a non-null ``kv_lora_rank``; without it the same model types use
  ordinary attention.

Every file is read within bounds (modelfiles.py). Ordinary faults (a missing config, malformed
JSON, a shard the index lists that is not there, a weight file linked out of the directory) are
``errors`` lines; a JSON file the bounds refuse makes `read_model_dir` raise `OutOfBounds`, one
line, which its callers say their own way (the daemon's ``daemon.problem``, the CLI's exit 65).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from loadwatch.daemon.sources.inputs import ModelInfo, ShardInfo
from loadwatch.daemon.sources.model.geometry import layer_count, read_geometry
from loadwatch.daemon.sources.model.modelfiles import (
    ModelFileError,
    OutOfBounds,
    confinement,
    member,
    read_json,
    shown,
)
from loadwatch.daemon.sources.model.tensors import family_bytes

CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"

# Model types vLLM runs with MLA (given a kv_lora_rank); used for the explanation only.
MLA_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_mtp",
        "kimi_k2",
        "kimi_linear",
        "glm4_moe_lite",
        "longcat_flash",
        "pangu_ultra_moe",
    }
)
_TRAINING_FILES = (
    "training_args.bin",
    "optimizer.bin",
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
)


def natural_key(name: str) -> list[Any]:
    """vLLM's shard sort key: digit runs as integers, text between them as strings."""
    base = os.path.basename(name)
    key: list[Any] = []
    for is_digit, run in groupby(base, key=str.isdecimal):
        text = "".join(run)
        if is_digit:
            if not key:
                key.append("")  # keep the str/int alternation so types never meet in a compare
            key.append(int(text))
        else:
            key.append(text)
    if not key or isinstance(key[-1], int):
        key.append("")
    return key


@dataclass
class _Acc:
    model_dir: Path
    root: Path  # where the directory's files may resolve to (modelfiles.confinement)
    errors: list[str] = field(default_factory=list)

    def read_json(self, name: str, required: bool) -> dict[str, Any] | None:
        """The file's top-level object, or None (with one error line when it matters);
        OutOfBounds for a file the bounds refuse."""
        try:
            data = read_json(self.model_dir, name, self.root)
        except FileNotFoundError:
            if required:
                self.errors.append(f"{name}: missing")
            return None
        except OutOfBounds:
            raise
        except ModelFileError as exc:
            self.errors.append(str(exc))
            return None
        if not isinstance(data, dict):
            self.errors.append(f"{name}: expected a JSON object, found {_json_type(data)}")
            return None
        return data

    def inside(self, name: str) -> Path | None:
        """The real path of weight file ``name``, None when it leads out of the directory."""
        try:
            return member(self.model_dir, name, self.root)
        except OutOfBounds:
            return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _json_type(data: object) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(data), "null"
    )


def kv_dtype_of(quant: dict[str, Any]) -> tuple[str | None, str | None]:
    """(dtype, key path) of the KV-cache declaration in one quantisation dict.

    dtype is ``"fp8"``, ``"nvfp4"``, another lower-case name, or None when nothing is declared.
    """
    inner = quant.get("quantization")
    inner = inner if isinstance(inner, dict) else {}
    candidates = (
        ("quantization.kv_cache_scheme", inner.get("kv_cache_scheme")),
        ("kv_cache_scheme", quant.get("kv_cache_scheme")),
        ("quantization.kv_cache_quant_algo", inner.get("kv_cache_quant_algo")),
        ("kv_cache_quant_algo", quant.get("kv_cache_quant_algo")),
    )
    for key, value in candidates:
        if not value:
            continue
        if isinstance(value, dict):
            bits = value.get("num_bits")
            if value.get("type") == "float" and bits == 8:
                return "fp8", key
            if value.get("type") == "float" and bits == 4:
                return "nvfp4", key
            return f"{value.get('type')}{bits}", key
        if isinstance(value, str):
            low = value.lower()
            return ("fp8" if low.startswith("fp8") else low), key
    return None, None


def quant_algo_of(quant: dict[str, Any]) -> str | None:
    inner = quant.get("quantization")
    for source in (inner if isinstance(inner, dict) else {}, quant):
        for key in ("quant_algo", "quant_method"):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal wrappers (Kimi-K2.5) keep the language model's settings in ``text_config``."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def _quant_from_config(config: dict[str, Any]) -> dict[str, Any] | None:
    quant = config.get("quantization_config")
    if quant is None:
        compression = config.get("compression_config")
        if isinstance(compression, dict):
            quant = compression.get("quantization_config")
    return quant if isinstance(quant, dict) else None


def select_weight_files(acc: _Acc, tensor_names: list[str] | None = None) -> list[str]:
    """Relative names of the weight files vLLM would load, in its load order (and, into
    ``tensor_names`` when given, the tensor names the index lists). A file named or linked out
    of the directory is left out, with a note."""
    model_dir = acc.model_dir
    index = acc.read_json(SAFETENSORS_INDEX, required=False)
    weight_map = index.get("weight_map") if index is not None else None
    index_names: set[str] | None = None
    if isinstance(weight_map, dict):
        named = {v for v in weight_map.values() if isinstance(v, str)}
        outside = sorted(n for n in named if acc.inside(n) is None)
        if outside:
            acc.errors.append(
                f"{SAFETENSORS_INDEX}: {len(outside)} entries name files outside the model "
                f"directory (first: {shown(outside[0])}): ignored"
            )
        index_names = named.difference(outside)
        if tensor_names is not None:
            tensor_names.extend(weight_map)
    elif index is not None:
        acc.errors.append(f"{SAFETENSORS_INDEX}: no weight_map object")
    top = _glob(acc, ".safetensors")
    if top:
        files = top if index_names is None else [f for f in top if f in index_names]
    elif index_names:
        files = [n for n in index_names if os.path.isfile(model_dir / n)]
    else:
        files = []
    if index_names is not None:
        missing = sorted(
            (n for n in index_names if not os.path.isfile(model_dir / n)), key=natural_key
        )
        if missing:
            acc.errors.append(
                f"{SAFETENSORS_INDEX}: {len(missing)} listed shard file(s) missing on disk "
                f"(first: {shown(missing[0])})"
            )
    if not files and not index_names:
        files = [f for f in _glob(acc, ".bin") if not f.endswith(_TRAINING_FILES)]
        if not files:
            files = _glob(acc, ".pt")
    return sorted(files, key=natural_key)


def _glob(acc: _Acc, suffix: str) -> list[str]:
    try:
        with os.scandir(acc.model_dir) as it:
            found = [e.name for e in it if e.name.endswith(suffix) and e.is_file()]
    except OSError:
        return []
    out = []
    for name in found:  # a link out of the directory is no file of it (the HF cache's are)
        if acc.inside(name) is None:
            acc.errors.append(
                f"{shown(name)}: a link to a file outside the model directory: ignored"
            )
        else:
            out.append(name)
    return out


def _shards(acc: _Acc, names: Iterable[str]) -> tuple[ShardInfo, ...]:
    out = []
    for name in names:
        try:
            size = (acc.model_dir / name).stat().st_size  # follows links: HF caches link to blobs
        except OSError as exc:
            acc.errors.append(f"{shown(name)}: cannot stat: {_one_line(exc)}")
            continue
        out.append(ShardInfo(name=name, size_bytes=size))
    return tuple(out)


def read_model_dir(path: str | os.PathLike[str], tensor_bytes: bool = False) -> ModelInfo:
    """Everything preflight and progress need from ``path``; faults become ``errors`` lines,
    and a JSON file the bounds refuse raises `OutOfBounds`, its line naming the directory.

    ``tensor_bytes``: also read every shard's safetensors header for the bytes of the weight
    groups the memory plan places apart (one small read per shard; preflight asks for it, the
    daemon's loop does not)."""
    model_dir = Path(path)
    where = str(path)
    if not os.path.isdir(model_dir):
        what = "not a directory" if os.path.lexists(model_dir) else "no such directory"
        return ModelInfo(path=where, errors=(f"model directory {where}: {what}",))
    acc = _Acc(model_dir, confinement(model_dir))
    tensor_names: list[str] = []
    try:
        config = acc.read_json(CONFIG, required=True)
        hf_quant = acc.read_json(HF_QUANT_CONFIG, required=False)
        weight_files = select_weight_files(acc, tensor_names)
    except OutOfBounds as exc:
        raise OutOfBounds(f"model directory {where}: {exc}") from None

    architecture = model_type = None
    num_layers: int | None = None
    is_mla: bool | None = None
    if config is not None:
        archs = config.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            architecture = archs[0]
        mt = config.get("model_type")
        model_type = mt if isinstance(mt, str) else None
        text = _text_config(config)
        num_layers = layer_count(text)
        is_mla = text.get("kv_lora_rank") is not None or config.get("kv_lora_rank") is not None

    config_quant = _quant_from_config(config) if config is not None else None
    kv_sources: list[str] = []
    declared: dict[str, str | None] = {}
    for fname, quant in ((CONFIG, config_quant), (HF_QUANT_CONFIG, hf_quant)):
        if quant is None:
            continue
        dtype, key = kv_dtype_of(quant)
        declared[fname] = dtype
        if key is not None:
            prefix = "quantization_config." if fname == CONFIG else ""
            kv_sources.append(f"{fname}:{prefix}{key}")
    effective = config_quant if config_quant is not None else hf_quant
    effective_name = CONFIG if config_quant is not None else HF_QUANT_CONFIG
    quant_algo = quant_algo_of(effective) if effective is not None else None
    kv_dtype = declared.get(effective_name) if effective is not None else None

    shards = _shards(acc, weight_files)
    geometry = read_geometry(config, tensor_names) if config is not None else None
    if geometry is not None and tensor_bytes:
        exact = family_bytes(model_dir, (s.name for s in shards), acc.errors)
        geometry = dataclasses.replace(geometry, family_bytes=exact)
    total = sum(s.size_bytes for s in shards) if shards else None
    return ModelInfo(
        path=where,
        shards=shards,
        total_bytes=total,
        architecture=architecture,
        model_type=model_type,
        is_mla=is_mla,
        num_layers=num_layers,
        quant_algo=quant_algo,
        checkpoint_kv_dtype=kv_dtype,
        kv_sources=tuple(kv_sources),
        geometry=geometry,
        errors=tuple(acc.errors),
    )


def under_roots(path: str, roots: Iterable[Path]) -> bool:
    """Whether the absolute ``path`` lies inside one of ``roots``, as written (no file outside
    them is looked at) and with its links followed."""
    if not os.path.isabs(path) or "\0" in path:
        return False
    plain = Path(os.path.normpath(path))
    for root in roots:
        if plain.is_relative_to(os.path.abspath(root)) and Path(
            os.path.realpath(plain)
        ).is_relative_to(os.path.realpath(root)):
            return True
    return False
