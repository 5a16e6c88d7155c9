"""Shared test set-up: deterministic local time (vLLM timestamps are local and yearless)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["TZ"] = "UTC"
time.tzset()

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


# Test files that start real vLLM (or may: the mark is on some of their tests). Under `-n N`
# (pytest-xdist) they are one unit of work, run first and one start at a time on one worker: a
# vLLM start takes both cores while its three processes import torch, so two at once would
# only make each slower, and the tests that time a start (the learned ETA) less exact.
TESTS = Path(__file__).parent
REALVLLM_FILES = frozenset(
    p.relative_to(TESTS.parent).as_posix()
    for p in TESTS.rglob("test_*.py")
    if "mark.realvllm" in p.read_text(encoding="utf-8")
)


def _unit_of_work(nodeid: str) -> str:
    """A whole module (its module fixtures are made once), or all the real-vLLM files."""
    path = nodeid.split("::", 1)[0]
    return "realvllm" if path in REALVLLM_FILES else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the real-vLLM files first (a stable sort: each file's own order is kept), so under `-n`
    # the longest unit of work starts at once while the other workers take the rest
    items.sort(key=lambda item: _unit_of_work(item.nodeid) != "realvllm")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of_work(nodeid)

    config.option.loadscopereorder = False  # (the order above, not by the number of tests)
    return ByModule(config, log)


# A test marked `alone` times something that an operator's machine does with nothing else on it
# (a repeat start against the one before it). Under `-n`, every test holds a shared lock on one
# file for the run while it runs, and an `alone` test an exclusive one: the other processes
# finish the test they are in and wait for it. Its module fixtures are made inside its first
# test, so they are covered too.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    run_id = getattr(item.config, "workerinput", {}).get("testrunuid")
    if run_id is None:  # one test process: nothing runs beside a test
        yield
        return
    path = Path(tempfile.gettempdir()) / f"loadwatch-tests-{run_id}.lock"
    with open(path, "a") as lock:
        alone = item.get_closest_marker("alone") is not None
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield  # (closing the file lets go of the lock)


def pytest_sessionstart(session: pytest.Session) -> None:
    """A compiled module older than its source, or one no longer listed, would test other code
    than the source (its .so shadows the .py): stop and say so. `make venv` builds them again
    and takes away what is not listed (scripts/ensure-venv.sh)."""
    from tests.helpers import COMPILED, REPO

    stale = [
        path
        for path in COMPILED
        for built in (REPO / path).parent.glob(Path(path).stem + ".cpython-*.so")
        if built.stat().st_mtime < (REPO / path).stat().st_mtime
    ]
    unlisted = [
        str(built.relative_to(REPO))
        for top in ("daemon", "parsers", "exporters")
        for built in (REPO / top).rglob("*.cpython-*.so")
        if not built.name.startswith("_scan.")
        and str(built.relative_to(REPO)).split(".cpython-")[0] + ".py" not in COMPILED
    ]
    if stale or unlisted:
        pytest.exit(
            f"compiled before their last change: {stale}; built but no longer listed in "
            f"pyproject.toml: {unlisted}: run `make venv`",
            4,
        )
