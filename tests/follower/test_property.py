"""Property: however the writes are split and the reads interleaved, the records are the same."""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.follower import LogFollower

Item = tuple[str, int, bytes]  # ("data", 0, bytes) runs merged, or ("cut", offset, data)

body = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"_").replace(b"\r", b"_"))
terminator = st.sampled_from([b"\n", b"\r\n", b"\r"])
record = st.tuples(body, terminator).map(lambda t: t[0] + t[1])


def canonical(chunks: list[Chunk]) -> list[Item]:
    """Cut records by offset; runs of file bytes merged, so read boundaries do not show."""
    out: list[Item] = []
    for c in chunks:
        if c.cut:
            out.append(("cut", c.offset, c.data))
        elif out and out[-1][0] == "data":
            out[-1] = ("data", 0, out[-1][2] + c.data)
        else:
            out.append(("data", 0, c.data))
    return out


def reference(content: bytes, cap: int) -> list[Item]:
    """The records of `content` by definition: a record longer than `cap` is cut."""
    chunks: list[Chunk] = []
    pos = 0
    while True:
        ends = [i for i in (content.find(b"\n", pos), content.find(b"\r", pos)) if i >= 0]
        if not ends:
            return canonical(chunks)
        end = min(ends) + 1
        rec = content[pos:end]
        if len(rec) > cap:
            chunks.append(Chunk(rec[:cap] + b"\n", pos, "", end, True))
        else:
            chunks.append(Chunk(rec, pos, "", end, False))
        pos = end


def read_all(f: LogFollower) -> list[Chunk]:
    out = f.read()
    while f.backlog:
        out += f.read()
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record, max_size=30),
    tail=body,
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
    reads=st.lists(st.booleans(), max_size=31),
    cap=st.integers(min_value=1, max_value=48),
    read_factor=st.integers(min_value=1, max_value=4),
)
def test_any_split_of_the_writes_gives_the_same_records(
    records: list[bytes],
    tail: bytes,
    cuts: list[int],
    reads: list[bool],
    cap: int,
    read_factor: int,
) -> None:
    content = b"".join(records) + tail
    points = sorted({c % (len(content) + 1) for c in cuts} | {0, len(content)})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "vllm.log"
        path.write_bytes(b"")
        live = LogFollower(path, cap_bytes=cap, max_read_bytes=cap * read_factor)
        got: list[Chunk] = []
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for i, (a, b) in enumerate(itertools.pairwise(points)):
                os.write(fd, content[a:b])
                if i < len(reads) and reads[i]:
                    got += read_all(live)
        finally:
            os.close(fd)
        got += read_all(live)
        whole = read_all(LogFollower(path, cap_bytes=cap, max_read_bytes=cap * read_factor))

        expect = reference(content, cap)
        assert canonical(got) == expect
        assert canonical(whole) == expect
        for a, b in itertools.pairwise(got):
            assert b.offset == a.next_offset
        pos = live.position()  # the held partial record is where reading goes on
        assert pos is not None and pos.offset == len(content) - len(tail)
