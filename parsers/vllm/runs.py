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

from loadwatch.parsers.events import Event, KvScaleRun, ShardProgress
from loadwatch.parsers.vllm.kvrun import (
    BarPair,
    KvRunResult,
    bar_desc,
    bar_event,
    best_kv_run,
    best_load_run,
    kv_run,
    load_run,
    run_event,
    same_bar,
)
from loadwatch.parsers.vllm.segment import PREFILTER, has_needle

if TYPE_CHECKING:
    from loadwatch.parsers.vllm.stream import EventStream

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
    for piece in pieces:  # (start, kv_run result) or a bar pair's fields
        if len(piece) == 2:
            at, kv = cast(tuple[int, KvRunResult], piece)
            out.append(_kv_stretch(stream, kv, at, base))
        else:
            out += _bar_pair(stream, data, cast(BarPair, piece), base)
    return end, out


def _kv_stretch(stream: EventStream, got: KvRunResult, start: int, base: int) -> KvScaleRun:
    event = run_event(got, start, base, stream.years.stamp)
    n = event.count
    stats = stream.stats
    stats.records += n
    stats.candidates += n
    stats.events += n
    stats.by_type["kv_scale_warning"] = stats.by_type.get("kv_scale_warning", 0) + n
    stream._pending_prefix = None
    stream._last_ts = event.last_ts
    return event


def _bar_pair(stream: EventStream, data: bytes, pair: BarPair, base: int) -> list[Event]:
    """The events of a bar record and the prefix record before it, as the chunk scanner would
    feed them."""
    ps, b, e, desc_b = pair[:4]
    prefix = data[ps : b - 1].decode()
    known = stream._bar_prefixes.get(prefix)
    if known is None:
        lone = stream._heads.lone_prefix(prefix)
        known = lone if lone is not None and not has_needle(prefix, stream.mode) else False
        stream._bar_prefixes[prefix] = known
    trusted = stream._bar_descs.get(desc_b)
    if known is False or trusted is not True:
        # the general path: the prefix as the scanner hands it over, then the bar
        out: list[Event]
        if known is False and has_needle(prefix, stream.mode):
            out = stream.feed_text(prefix, base + ps, True)
        else:
            out = []
            stream.forget_pending()
            stream.plain(prefix)
        got = stream.feed_text(data[b:e].decode(), base + b, True)
        if trusted is None and known is not False:
            fast = bar_event(pair, base + b, known, None)
            stream._bar_descs[desc_b] = (
                len(got) == 1 and type(got[0]) is ShardProgress and same_bar(got[0], fast)
            )
        return out + got
    stats = stream.stats
    stats.records += 2
    stats.candidates += 1
    stats.events += 1
    stats.by_type["shard_progress"] = stats.by_type.get("shard_progress", 0) + 1
    stream._pending_prefix = None
    name = bar_desc(desc_b)[0]
    stream._bar_owner[name] = known  # (the stream's `_bar_process`: this bar's owner)
    ts = stream._last_ts  # (the stream's `_timed`)
    elapsed = pair[6]
    if ts is not None and elapsed is not None:
        ts = stream.bar_time(known[0], name, pair[4], elapsed)
    return [bar_event(pair, base + b, known, ts)]
