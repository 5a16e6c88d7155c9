"""The vLLM log grammar: records in, typed events out. The only home of regular expressions."""

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
