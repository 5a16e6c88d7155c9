"""The record path runs compiled: the modules pyproject.toml lists are mypyc's extension
modules in this build (setup.py), as in the platform wheel an operator installs.

Their Python source is what every other test runs through them; the pure wheel runs the same
source interpreted (tests/ops/test_install.py installs it)."""

from __future__ import annotations

import importlib
import importlib.machinery

import pytest

from loadwatch.daemon.build import compiled_modules
from tests.helpers import COMPILED, REPO, module_name


@pytest.mark.parametrize("path", COMPILED)
def test_a_listed_module_is_built_by_mypyc(path: str) -> None:
    assert (REPO / path).is_file(), f"{path} is listed in pyproject.toml but is not there"
    module = importlib.import_module(module_name(path))
    where = str(module.__file__)
    assert where.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), (
        f"{path} runs as Python ({where}): did mypyc build it? (`make venv`)"
    )


def test_the_start_line_counts_what_runs_compiled() -> None:
    for path in COMPILED:
        importlib.import_module(module_name(path))
    assert set(map(module_name, COMPILED)) <= set(compiled_modules())
    assert "loadwatch.daemon.build" not in compiled_modules()  # (interpreted: not listed)
