"""Fuzzing the parser and the follower's record splitting: zero exceptions, properties kept.

Three fuzzers over the targets of fuzz_targets.py, bounded here and long in `make fuzz`:

- hypothesis, on real vLLM log pieces mutated byte by byte (flips, stray terminators and NULs,
  cut and doubled spans, digit floods, prefixes and tracebacks thrown in), through the parser
  record by record and through the chunk scanner with each candidate search (C and Python);
- hypothesis, on arbitrary logs written to a real file in arbitrary pieces, through the follower
  with a small record cap and on into the chunk scanner;
- atheris (libFuzzer, coverage-guided) over both, for `LOADWATCH_FUZZ_S` seconds (8 here),
  seeded with pieces of the recorded logs. Skipped when atheris is not installed.

`LOADWATCH_FUZZ_EXAMPLES` sets the hypothesis examples (200 here).
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.fuzz_targets import follow_target, mutate, parse_target, seeds
from tests.reliability.proc import REPO

EXAMPLES = int(os.environ.get("LOADWATCH_FUZZ_EXAMPLES", "200"))
FUZZ_S = int(os.environ.get("LOADWATCH_FUZZ_S", "8"))
SEEDS = seeds()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
@given(
    seed=st.sampled_from(range(len(SEEDS))),
    rng=st.randoms(use_true_random=False),
    rounds=st.integers(min_value=0, max_value=60),
    chunk=st.integers(min_value=1, max_value=600),
)
def test_parser_on_mutated_real_logs(
    seed: int, rng: random.Random, rounds: int, chunk: int
) -> None:
    parse_target(mutate(SEEDS[seed], rng, rounds), chunk)


# Inputs the fuzzers once failed on, kept whole (the seeds above move with every fixture added):
# found/client-header-across-traceback-*: mutated pieces of real-v0.32-client-text.log, where
# the chunk scanner and the record-by-record parse read a record after a traceback's start
# differently (the request logger's header of client text that only one of them had seen).
FOUND = sorted((Path(__file__).parent / "found").glob("*.bin"))


@pytest.mark.parametrize("path", FOUND, ids=lambda p: p.stem)
def test_parser_on_inputs_the_fuzzers_found(path: Path) -> None:
    data = path.read_bytes()
    for chunk in (1, 7, 64, 1 << 16):
        parse_target(data, chunk)


_piece = st.one_of(
    st.binary(max_size=60),
    st.sampled_from(
        [
            b"\n",
            b"\r",
            b"\r\n",
            b"\x00",
            b"(Worker_TP0 pid=3) ",
            b"Traceback (most recent call last):\n",
        ]
    ),
    st.sampled_from(SEEDS).map(lambda s: s[:300]),
)


@settings(
    max_examples=max(20, EXAMPLES // 4),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    database=None,
)
@given(
    pieces=st.lists(_piece, max_size=25),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
    cap=st.integers(min_value=1, max_value=96),
)
def test_follower_splitting_into_the_parser(pieces: list[bytes], cuts: list[int], cap: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        follow_target(b"".join(pieces), cuts, cap, Path(d), 0)


@pytest.mark.slow  # bounded: see the module docstring
def test_atheris_over_both_targets(tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install atheris)")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, s in enumerate(SEEDS):
        (corpus / f"parse-{i}").write_bytes(b"\x00\x40" + s)
        (corpus / f"follow-{i}").write_bytes(b"\x01\x20\x00" + s[:1024])
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.fuzz_atheris",
            f"-max_total_time={FUZZ_S}",
            "-max_len=16384",
            "-timeout=10",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
        ],
        cwd=REPO,
        env={**os.environ, "LOADWATCH_FUZZ_DIR": str(work)},
        capture_output=True,
        text=True,
        timeout=FUZZ_S + 120,
    )
    tail = out.stderr[-3000:]
    assert out.returncode == 0, tail
    done = re.search(r"Done (\d+) runs in (\d+) second", out.stderr)
    assert done, tail
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "timeout-"))]
    assert not crashes
    print(f"\natheris: {done.group(1)} inputs in {done.group(2)} s, no crash")
