"""The one part of the build pyproject.toml cannot say: the C scanner, left out on request.

`python -m build` makes the platform wheel, with the chunk scanner's candidate search compiled
from parsers/_scan.c (optional: without a C compiler the build goes on, and scan.py uses its
Python equal; `scan.NATIVE` says which runs). `LOADWATCH_PURE=1 python -m build --wheel` makes
the pure-Python wheel (py3-none-any), which installs anywhere without a compiler.
"""

import os

from setuptools import Extension, setup

PURE = os.environ.get("LOADWATCH_PURE", "") not in ("", "0")
ext_modules = (
    []
    if PURE
    else [Extension("loadwatch.parsers._scan", sources=["parsers/_scan.c"], optional=True)]
)
setup(ext_modules=ext_modules)
