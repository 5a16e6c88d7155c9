"""The event feed's folded lines: k/v scale warnings back to back in a run's effects are one
`log.kv_scale_run` line that lists each record's offset and time and sums the rest; anything
else between them ends one; a run of one is the record's own line. Only the rendering folds:
the events are the parser's, one per record."""

from __future__ import annotations

import io
import json
from pathlib import Path

from loadwatch.daemon.eventfeed import EventFeed
from loadwatch.daemon.sources.log.source import Run
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import ChunkScanner, EventStream, KvScaleWarning, ShardProgress

# tests/fixtures/v1-2026-sm120.log: two workers' warnings for layer 1, the weights bar between
KV = (
    "({w} pid={pid}) WARNING 01-28 00:12:58 [weight_utils.py:1398] Found {s}_scale in the "
    "checkpoint (e.g. language_model.model.layers.{n}.self_attn.{s}_scale), but not found the "
    "expected name in the model (e.g. language_model.model.layers.{n}.self_attn.mla_attn."
    "{s}_scale). {s}_scale is not loaded.\n"
)
BAR = (
    "(Worker_TP0 pid=51300) \rLoading safetensors checkpoint shards:   1% Completed | 2/119 "
    "[00:17<16:50, 8.64s/it]\n"
)


def _lines(tmp: Path, log: str) -> list[dict[str, object]]:
    events = ChunkScanner(EventStream(ref_ts=1.8e9)).feed(log.encode())
    eventlog = EventLog(io.StringIO(), tmp / "events.jsonl", console=False)
    out = EventFeed(eventlog).effects(Run("1:2", 0, len(log), events, False, "new", 0.0))
    for ev in events:
        out.event(ev)
    out.close()
    eventlog.close()
    return [json.loads(x) for x in (tmp / "events.jsonl").read_text().splitlines()]


def test_warnings_back_to_back_are_one_line_listing_each_record(tmp_path: Path) -> None:
    log = "".join(
        KV.format(w=f"Worker_TP{w}", pid=51300 + w, s=s, n=n)
        for n in (1, 2)
        for w in (0, 1)
        for s in "kv"
    )
    events = ChunkScanner(EventStream(ref_ts=1.8e9)).feed(log.encode())
    assert len(events) == 8 and all(type(e) is KvScaleWarning for e in events)
    (line,) = _lines(tmp_path, log)
    assert line["event"] == "log.kv_scale_run" and line["count"] == 8
    assert line["offsets"] == [e.offset for e in events]
    assert line["record_ts"] == [e.ts for e in events]
    assert (line["offset"], line["last_offset"]) == (events[0].offset, events[-1].offset)
    assert line["layers"] == [[1, 4], [2, 4]] and line["scales"] == ["k", "v"]
    assert line["processes"] == [["Worker_TP0", 51300], ["Worker_TP1", 51301]]
    assert line["checkpoint_name"] == "language_model.model.layers.1.self_attn.k_scale"


def test_another_line_between_ends_a_fold_and_a_fold_of_one_is_the_records_line(
    tmp_path: Path,
) -> None:
    k = KV.format(w="Worker_TP0", pid=51300, s="k", n=3)
    v = KV.format(w="Worker_TP0", pid=51300, s="v", n=3)
    lines = _lines(tmp_path, k + v + BAR + k)
    assert [e["event"] for e in lines] == [
        "log.kv_scale_run",
        f"log.{ShardProgress.type}",
        "log.kv_scale_warning",
    ]
    assert lines[0]["count"] == 2 and lines[2]["layer"] == 3 and lines[2]["scale"] == "k"
