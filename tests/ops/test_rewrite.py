"""The line-based `for:` rewrite that makes the test copy of the alert rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from .common import ALERTS
from .promserver import format_duration, parse_duration, short_rules_copy, shorten_for


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0m", 0.0),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("500ms", 0.5),
        ("2w", 14 * 86400.0),
        ("1y", 365 * 86400.0),
        ("1m30s500ms", 90.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "m", "5 m", "5min", "-5m", "1.5h", "5m "])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration() -> None:
    got = [format_duration(s) for s in (2, 0.5, 0, 1.25, 120)]
    assert got == ["2s", "500ms", "0s", "1250ms", "120s"]
    with pytest.raises(ValueError):
        format_duration(-1)


RULES = """\
groups:
  - name: g
    rules:
      - alert: A
        expr: up == 0
        for: 5m   # keep me
        labels:
          severity: warning
        annotations:
          description: |
            This text mentions
            for: 10m
            and a list:
            - for: 3m
      - alert: B
        expr: up == 2
        annotations:
          summary: >-
            for: 7m
        for: "1h"
      - for: 30s
        alert: C
        expr: up == 3
      - alert: D
        expr: up == 4
        for: 0m
      - alert: E
        expr: up == 5
        for: 1s
      - record: r
        expr: sum(up)
"""


def test_rewrites_rule_keys_only() -> None:
    text, seen = shorten_for(RULES, 2.0)
    assert seen == 5
    lines = text.splitlines()
    assert "        for: 2s   # keep me" in lines
    assert "        for: 2s" in lines  # B's quoted "1h"
    assert "      - for: 2s" in lines  # C: for as the item's first key
    assert "        for: 0m" in lines  # D: zero stays zero
    assert "        for: 1s" in lines  # E: already shorter
    # Block scalar text is untouched, even where it looks like a key.
    assert "            for: 10m" in lines
    assert "            - for: 3m" in lines
    assert "            for: 7m" in lines
    changed = [(a, b) for a, b in zip(RULES.splitlines(), lines, strict=True) if a != b]
    assert len(changed) == 3


def test_keeps_line_endings_and_everything_else() -> None:
    crlf = RULES.replace("\n", "\r\n")
    text, seen = shorten_for(crlf, 2.0)
    assert seen == 5 and text.count("\r\n") == crlf.count("\r\n")
    assert text.replace("for: 2s", "X") == crlf.replace("for: 5m", "X").replace(
        'for: "1h"', "X"
    ).replace("for: 30s", "X")


def test_unreadable_for_is_an_error() -> None:
    head = "groups:\n  - name: g\n    rules:\n      - alert: A\n"
    with pytest.raises(ValueError, match="not a Prometheus duration: 'soon'"):
        shorten_for(head + "        for: soon\n", 2)
    with pytest.raises(ValueError, match="cannot read this for: line"):
        shorten_for(head + "        for: 5 m\n", 2)


def test_copy_of_the_real_rules(tmp_path: Path) -> None:
    copy = short_rules_copy(ALERTS, tmp_path, window_s=2.0)
    original = ALERTS.read_text().splitlines()
    rewritten = copy.read_text().splitlines()
    alerts = sum(1 for line in original if line.strip().startswith("- alert:"))
    fors = [line.strip() for line in rewritten if line.strip().startswith("for:")]
    assert len(fors) == alerts  # every alert states its for:
    assert set(fors) <= {"for: 2s", "for: 0m"}
    changed = [(a, b) for a, b in zip(original, rewritten, strict=True) if a != b]
    assert changed and all(a.strip().startswith("for:") for a, _ in changed)
    with pytest.raises(ValueError, match="no for:"):
        short_rules_copy(_write(tmp_path / "none.yml", "groups: []\n"), tmp_path)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
