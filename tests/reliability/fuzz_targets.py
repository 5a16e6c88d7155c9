"""Fuzz targets shared by the hypothesis tests and the atheris harness: bytes in, no exception
out, and the properties that must hold whatever the bytes.

- `parse_target`: a log's bytes through the parser, record by record and through the chunk
  scanner at a given chunk size: no exception, the same events both ways, every event inside
  the input and writable to the event log as JSON.
- `follow_target`: a log written to a real file in pieces, read by the follower between pieces
  with a small record cap, and the chunks fed to the chunk scanner as the daemon does: the
  records are the file's records (cut at the cap), in order, each once, and the events are
  those of the same records parsed one by one.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.follower import LogFollower
from loadwatch.parsers import ChunkScanner, Event, EventStream
from tests.follower.test_property import canonical, read_all, reference
from tests.parsers.golden import REF_TS, events_of, scanned

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def parse_target(data: bytes, chunk: int) -> int:
    events = events_of(data)
    assert scanned(data, max(1, chunk)) == events  # the C candidate search, when built
    assert scanned(data, max(1, chunk), native=False) == events  # the Python one
    for e in events:
        assert 0 <= e.offset <= len(data), e
        json.dumps(e.to_dict())
    return len(events)


def _comparable(events: list[Event]) -> list[dict[str, object]]:
    # a cut record is shorter than the file's: offsets after it differ between the two readings
    return [
        {k: v for k, v in e.to_dict().items() if k not in ("offset", "last_offset")} for e in events
    ]


def follow_target(content: bytes, cuts: list[int], cap: int, workdir: Path, n: int) -> int:
    cap = max(1, cap)
    points = sorted({c % (len(content) + 1) for c in cuts} | {0, len(content)})
    path = workdir / f"log-{n}"
    path.write_bytes(b"")
    follower = LogFollower(path, cap_bytes=cap, max_read_bytes=cap * 2)
    scanner = ChunkScanner(EventStream(ref_ts=REF_TS))
    got: list[Chunk] = []
    events: list[Event] = []
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        for a, b in itertools.pairwise(points):
            os.write(fd, content[a:b])
            for c in read_all(follower):
                got.append(c)
                events += scanner.feed(c.data, c.offset, c.file_id)
    finally:
        os.close(fd)
        follower.close(checkpoint=False)
        path.unlink()
    events += scanner.stream.flush()
    assert canonical(got) == reference(content, cap)
    for a, b in itertools.pairwise(got):
        assert b.offset == a.next_offset
    records = b"".join(c.data for c in got)
    assert _comparable(events) == _comparable(events_of(records))
    return len(got)


def seeds(max_len: int = 4096, count: int = 64) -> list[bytes]:
    """Pieces of the recorded vLLM logs, to start the fuzzers from real input."""
    out = []
    rng = random.Random(1)
    logs = sorted(FIXTURES.glob("*.log"))
    for i in range(count):
        data = logs[i % len(logs)].read_bytes()
        start = rng.randrange(0, max(1, len(data) - max_len))
        out.append(data[start : start + rng.randrange(64, max_len)])
    return out


def mutate(data: bytes, rng: random.Random, rounds: int) -> bytes:
    """Byte-level mutations of a real log: flips, inserted terminators, cut and doubled spans."""
    buf = bytearray(data)
    for _ in range(rounds):
        if not buf:
            buf += b"\n"
        i = rng.randrange(len(buf))
        op = rng.randrange(7)
        if op == 0:
            buf[i] = rng.randrange(256)
        elif op == 1:
            buf[i:i] = rng.choice([b"\r", b"\n", b"\r\n", b"\x00", b"\x1b[1;36m", b"\xff"])
        elif op == 2:
            del buf[i : i + rng.randrange(1, 64)]
        elif op == 3:
            j = min(len(buf), i + rng.randrange(1, 200))
            buf[i:i] = buf[i:j] * rng.randrange(1, 20)
        elif op == 4:
            buf[i:i] = rng.choice([b"(Worker_TP0 pid=1) ", b"pid=", b"(", b")", b":", b"%", b"|"])
        elif op == 5:
            buf[i:i] = str(rng.randrange(10**12)).encode() * rng.randrange(1, 30)
        else:
            buf[i:i] = b"Traceback (most recent call last):\n"
    return bytes(buf)
