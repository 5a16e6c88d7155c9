"""docs/config.md is the reader's own schema: every key the config reader takes is described,
nothing described is gone, the page is what the generator writes, and the example configs use
only real keys (their commented-out keys too)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import parse_config
from loadwatch.daemon.config_reference import DOCS, keys, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "systemd").glob("*.toml.example"))


def test_every_key_the_reader_takes_is_described() -> None:
    refs = [k.ref for k in keys()]
    assert len(refs) >= 40 and len(set(refs)) == len(refs)
    assert [r for r in refs if not DOCS.get(r, "").strip()] == []
    assert sorted(set(DOCS) - set(refs)) == []  # nothing described that the reader dropped


def test_the_page_is_generated() -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == render(), "regenerate: python -m loadwatch.daemon.config_reference"
    for k in keys():
        assert f"| `{k.name}` |" in page


def _flat(table: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for name, value in table.items():
        if isinstance(value, dict) and not prefix and name != "env":
            out += _flat(value, name)
        else:
            out.append(f"[{prefix}] {name}" if prefix else name)
    return out


def test_examples_use_real_keys_and_parse() -> None:
    assert len(EXAMPLES) >= 2
    refs = {k.ref for k in keys()}
    for example in EXAMPLES:
        text = example.read_text()
        data = tomllib.loads(text)
        parse_config(data)  # every example is a valid config
        assert set(_flat(data)) <= refs, example.name
        # Keys shown commented out (`#key = ...`) are real keys too, in the table they sit in.
        table = ""
        for line in text.splitlines():
            if m := re.match(r"^\[(\w+)\]", line):
                table = m.group(1)
            elif m := re.match(r"^#\s?(\w+) = ", line):
                ref = f"[{table}] {m.group(1)}" if table else m.group(1)
                assert ref in refs, f"{example.name}: {line}"
