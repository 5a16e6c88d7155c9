"""Runs of plain k/v scale warnings and the weights bar between them, recognised without
parsing each record.

A Kimi-K2.5-shaped load writes a `Found k_scale in the checkpoint (e.g. ...)` warning per layer,
scale and worker: nearly every record of its log. Of a run of them back to back the state needs
counts, layers, scales and processes, and the event log one line. `kv_run` recognises a run of
records of the one strict shape vLLM prints (weight_utils.py's message, one `(NAME pid=N)`
prefix, a bracketed WARNING header whose stamp is a real date, nothing else after the message
but its own `. X_scale is not loaded.`), stopping at the first record of any other shape or
whose stamp goes back. Whatever it accepts, the event stream parses to one `KvScaleWarning` with
the same fields (tests/parsers/test_kv_run.py); anything else takes the usual path. The same
search in C is `_kvrun.c`'s `kv_run` (tests/perf/test_scan_native.py compares them).

The result: None, or (end of the last record, count, start of the last record, first stamp, last
stamp, first checkpoint name, first model name, scales, processes, layers), as `KvScaleRun`
holds them: scales in order of first appearance ("k", "v"), processes as (name, pid) likewise,
layers as (layer, records) in layer order; the stamps as bytes.

A loader draws its bar between the warnings: `(Worker_TP0 pid=7) ` alone in a record, `\r`, then
`Loading safetensors checkpoint shards:  42% Completed | 50/119 [01:40<02:18,  2.01s/it]`.
`load_run` goes on across such pairs of the one strict shape (`bar_pair`), so a load's warnings
and bar updates are one run however they interleave: (end of the last record, pieces), each
piece `(start, kv_run result)` for warnings back to back, or a `BarPair` for a bar record and the
prefix before it. runs.py turns a bar piece into the event feeding both records would give;
`_kvrun.c`'s `load_run` is the same search in C. It stops at a record of any other shape, and
reads bars only in the modes in which they are candidates (runs.py's `BAR_MODES`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import fields
from itertools import repeat
from typing import Any, NamedTuple

from loadwatch.parsers.events import KvScaleRun, ShardProgress
from loadwatch.parsers.vllm.builders import (
    _PROGRESS_FIELDS,
    _rate,
    bar_kind,
    bar_unit,
    hms_seconds,
)
from loadwatch.parsers.vllm.catalog import _LAYER

_NAME_CHARS = rb"[\x21-\x27\x2a-\x7e]{0,400}"  # printable ASCII but ( ): the catalog's [^()\s]
KV_RECORD = re.compile(
    rb"\(([A-Za-z][A-Za-z0-9_]{0,63}) pid=([0-9]{1,10})\) WARNING "
    rb"([0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) "
    # the catalog's loggers of this warning (catalog_load.py), after any DEBUG path
    rb"\[(?=[\x21-\x5c\x5e-\x7e]{1,200}\] )(?:[\x21-\x2e\x30-\x39\x3b-\x5c\x5e-\x7e]{0,200}/){0,100}"
    rb"(?:weight_utils|utils|kv_cache)\.py(?::[\x21-\x5c\x5e-\x7e]{0,200})?\] "
    rb"Found ([kv])_scale in the checkpoint \(e\.g\. (" + _NAME_CHARS + rb")\), "
    rb"but not found the expected name in the model \(e\.g\. (" + _NAME_CHARS + rb")\)"
    rb"(?:\. [kv]_scale is not loaded\.)?"
)
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February: 29 may be no date
_TERMINATORS = b"\r\n"
MAX_RUN_PROCESSES = 64  # a run ends before a 65th process (the C one tallies them in an array)

KvRunResult = tuple[
    int,
    int,
    int,
    bytes,
    bytes,
    str,
    str,
    tuple[str, ...],
    tuple[tuple[str, int], ...],
    tuple[tuple[int, int], ...],
]


def valid_stamp(stamp: bytes) -> bool:
    mon, day = int(stamp[0:2]), int(stamp[3:5])
    return (
        1 <= mon <= 12
        and 1 <= day <= _DAYS[mon]
        and int(stamp[6:8]) < 24
        and int(stamp[9:11]) < 60
        and int(stamp[12:14]) < 60
    )


def layer_of(ckpt: bytes, model: bytes) -> int | None:
    m = _LAYER.search(ckpt.decode()) or _LAYER.search(model.decode())
    return int(m.group(1)) if m else None


def kv_run(data: bytes, start: int) -> KvRunResult | None:
    """The run of strict k/v scale warning records from `start` (a record's start) in `data`."""
    n = len(data)
    s = start
    count = 0
    last_start = start
    end = start
    first_stamp = last_stamp = first_ckpt = first_model = b""
    scales: list[bytes] = []
    procs: list[tuple[bytes, int]] = []
    layers: dict[int, int] = {}
    while s < n:
        lf = data.find(b"\n", s)
        cr = data.find(b"\r", s, lf if lf >= 0 else n)
        e = cr if cr >= 0 else (lf if lf >= 0 else n)
        m = KV_RECORD.fullmatch(data, s, e)
        if m is None or b"0m" in data[s:e] or b"6m" in data[s:e]:
            break
        stamp = m.group(3)
        if not valid_stamp(stamp) or (count and stamp < last_stamp):
            break
        proc = (m.group(1), int(m.group(2)))
        if proc not in procs and len(procs) >= MAX_RUN_PROCESSES:
            break
        if not count:
            first_stamp, first_ckpt, first_model = stamp, m.group(5), m.group(6)
        count += 1
        last_stamp, last_start, end = stamp, s, e
        scale = m.group(4)
        if scale not in scales:
            scales.append(scale)
        if proc not in procs:
            procs.append(proc)
        layer = layer_of(m.group(5), m.group(6))
        if layer is not None:
            layers[layer] = layers.get(layer, 0) + 1
        s = e
        while s < n and data[s] in _TERMINATORS:
            s += 1
    if not count:
        return None
    return (
        end,
        count,
        last_start,
        first_stamp,
        last_stamp,
        first_ckpt.decode(),
        first_model.decode(),
        tuple(x.decode() for x in scales),
        tuple((name.decode(), pid) for name, pid in procs),
        tuple(sorted(layers.items())),
    )


class BarPair(NamedTuple):
    """A strict bar record and the lone process prefix before it, as found in a chunk."""

    prefix_start: int
    start: int  # of the bar record (just after the prefix's `\r`)
    end: int
    desc: bytes
    done: int
    total: int
    elapsed_s: float | None  # as builders.py reads the bar's fields
    remaining_s: float | None
    rate_per_s: float | None


PREFIX_RECORD = re.compile(rb"\(([A-Za-z][A-Za-z0-9_]{0,63}) pid=([0-9]{1,10})\) ")
# printable ASCII but ( ) : [ ] |, a letter first
_DESC_CHARS = rb"[A-Za-z][\x20-\x27\x2a-\x39\x3b-\x5a\x5c\x5e-\x7b\x7d\x7e]{0,199}"
BAR_RECORD = re.compile(
    rb"(" + _DESC_CHARS + rb"): {0,8}[0-9]{1,3}% Completed \| ([0-9]{1,9})/([0-9]{1,9}) "
    rb"\[([0-9:]{1,12})<([0-9:?]{1,12}), {0,8}(\?it/s|[0-9]{1,9}(?:\.[0-9]{1,9})?(?:it/s|s/it))\]"
)


def bar_pair(data: bytes, s: int) -> BarPair | None:
    """The prefix record at `s`, `\r`, and the strict bar record after it; None: not that."""
    n = len(data)
    cr = data.find(b"\r", s, s + 90)  # a prefix is at most 83 bytes
    if cr < 0 or data.find(b"\n", s, cr) >= 0 or PREFIX_RECORD.fullmatch(data, s, cr) is None:
        return None
    b = cr + 1
    lf = data.find(b"\n", b)
    e = data.find(b"\r", b, lf if lf >= 0 else n)
    e = e if e >= 0 else (lf if lf >= 0 else n)
    m = BAR_RECORD.fullmatch(data, b, e)
    if m is None or b"0m" in data[b:e] or b"6m" in data[b:e]:
        return None
    return BarPair(
        s,
        b,
        e,
        m.group(1),
        int(m.group(2)),
        int(m.group(3)),
        hms_seconds(m.group(4).decode()),
        hms_seconds(m.group(5).decode()),
        _rate(m.group(6).decode()),
    )


LoadPiece = tuple[int, KvRunResult] | BarPair


def load_run(data: bytes, start: int) -> tuple[int, list[LoadPiece]] | None:
    """The run from `start` of k/v warning records and bar pairs, in order; None: no k/v
    warning record at `start` (a run starts with one)."""
    n = len(data)
    s = start
    end = start
    pieces: list[LoadPiece] = []
    while s < n:
        got = kv_run(data, s)
        if got is not None:
            pieces.append((s, got))
            end = got[0]
        elif pieces:
            bar = bar_pair(data, s)
            if bar is None:
                break
            pieces.append(bar)
            end = bar.end
        else:
            break
        s = end
        while s < n and data[s] in _TERMINATORS:
            s += 1
    return (end, pieces) if pieces else None


# A load's bars repeat their descriptions: each is read once (bounded).
_DESCS: dict[bytes, tuple[str, str, str]] = {}
_CACHE_MAX = 4096


def bar_desc(desc_b: bytes) -> tuple[str, str, str]:
    """A bar's description as builders.py reads it: (desc, bar kind, unit)."""
    got = _DESCS.get(desc_b)
    if got is None:
        if len(_DESCS) >= _CACHE_MAX:
            _DESCS.clear()
        desc = desc_b.decode().strip()
        kind = bar_kind(desc)
        got = _DESCS[desc_b] = (desc, kind, bar_unit(desc, kind))
    return got


def _build(cls: type[Any], names: tuple[str, ...], values: tuple[Any, ...]) -> Any:
    """`object.__new__(cls)` with its fields set (a frozen dataclass's own way bypassed); the
    same in C is `_kvrun.c`'s `build`."""
    event = object.__new__(cls)
    any(map(object.__setattr__, repeat(event), names, values))
    return event


def bar_event(
    pair: BarPair, offset: int, process: tuple[str, int], ts: float | None
) -> ShardProgress:
    """The `ShardProgress` of a `bar_pair`, as builders.py's `_progress` makes it."""
    desc, kind, unit = bar_desc(pair[3])
    values = (desc, kind, *pair[4:9], unit, offset, ts, *process)
    return build(ShardProgress, _PROGRESS_FIELDS, values)  # type: ignore[no-any-return]


def same_bar(a: ShardProgress, b: ShardProgress) -> bool:
    """Equal but for the time (the stream gives it after)."""
    return all(getattr(a, f) == getattr(b, f) for f in _PROGRESS_FIELDS if f != "ts")


def _native() -> Any:
    try:
        from loadwatch.parsers.vllm import _kvrun
    except ImportError:  # built without a C compiler: the Python search, same result
        return None
    return _kvrun


_NATIVE = _native()
NATIVE_KV_RUN: Callable[[bytes, int], Any] | None = _NATIVE.kv_run if _NATIVE else None
best_kv_run: Callable[[bytes, int], Any] = NATIVE_KV_RUN if NATIVE_KV_RUN is not None else kv_run
best_load_run: Callable[[bytes, int], Any] = _NATIVE.load_run if _NATIVE else load_run
build: Callable[[type[Any], tuple[str, ...], tuple[Any, ...]], Any] = (
    _NATIVE.build if _NATIVE else _build
)
RUN_NEEDLE = b"_scale in the checkpoint (e.g. "  # in every record a run can start with


_RUN_FIELDS = (
    "offset",
    "ts",
    "process",
    "pid",
    "count",
    "last_offset",
    "last_ts",
    "scales",
    "layers",
    "processes",
    "checkpoint_name",
    "model_name",
)
assert set(_RUN_FIELDS) == {f.name for f in fields(KvScaleRun)}, "KvScaleRun changed"


def run_event(
    got: KvRunResult, start: int, base: int, stamp: Callable[[bytes], float | None]
) -> KvScaleRun:
    """The `KvScaleRun` of the `kv_run` result `got` for the run from `start` in a chunk at
    offset `base`; `stamp`: the stream's stamp resolver."""
    _end, count, last_start, first_stamp, last_stamp, ckpt, model, scales, procs, layers = got
    values = (
        base + start,
        stamp(first_stamp),
        procs[0][0],
        procs[0][1],
        count,
        base + last_start,
        stamp(last_stamp),
        scales,
        layers,
        procs,
        ckpt,
        model,
    )
    return build(KvScaleRun, _RUN_FIELDS, values)  # type: ignore[no-any-return]
