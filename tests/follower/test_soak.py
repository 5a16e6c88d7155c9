"""Soak: a million lines through a hundred rotations of mixed kinds, every line once, in order."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.checkpoint import CheckpointStore
from loadwatch.daemon.sources.log.follower import LogFollower
from tests.follower.writer import rotate, write_all
from tests.helpers import wait_for

LINES = 1_000_000
ROTATIONS = 100
BATCH = 400


def soak_line(i: int) -> bytes:
    # every 97th record is a tqdm-style "\r" update, every 89th ends in "\r\n"
    end = "\r" if i % 97 == 0 else "\r\n" if i % 89 == 0 else "\n"
    return f"{i:07d} INFO loading {'#' * (i % 41)}{end}".encode()


@pytest.mark.slow
def test_soak_million_lines_hundred_rotations(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "vllm.log"
    log.parent.mkdir()
    blocks = [LINES * k // (ROTATIONS + 1) for k in range(ROTATIONS + 2)]
    batches = [
        b"".join(soak_line(i) for i in range(s, min(s + BATCH, e)))
        for a, e in itertools.pairwise(blocks)
        for s in range(a, e, BATCH)
    ]
    gen_of_batch = [
        g for g, (a, e) in enumerate(itertools.pairwise(blocks)) for _ in range(a, e, BATCH)
    ]
    expected = b"".join(batches)

    delivered = [0]
    failure: list[BaseException] = []
    kinds = random.Random(7).choices(["rename", "copytruncate", "delete"], k=ROTATIONS)
    f = LogFollower(log, state_dir=tmp_path / "state", poll_interval_s=0.05)

    def writer() -> None:
        try:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            written = 0
            gen = 0
            gen_start = 0
            for batch, g in zip(batches, gen_of_batch, strict=True):
                if g != gen:

                    def seen(start: int = gen_start) -> bool:
                        return delivered[0] > start

                    # Let the follower see this generation before it is rotated away: a file
                    # deleted or copied over twice before anyone looked is lost to any reader.
                    wait_for(seen, f"the follower past byte {gen_start}", 20, every_s=0.0005)
                    fd = rotate(str(log), fd, kinds[gen])
                    gen, gen_start = g, written
                write_all(fd, batch)
                written += len(batch)
            os.close(fd)
        except BaseException as e:  # reported by the test thread
            failure.append(e)

    got = bytearray()
    t = threading.Thread(target=writer, daemon=True)
    started = time.monotonic()
    t.start()
    deadline = started + 55
    while len(got) < len(expected) and time.monotonic() < deadline and not failure:
        for c in f.read():
            assert not c.cut
            got += c.data
        delivered[0] = len(got)
        f.maybe_checkpoint()
        if not f.backlog:
            f.wait(0.05)
    t.join(5)
    took = time.monotonic() - started
    h = f.health()
    f.close()
    assert not failure, failure
    if bytes(got) != expected:
        n = next(
            (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
            min(len(got), len(expected)),
        )
        raise AssertionError(
            f"stream differs at byte {n} of {len(expected)} (got {len(got)}): "
            f"got {bytes(got[n - 40 : n + 40])!r} want {expected[n - 40 : n + 40]!r}"
        )
    assert h.records_total == LINES
    assert h.rotations_total == ROTATIONS
    assert h.truncations_total == kinds.count("copytruncate")
    assert h.errors_total == 0
    saved = CheckpointStore(tmp_path / "state", log).load()  # written by the clean close
    assert saved is not None and saved.file_id == h.file_id
    assert saved.offset == os.path.getsize(log)
    assert took < 55
    print(f"soak: {LINES} lines, {ROTATIONS} rotations in {took:.1f}s")
