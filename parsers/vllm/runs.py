"""A run read as events: the stream's side of kvrun.py's `load_run`.

kvrun.py finds, from a k/v scale warning record, the run of such records and of the weights
bar's records drawn between them; here each stretch of warnings becomes one `KvScaleRun` and
each bar record the `ShardProgress` that feeding it (and the lone prefix before it) would give,
with the stream's context (the bar's owner, its time from its own elapsed field) applied by
the stream's own methods. A bar is built from `load_run`'s fields only once the general parse
of the first record with its description agreed with them (tests/parsers/test_kv_run.py feeds
the same records both ways and compares events and stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from loadwatch.parsers.events import Event, ShardProgress
from loadwatch.parsers.vllm.builders import _PROGRESS_FIELDS
from loadwatch.parsers.vllm.kvrun import (
    BarPair,
    KvRunResult,
    bar_desc,
    bar_event,
    best_kv_run,
    best_load_run,
    build,
    kv_run,
    load_run,
    run_event,
    same_bar,
)
from loadwatch.parsers.vllm.segment import PREFILTER, has_needle

if TYPE_CHECKING:
    from loadwatch.parsers.vllm.stream import EventStream

CACHE_MAX = 4096  # prefixes and descriptions read (bounded: a long-lived daemon sees many)

# The modes in which a bar record is a candidate (holds a needle): only then does a run go on
# across bars, as feeding every candidate would see them.
BAR_MODES = frozenset(m for m in PREFILTER if has_needle("s/it]", m) and has_needle("it/s]", m))


def read_run(
    stream: EventStream, data: bytes, start: int, base: int, native: bool = True
) -> tuple[int, list[Event]] | None:
    """`EventStream.run`: the run's events in record order, and where its last record ends."""
    if stream.mode in BAR_MODES:
        got = (best_load_run if native else load_run)(data, start)
    else:  # bars are no candidates: the warnings alone
        kv = (best_kv_run if native else kv_run)(data, start)
        got = None if kv is None else (kv[0], [(start, kv)])
    if got is None:
        return None
    end, pieces = got
    out: list[Event] = []
    stamp = stream.years.stamp
    warnings = bars = 0  # records of each, counted into the stream's stats once
    for piece in pieces:  # (start, kv_run result) or a bar pair's fields
        if len(piece) == 2:
            at, kv = cast(tuple[int, KvRunResult], piece)
            event = run_event(kv, at, base, stamp)
            warnings += kv[1]
            stream._last_ts = event.last_ts
            out.append(event)
            continue
        pair = cast(BarPair, piece)
        bar = _fast_bar(stream, data, pair, base)
        if bar is not None:
            bars += 1
            out.append(bar)
        else:
            stream._pending_prefix = None
            out += _bar_pair(stream, data, pair, base)
    stream._pending_prefix = None
    stats = stream.stats
    stats.records += warnings + 2 * bars  # a bar's record and the prefix record before it
    stats.candidates += warnings + bars
    stats.events += warnings + bars
    by_type = stats.by_type
    if warnings:
        by_type["kv_scale_warning"] = by_type.get("kv_scale_warning", 0) + warnings
    if bars:
        by_type["shard_progress"] = by_type.get("shard_progress", 0) + bars
    return end, out


def _fast_bar(stream: EventStream, data: bytes, pair: BarPair, base: int) -> Event | None:
    """The `ShardProgress` of a bar pair whose prefix and description are known to read as
    load_run read them (the stream's `_bar_process` and `_timed` applied); None: not known."""
    known = stream._bar_prefixes.get(data[pair[0] : pair[1] - 1])
    if not known or stream._bar_descs.get(pair[3]) is not True:
        return None
    desc, kind, unit = bar_desc(pair[3])
    stream._bar_owner[desc] = known  # (`_bar_process`: this bar's owner)
    ts = stream._last_ts  # (`_timed`)
    elapsed = pair[6]
    if ts is not None and elapsed is not None:
        ts = stream.bar_time(known[0], desc, pair[4], elapsed)
    values = (desc, kind, *pair[4:9], unit, base + pair[1], ts, *known)
    return build(ShardProgress, _PROGRESS_FIELDS, values)  # type: ignore[no-any-return]


def _bar_pair(stream: EventStream, data: bytes, pair: BarPair, base: int) -> list[Event]:
    """The events of a bar record and the prefix record before it, fed as the chunk scanner
    would feed them; and whether its prefix and description read as load_run read them (then
    `_fast_bar` makes the next ones)."""
    ps, b, e, desc_b = pair[:4]
    prefix_b = data[ps : b - 1]
    prefix = prefix_b.decode()
    known = stream._bar_prefixes.get(prefix_b)
    if known is None:
        lone = stream._heads.lone_prefix(prefix)
        known = lone if lone is not None and not has_needle(prefix, stream.mode) else False
        if len(stream._bar_prefixes) >= CACHE_MAX:  # a process per prefix: restarts add more
            stream._bar_prefixes.clear()
        stream._bar_prefixes[prefix_b] = known
    out: list[Event]
    if known is False and has_needle(prefix, stream.mode):
        out = stream.feed_text(prefix, base + ps, True)
    else:
        out = []
        stream.forget_pending()
        stream.plain(prefix)
    got = stream.feed_text(data[b:e].decode(), base + b, True)
    if desc_b not in stream._bar_descs and known is not False:
        fast = bar_event(pair, base + b, known, None)
        if len(stream._bar_descs) >= CACHE_MAX:
            stream._bar_descs.clear()
        stream._bar_descs[desc_b] = (
            len(got) == 1 and type(got[0]) is ShardProgress and same_bar(got[0], fast)
        )
    return out + got
