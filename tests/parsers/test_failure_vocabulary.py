"""The failure vocabulary every grammar emits, and its one ranking."""

from __future__ import annotations

import typing
from pathlib import Path

from loadwatch.parsers import ChunkScanner
from loadwatch.parsers.events import FAILURE_RANK, Failure, FailureKind
from loadwatch.parsers.grammar import available, load

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_the_ranking_orders_every_kind_and_only_them() -> None:
    kinds = typing.get_args(FailureKind)
    assert sorted(FAILURE_RANK) == sorted(kinds)
    ranks = list(FAILURE_RANK.values())
    assert sorted(ranks) == list(range(len(kinds)))  # a strict order: no two kinds tie


def test_the_named_causes_outrank_their_consequences_and_the_unknown() -> None:
    # a root cause that says why beats a death that does not, and those beat "other"; what the
    # log never said (a vanished process) names a crash only when nothing else does
    for cause in ("fp8_kv_unsupported", "cuda_oom", "kv_cache_too_small", "max_model_len", "nccl"):
        assert FAILURE_RANK[cause] < FAILURE_RANK["worker_died"]
        assert FAILURE_RANK[cause] < FAILURE_RANK["engine_init_failed"]
    assert FAILURE_RANK["engine_init_failed"] < FAILURE_RANK["other"] < FAILURE_RANK["vanished"]


def test_every_grammar_emits_kinds_of_the_vocabulary_only() -> None:
    # every real log the tests hold, through each grammar there is
    logs = sorted(FIXTURES.glob("*.log"))
    assert len(logs) > 20
    for name in available():
        grammar = load(name)
        seen = set()
        for log in logs:
            events = ChunkScanner(grammar=grammar).feed(log.read_bytes(), base=0)
            seen |= {e.kind for e in events if isinstance(e, Failure)}
        assert seen <= set(FAILURE_RANK), (name, seen - set(FAILURE_RANK))
        assert {"cuda_oom", "kv_cache_too_small", "other"} <= seen, (name, seen)


def _failures(log: str) -> list[Failure]:
    events = ChunkScanner(grammar=load()).feed((FIXTURES / log).read_bytes(), base=0)
    return [e for e in events if isinstance(e, Failure)]


def test_the_grammar_says_what_a_wrapper_carries_and_what_is_a_consequence() -> None:
    # a real vLLM 0.32 start whose FP8 KV cache the CPU backend refused: the worker's
    # traceback, then EngineCore's `Worker failed with error '<it>', please check ...`
    failures = _failures("real-v0.32-deepseek-fp8kv.log")
    wrapped = [f for f in failures if f.message.startswith("Worker failed with error")]
    assert wrapped, [f.message for f in failures]
    cause = "expected scalar type BFloat16 but found Float8_e4m3fn"
    assert {f.cause for f in wrapped} == {cause}
    assert any(f.message == cause and f.cause is None for f in failures)  # the root's own
    # the records that say something failed elsewhere are consequences, the root is not
    assert any(f.consequence for f in failures)
    assert not any(f.consequence for f in failures if f.message == cause)
    for f in failures:
        if f.kind in ("worker_died", "engine_init_failed"):
            assert f.consequence, f
