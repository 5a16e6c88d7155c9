"""Hostile records for every pattern of the grammar parse in linear time (bench/adversarial.py).

Every catalog entry and every other pattern of the parser has a sample record that reaches it
(checked here: the pattern matches its sample, and a catalog sample yields an event), and each
sample is mutated into 32 KiB records: runs of each kind of character blown up, near matches
repeated, the record repeated, junk after it, nested process prefixes. A backtracking pattern
is quadratic or worse on such input: at 32 KiB, seconds to hours. So each record must parse
within 25 times the time a plain warning of the same size takes, measured in the same run (with
two more tries before a case fails, for a busy machine). The bench prints the 1 MiB figures.
"""

from __future__ import annotations

import time

from bench.adversarial import (
    ENTRY_BODIES,
    _parse_time,
    mutations,
    plain_time,
    run,
    targets,
)
from loadwatch.parsers import ChunkScanner, EventStream, Failure
from loadwatch.parsers.vllm.catalog import CATALOG

SIZE = 32 << 10
RATIO = 25.0


def test_every_pattern_has_a_sample_that_reaches_it() -> None:
    names = {t.name for t in targets()}
    assert {e.id for e in CATALOG} <= names
    assert set(ENTRY_BODIES) == {e.id for e in CATALOG}
    for t in targets():
        # a catalog pattern is searched in the message, the others in the record
        assert t.pattern.search(ENTRY_BODIES.get(t.name, t.records[-1])), t.name
        scanner = ChunkScanner(EventStream())
        events = scanner.feed("".join(r + "\n" for r in t.records).encode())
        events += scanner.stream.flush()
        if t.name in ENTRY_BODIES:
            assert events, f"{t.name}: its sample gives no event"
        if t.name.startswith("classify."):  # the failure is named by that pattern
            kinds = [e.kind for e in events if isinstance(e, Failure)]
            assert kinds == [t.name.removeprefix("classify.")], (t.name, kinds)
        assert len(list(mutations(t.records[-1], 1000))) >= 8


def test_hostile_records_parse_in_linear_time() -> None:
    floor = plain_time(SIZE)
    t0 = time.perf_counter()
    results = run(SIZE, search=False)
    took = time.perf_counter() - t0
    by_name = {t.name: t for t in targets()}
    slow = []
    for r in results:
        if r.parse_s > RATIO * floor + 0.005:
            t = by_name[r.target]
            record = dict(mutations(t.records[-1], SIZE))[r.mutation]
            again = min(_parse_time(t, record) for _ in range(2))
            if again > RATIO * floor + 0.005:
                slow.append(f"{r.target}: {r.mutation}: {again * 1e3:.1f} ms")
    worst = max(results, key=lambda r: r.parse_s)
    print(
        f"\n{len(results)} hostile records of {SIZE >> 10} KiB in {took:.1f} s; "
        f"plain {floor * 1e3:.2f} ms; worst {worst.parse_s * 1e3:.2f} ms "
        f"({worst.target}: {worst.mutation})"
    )
    assert len({r.target for r in results}) == len(targets())
    assert not slow, f"slower than {RATIO:g} x a plain warning: {slow}"
