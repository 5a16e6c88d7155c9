"""The vLLM grammar, as the chunk scanner takes it (parsers/grammar.py): its scan plans
(plans.py), its quiet records, its process prefixes, and its event stream (stream.py)."""

from __future__ import annotations

from loadwatch.parsers.grammar import Grammar
from loadwatch.parsers.vllm.plans import PLANS, quiet_record
from loadwatch.parsers.vllm.segment import PREFIX_RECORD_MAX
from loadwatch.parsers.vllm.stream import EventStream

GRAMMAR = Grammar(
    name="vllm",
    plans=PLANS,
    new_stream=lambda ref_ts: EventStream(ref_ts=ref_ts),
    quiet_modes=frozenset({"serving"}),  # once vLLM serves: request echoes at INFO
    quiet_record=quiet_record,
    native_quiet=True,  # _scan.c's quiet test is vLLM's header shape
    prefix_marker=b"pid=",  # `(EngineCore_DP0 pid=123) ` alone in its record
    prefix_record_max=PREFIX_RECORD_MAX,
)
