"""The checkpoint store on its own: round trip, refusal of bad files, atomic replacement."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loadwatch.daemon.sources.log.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    checkpoint_name,
)


def test_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state", "/var/log/vllm.log")
    assert store.load() is None
    cp = Checkpoint("/var/log/vllm.log", "1:2:3:0123456789abcdef", 42, {"s": {"o": 1}}, 1.5)
    store.save(cp)
    assert store.load() == cp
    assert (tmp_path / "state").stat().st_mode & 0o777 != 0
    assert oct(store.file.stat().st_mode & 0o777) == "0o600"


def test_names_differ_per_path_and_are_stable() -> None:
    assert checkpoint_name("/a/vllm.log") == checkpoint_name("/a/../a/vllm.log")
    assert checkpoint_name("/a/vllm.log") != checkpoint_name("/b/vllm.log")


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"version": 2, "file_id": "x", "offset": 1}',
        '{"version": 1, "file_id": 5, "offset": 1}',
        '{"version": 1, "file_id": "x", "offset": -1}',
        '{"version": 1, "file_id": "x", "offset": 1, "extra": []}',
        '{"version": 1, "offset": 1}',
    ],
)
def test_bad_files_are_refused_with_one_line(tmp_path: Path, text: str) -> None:
    store = CheckpointStore(tmp_path, "/x.log")
    store.file.write_text(text)
    with pytest.raises(CheckpointError) as e:
        store.load()
    assert "\n" not in str(e.value) and str(store.file) in str(e.value)


def test_extra_that_is_not_json_is_refused_and_the_old_file_kept(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "/x.log")
    good = Checkpoint("/x.log", "1:2:3:0123456789abcdef", 1, {})
    store.save(good)
    with pytest.raises(CheckpointError, match="not JSON"):
        store.save(Checkpoint("/x.log", "1:2:3:0123456789abcdef", 2, {"bad": object()}))
    assert store.load() == good
    assert os.listdir(tmp_path) == [store.file.name]


def test_save_replaces_by_rename(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, "/x.log")
    store.save(Checkpoint("/x.log", "1:2:3:0123456789abcdef", 1, {}))
    before = store.file.stat().st_ino
    store.save(Checkpoint("/x.log", "1:2:3:0123456789abcdef", 2, {}))
    assert store.file.stat().st_ino != before  # a new file renamed over, never rewritten
    assert json.loads(store.file.read_text())["offset"] == 2
