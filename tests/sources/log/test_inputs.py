"""`open_input`, the one factory of log inputs: `[log] input` picks the implementation."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.follower import LogFollower
from loadwatch.daemon.sources.log.inputs import (
    ContainerInput,
    FileInput,
    InputError,
    JournalInput,
    open_input,
)
from loadwatch.daemon.sources.log.journal import JournalSource
from tests.logformats import runtimes

# vLLM's own line (vllm/entrypoints/openai/api_server.py, "Starting vLLM API server")
LINE = (
    b"INFO 12-01 10:00:00 [api_server.py:1043] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
)


@pytest.mark.parametrize(
    ("kind", "data", "want", "read"),
    [
        ("auto", LINE, FileInput, LINE),
        ("auto", runtimes.cri(LINE), ContainerInput, LINE),  # by the first line
        ("auto", runtimes.docker(LINE), ContainerInput, LINE),
        ("file", runtimes.cri(LINE), FileInput, runtimes.cri(LINE)),  # as said, read as it is
        ("docker", runtimes.docker(LINE), ContainerInput, LINE),
    ],
)
def test_the_input_is_the_one_the_key_names(
    tmp_path: Path, kind: str, data: bytes, want: type, read: bytes
) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(data)
    made = open_input(kind, log, state_dir=tmp_path / "state", mode="poll")
    try:
        assert type(made) is want
        assert b"".join(c.data for c in made.read()) == read
    finally:
        made.close(checkpoint=False)


def test_a_plain_file_is_read_by_the_follower_itself() -> None:
    """The hot path: nothing added per record between the follower and the source."""
    assert FileInput.read is LogFollower.read


def test_the_journal_input_follows_the_pumps_spool_and_says_in_one_line_when_it_cannot_run(
    tmp_path: Path,
) -> None:
    source = JournalSource("vllm.service", journalctl=str(tmp_path / "no-journalctl"))
    made = open_input("auto", None, state_dir=tmp_path, journal=source, mode="poll")
    assert isinstance(made, JournalInput)
    assert made.path == tmp_path / "journal" / "vllm.log"
    with pytest.raises(InputError) as info:
        made.open()
    assert str(info.value).startswith("[log] journal_unit: cannot run ")
    assert "\n" not in str(info.value)
    made.close(checkpoint=False)
