"""`joined`: the follower's chunks of one file handed over in larger pieces, as the log source
hands them to the scanner. The bytes, offsets and order are the file's; a cut record, another
file or a gap is never joined; the scanner reads the same events either way."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from loadwatch.daemon.sources.inputs import Chunk, joined
from loadwatch.daemon.sources.log.follower import LogFollower
from loadwatch.parsers import ChunkScanner, EventStream
from tests.perf.logs import load_log


def read_all(path: Path, cap: int) -> list[Chunk]:
    """Every chunk, each of one read of at most `cap` bytes (as the follower reads without the
    C scanner, or where a record longer than the cap is)."""
    f = LogFollower(path, cap_bytes=cap, max_read_bytes=cap)
    out: list[Chunk] = []
    while True:
        out += f.read()
        if not f.backlog:
            return out


def events(chunks: list[Chunk]) -> list[object]:
    scanner = ChunkScanner(EventStream(ref_ts=1.8e9))
    return [ev for c in chunks for ev in scanner.feed(c.data, c.offset, c.file_id)]


def test_a_load_log_is_read_alike_in_pieces_of_any_size(tmp_path: Path) -> None:
    path = tmp_path / "vllm.log"
    path.write_bytes(load_log()[0])
    chunks = read_all(path, 64 * 1024)
    want = events(chunks)
    for limit in (1, 100_000, 256 * 1024, 1 << 30):
        got = joined(chunks, limit)
        assert b"".join(c.data for c in got) == b"".join(c.data for c in chunks)
        assert all(len(c.data) <= max(limit, 64 * 1024) for c in got)
        assert [(c.offset, c.next_offset) for c in got] == [
            (c.offset, c.next_offset) for c in got if c.offset + len(c.data) == c.next_offset
        ]
        assert events(got) == want
    assert len(joined(chunks)) < len(chunks) / 3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 50), st.sampled_from(["a", "b"]), st.booleans(), st.booleans()),
        max_size=30,
    ),
    st.integers(1, 200),
)
def test_only_back_to_back_whole_chunks_of_one_file_are_joined(
    spec: list[tuple[int, str, bool, bool]], limit: int
) -> None:
    chunks: list[Chunk] = []
    at: dict[str, int] = {}
    for size, file_id, cut, gap in spec:
        start = at.get(file_id, 0) + (7 if gap else 0)
        data = b"x" * (size - 1) + b"\n"
        end = start + size + (100 if cut else 0)  # a cut record's data is not the file's bytes
        chunks.append(Chunk(data, start, file_id, end, cut))
        at[file_id] = end
    got = joined(chunks, limit)
    # every byte once, in order; each piece one file's bytes from its offset to its next offset
    assert b"".join(c.data for c in got) == b"".join(c.data for c in chunks)
    pos = 0
    for piece in got:
        parts = []
        while sum(len(p.data) for p in parts) < len(piece.data):
            parts.append(chunks[pos])
            pos += 1
        assert piece.data == b"".join(p.data for p in parts)
        assert (piece.offset, piece.file_id, piece.next_offset) == (
            parts[0].offset,
            parts[0].file_id,
            parts[-1].next_offset,
        )
        if len(parts) > 1:
            assert len(piece.data) <= limit and not piece.cut
            for a, b in pairwise(parts):
                assert not a.cut and not b.cut and a.file_id == b.file_id
                assert a.next_offset == b.offset == a.offset + len(a.data)
    assert pos == len(chunks)
