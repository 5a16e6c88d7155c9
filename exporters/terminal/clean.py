"""What may reach the operator's terminal: text without control sequences.

The strings loadwatch shows come from the vLLM log (which prints text its clients choose: a
request id, a model name) or from whatever answers at a `--url`. A terminal obeys what such text
holds: CSI moves the cursor or makes the terminal type an answer, OSC 52 writes the clipboard,
OSC 8 makes links, DCS queries settings. So every view writes through `CleanConsole`
(console.py) or `clean_text` for a plain line, which keeps the visible text and drops:

- ESC sequences: CSI (`ESC [` ... final byte), OSC (`ESC ]` ... BEL or ST), the strings DCS, SOS,
  PM and APC (`ESC P`, `ESC X`, `ESC ^`, `ESC _` ... ST), and every other `ESC` + intermediates +
  final byte (`ESC 7`, `ESC ( B`);
- the same introduced by their 8-bit C1 forms (U+009B CSI, U+009D OSC, U+0090/98/9E/9F);
- every other C0 control but tab and newline, DEL, and every C1 control (U+0080-U+009F).

A string left open (an OSC without its BEL or ST) hides the rest of the text, as a terminal
would. CAN and SUB end a sequence, as in a terminal.

The sequences are skipped by a small state machine over the characters and the single controls
removed with `str.translate`: no regular expression (they live in parsers/, which read the log;
this is about what leaves).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

ESC = "\x1b"
BEL = "\x07"
ST_8BIT = "\x9c"
CSI_8BIT = "\x9b"
OSC_8BIT = "\x9d"
STRINGS_8BIT = "\x90\x98\x9e\x9f"  # DCS, SOS, PM, APC
INTRODUCERS = frozenset(ESC + CSI_8BIT + OSC_8BIT + STRINGS_8BIT)
CANCEL = "\x18\x1a"  # CAN, SUB: abort a sequence in progress

_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0)]
_DROP_ALL = dict.fromkeys(_CONTROLS)
_DROP_KEEP_LAYOUT = {c: None for c in _CONTROLS if chr(c) not in "\t\n"}
# JSON keeps C1 and DEL raw inside strings (ensure_ascii=False); these escape them.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0))}


def clean_text(text: str, *, layout: bool = True) -> str:
    """`text` without control sequences or controls; tab and newline stay when `layout`."""
    if text.isascii() and text.isprintable():  # the common case, checked in C
        return text
    if any(c in INTRODUCERS for c in text):
        text = _without_sequences(text)
    return text.translate(_DROP_KEEP_LAYOUT if layout else _DROP_ALL)


def one_line(text: str) -> str:
    """`text` cleaned and on one line: runs of whitespace (newlines too) become one space."""
    return " ".join(clean_text(text).split())


def print_error(message: str) -> None:
    """`loadwatch: <message>` as one clean line on stderr: messages quote what servers said."""
    print(f"loadwatch: {one_line(message)}", file=sys.stderr)


def json_for_terminal(dumped: str) -> str:
    """JSON text (json.dumps with ensure_ascii=False) with DEL and C1 controls written as
    `\\u00XX`: the same document, safe on a terminal. json.dumps escapes C0 itself, and raw DEL
    or C1 can only stand inside a JSON string, where the escape means the same character."""
    return dumped.translate(_JSON_ESCAPES)


def clean_values(value: Any) -> Any:
    """A document (JSON values) or a tree of dataclasses with every string cleaned, so that
    rich lays out the text as it will be shown. Other values are kept as they are."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {clean_values(k): clean_values(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [clean_values(v) for v in value]
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: clean_values(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    return value


# -- the state machine --------------------------------------------------------------------------


def _without_sequences(text: str) -> str:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        start = i
        while i < n and text[i] not in INTRODUCERS:
            i += 1
        out.append(text[start:i])
        if i == n:
            break
        c = text[i]
        if c == ESC:
            i = _after_escape(text, i + 1)
        elif c == CSI_8BIT:
            i = _after_csi(text, i + 1)
        else:
            i = _after_string(text, i + 1, osc=c == OSC_8BIT)
    return "".join(out)


def _after_escape(text: str, i: int) -> int:
    """Where the sequence that an ESC before `i` starts ends."""
    n = len(text)
    if i == n:
        return n
    c = text[i]
    if c == "[":
        return _after_csi(text, i + 1)
    if c == "]":
        return _after_string(text, i + 1, osc=True)
    if c in "PX^_":
        return _after_string(text, i + 1, osc=False)
    if " " <= c <= "/":  # intermediates, then one final byte (`ESC ( B`, `ESC # 8`)
        while i < n and " " <= text[i] <= "/":
            i += 1
        return i + 1 if i < n and "0" <= text[i] <= "~" else i
    if "0" <= c <= "~":  # one final byte (`ESC 7`, `ESC c`, `ESC =`)
        return i + 1
    return i  # ESC before anything else: the ESC alone goes


def _after_csi(text: str, i: int) -> int:
    """Parameters and intermediates (0x20-0x3F), then a final byte (0x40-0x7E). Anything
    else cuts the sequence short and is read anew (an ESC starts another one)."""
    n = len(text)
    while i < n:
        c = text[i]
        if "@" <= c <= "~":
            return i + 1
        if not " " <= c <= "?":
            return i
        i += 1
    return n


def _after_string(text: str, i: int, *, osc: bool) -> int:
    """An OSC, DCS, SOS, PM or APC string: up to ST (ESC \\ or U+009C), BEL for OSC, CAN or
    SUB; an ESC that is not ST ends it and starts another sequence. Never ended: all of it."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == ST_8BIT or c in CANCEL or (osc and c == BEL):
            return i + 1
        if c == ESC:
            return i + 2 if i + 1 < n and text[i + 1] == "\\" else i
        i += 1
    return n


__all__ = [
    "clean_text",
    "clean_values",
    "json_for_terminal",
    "one_line",
    "print_error",
]
