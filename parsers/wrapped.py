"""Records a terminal wrapped: a long exception line whose end went on the next physical lines.

A log pasted from a terminal (or captured through one) cuts long lines at its width: the
process prefix stands on the first piece only, the rest follow as bare lines
(`(EngineCore pid=316) ValueError: To serve ... (4.26 GiB KV cach` then `e is needed, ...`).
The stream holds such an exception line back for one record and joins the pieces, so the kind
comes from the whole message. Only exception lines are joined, only after a prefixed piece, and
only bare pieces that cannot be anything else.
"""

from __future__ import annotations

from loadwatch.parsers.entries import (
    Head,
)

WRAP_MIN_CHARS = 60  # a piece shorter than this did not reach a terminal's edge
_ENDS = ".)]}'\"!?:;>"  # a message that ends like a sentence or a value was not cut
_NOT_PIECES = ("Traceback", "During handling", "The above exception", "/", "(", "[", "<")


def may_continue(body: str) -> bool:
    """Whether a piece may have been cut at the terminal's edge: long, not ended."""
    text = body.rstrip()
    return len(text) >= WRAP_MIN_CHARS and text[-1] not in _ENDS


def is_piece(head: Head) -> bool:
    """Whether a record can be the rest of a wrapped line: no prefix, no header, not indented,
    not the start of something else (a traceback, a path, another prefix)."""
    body = head.body
    return (
        head.process is None
        and head.level is None
        and bool(body)
        and not body[:1].isspace()
        and not body.startswith(_NOT_PIECES)
    )
