"""Log grammars: records in, typed events out. The only home of regular expressions.

What any grammar is made of lives here (events.py, entries.py, dispatch.py, recipes.py,
bars.py, traceback.py, wrapped.py, the chunk scanner and the grammar seam); each engine's
grammar is a folder (vllm/).
"""

from loadwatch.parsers.events import (
    Event,
    Failure,
    KvScaleWarning,
    LogError,
    LogWarning,
    Milestone,
    Record,
    ScaleFactorWarning,
    ShardProgress,
    StallHint,
    event_from_dict,
)
from loadwatch.parsers.scan import ChunkScanner, split_records
from loadwatch.parsers.vllm.stream import EventStream

__all__ = [
    "ChunkScanner",
    "Event",
    "EventStream",
    "Failure",
    "KvScaleWarning",
    "LogError",
    "LogWarning",
    "Milestone",
    "Record",
    "ScaleFactorWarning",
    "ShardProgress",
    "StallHint",
    "event_from_dict",
    "split_records",
]
