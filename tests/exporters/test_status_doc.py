"""docs/status.md names every field /status returns, and nothing it does not."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from loadwatch.daemon.state.snapshot import SessionView, Snapshot

DOC = Path(__file__).resolve().parents[2] / "docs" / "status.md"


def _block() -> str:
    text = DOC.read_text()
    return text.split("```", 2)[1]


def test_top_level_keys_match() -> None:
    top = _block().split("\nsession:\n", 1)[0]
    documented = {m.group(1) for m in re.finditer(r"^([a-z_]+)(?:\[\])?\s", top, re.M)}
    assert documented == {f.name for f in dataclasses.fields(Snapshot)}


def test_session_fields_are_all_named() -> None:
    block = _block()
    session_part = block.split("\nsession:\n", 1)[1].split("\nsessions[] (summaries):", 1)[0]
    words = set(re.findall(r"\b([a-z_]+)(?:\[\])?\b", session_part))
    missing = {f.name for f in dataclasses.fields(SessionView)} - words
    assert missing == set()
