"""Runs of plain k/v scale warnings, recognised without parsing each record.

A Kimi-K2.5-shaped load writes a `Found k_scale in the checkpoint (e.g. ...)` warning per layer,
scale and worker: nearly every record of its log. Of a run of them back to back the state needs
counts, layers, scales and processes, and the event log one line. `kv_run` recognises a run of
records of the one strict shape vLLM prints (weight_utils.py's message, one `(NAME pid=N)`
prefix, a bracketed WARNING header whose stamp is a real date, nothing else after the message
but its own `. X_scale is not loaded.`), stopping at the first record of any other shape or
whose stamp goes back. Whatever it accepts, the event stream parses to one `KvScaleWarning` with
the same fields (tests/parsers/test_kv_run.py); anything else takes the usual path. The same
search in C is `_scan.c`'s `kv_run` (tests/perf/test_scan_native.py compares them).

The result: None, or (end of the last record, count, start of the last record, first stamp, last
stamp, first checkpoint name, first model name, scales, processes, layers): scales in order of
first appearance as b"k"/b"v", processes as (name bytes, pid) likewise, layers as
{layer: records}.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from loadwatch.parsers.events import KvScaleRun
from loadwatch.parsers.vllm.catalog import _LAYER

_NAME_CHARS = rb"[\x21-\x27\x2a-\x7e]{0,400}"  # printable ASCII but ( ): the catalog's [^()\s]
KV_RECORD = re.compile(
    rb"\(([A-Za-z][A-Za-z0-9_]{0,63}) pid=([0-9]{1,10})\) WARNING "
    rb"([0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) \[[\x21-\x5c\x5e-\x7e]{1,200}\] "
    rb"Found ([kv])_scale in the checkpoint \(e\.g\. (" + _NAME_CHARS + rb")\), "
    rb"but not found the expected name in the model \(e\.g\. (" + _NAME_CHARS + rb")\)"
    rb"(?:\. [kv]_scale is not loaded\.)?"
)
_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February: 29 may be no date
_TERMINATORS = b"\r\n"

KvRunResult = tuple[
    int,
    int,
    int,
    bytes,
    bytes,
    bytes,
    bytes,
    list[bytes],
    list[tuple[bytes, int]],
    dict[int, int],
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
        if not count:
            first_stamp, first_ckpt, first_model = stamp, m.group(5), m.group(6)
        count += 1
        last_stamp, last_start, end = stamp, s, e
        scale = m.group(4)
        if scale not in scales:
            scales.append(scale)
        proc = (m.group(1), int(m.group(2)))
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
        first_ckpt,
        first_model,
        scales,
        procs,
        layers,
    )


def _native_kv_run() -> Callable[[bytes, int], Any] | None:
    try:
        from loadwatch.parsers.vllm import _kvrun
    except ImportError:  # built without a C compiler: the Python search, same result
        return None
    return _kvrun.kv_run


NATIVE_KV_RUN = _native_kv_run()
best_kv_run: Callable[[bytes, int], Any] = NATIVE_KV_RUN if NATIVE_KV_RUN is not None else kv_run
RUN_NEEDLE = b"_scale in the checkpoint (e.g. "  # in every record a run can start with


def run_event(
    got: KvRunResult, start: int, base: int, stamp: Callable[[bytes], float | None]
) -> KvScaleRun:
    """The `KvScaleRun` of the `kv_run` result `got` for the run from `start` in a chunk at
    offset `base`; `stamp`: the stream's stamp resolver."""
    _end, count, last_start, first_stamp, last_stamp, ckpt, model, scales, procs, layers = got
    processes = tuple((name.decode(), pid) for name, pid in procs)
    return KvScaleRun(
        offset=base + start,
        ts=stamp(first_stamp),
        process=processes[0][0],
        pid=processes[0][1],
        count=count,
        last_offset=base + last_start,
        last_ts=stamp(last_stamp),
        scales=tuple(x.decode() for x in scales),
        layers=tuple(sorted(layers.items())),
        processes=processes,
        checkpoint_name=ckpt.decode(),
        model_name=model.decode(),
    )
