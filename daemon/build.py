"""What this install runs compiled, for the daemon's start line.

Two parts are compiled when the build had a C compiler (setup.py): the chunk scanner's candidate
search (parsers/_scan.c) and, by mypyc from their own source, the modules every log record goes
through (pyproject.toml's `[tool.loadwatch] compiled`). Either may be missing: the same Python
runs instead, slower.
"""

from __future__ import annotations

import importlib.machinery
import sys

_EXTENSION = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def compiled_modules() -> list[str]:
    """The loaded loadwatch modules that run compiled by mypyc (the C scanner aside)."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith("loadwatch.")
        and not name.endswith("._scan")
        and str(getattr(module, "__file__", "") or "").endswith(_EXTENSION)
    )
