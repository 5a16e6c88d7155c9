"""What a launcher or log collector writes before the engine's own line.

journald's `Mon DD HH:MM:SS host unit[pid]: `, docker compose's `vllm-1  | `, a CI runner's
stamp, torch.distributed's `[rank0]: `: each is passed over before the grammar reads the line,
repeatedly (a CI stamp before a compose column). The grammar is anchored, bounded and never
backtracks, so hostile text costs it no more than its length.
"""

from __future__ import annotations

import re

_WRAPPER = re.compile(
    r"(?:"
    # torch.distributed's rank prefix: `[rank0]: `
    r"\[rank\d{1,6}+\]: ?"
    # CI and collectors: `[2025-08-12T08:42:32Z] `, `2025-08-12T08:42:32.1234567Z `
    r"|\[?\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9}+)?(?:Z|[+-]\d\d:?\d\d)?\]? "
    # journald / syslog: `Mon DD HH:MM:SS host unit[pid]: `, the month in any locale's spelling
    r"|[^\s\d\[(][^\s]{0,11}+ {1,2}\d{1,2}+ \d\d:\d\d:\d\d \S{1,255}+ [^\s\[:]{1,128}+(?:\[\d{1,10}+\])?: "
    # an ISO-stamped journal (`--output=short-iso`): `host unit[pid]: ` after the stamp above
    r"|(?=[^\s(\[]{1,255}+ [^\s\[:]{1,128}+\[\d{1,10}+\]: )\S{1,255}+ [^\s\[:]{1,128}+\[\d{1,10}+\]: "
    # docker compose: `vllm-1  | `, `name | ` (named: see `compose_column`)
    r"|(?P<column>[A-Za-z0-9][A-Za-z0-9_.-]{0,63}+ {1,40}+\| ?)"
    # a launcher's tag: `[vllm]: `
    r"|\[[A-Za-z][A-Za-z0-9_.-]{0,39}+\]: "
    # pytest's failure report in a CI log: `E       RuntimeError: ...`
    r"|E {3,16}+(?=\S)"
    r")"
)
# What every alternative starts with (an engine's own `(`, a bar's text are not).
WRAPPER_START = frozenset("[0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
MAX_WRAPPERS = 4
COLUMN_REACH = 110  # a compose column's `| ` is this near the record's start, or it has none


def strip_wrapper(text: str) -> str:
    """The record without what a launcher or collector wrote before it (nothing when none)."""
    return text[wrapper_end(text) :]


def wrapper_end(text: str, start: int = 0, steps: int = MAX_WRAPPERS) -> int:
    """Where the engine's own line starts in the record: after what a launcher or collector
    wrote before it (`start`: nothing; `steps`: what is left of `MAX_WRAPPERS` after `start`)."""
    end = start
    for _ in range(steps):
        if text[end : end + 1] not in WRAPPER_START:
            break
        m = _WRAPPER.match(text, end)
        if m is None or m.end() == end:
            break
        end = m.end()
    return end


def compose_column(text: str) -> bool:
    """Whether `text` is one docker compose column and its space (`vllm-1  | `) as the
    grammar's first step reads it, whatever follows it in a record: every alternative before
    the column's fails inside it (at its space or its `|`, where each wants another
    character), and its own ends at the space. So a record that starts with a column has its
    first step there, known without a match (a reader that keeps the columns it saw)."""
    m = _WRAPPER.match(text)
    return (
        m is not None and m.lastgroup == "column" and m.end() == len(text) and text.endswith("| ")
    )
