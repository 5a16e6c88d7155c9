"""Shared test set-up: deterministic local time (vLLM timestamps are local and yearless)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["TZ"] = "UTC"
time.tzset()

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


# Under `-n N` (pytest-xdist) a unit of work is a whole module (its module fixtures are made
# once), and the files that start real vLLM (or may: the mark is on some of their tests) are one
# unit together, run first and one start at a time: a vLLM start takes both cores while its
# three processes import torch, so two at once would only make each slower, and the tests that
# time a start (the learned ETA) less exact.
TESTS = Path(__file__).parent


def _files_marked(mark: str) -> frozenset[str]:
    return frozenset(
        p.relative_to(TESTS.parent).as_posix()
        for p in TESTS.rglob("test_*.py")
        if f"mark.{mark}" in p.read_text(encoding="utf-8")
    )


REALVLLM_FILES = _files_marked("realvllm")
# Files whose tests spend their time waiting (a demo played in real time, a soak's cycles, a
# real Prometheus's scrapes) and compute little: with 3 or more processes, the last of them
# takes these first and the others take them last, so a process that waits does not hold one of
# the two cores the computing tests share. The computing processes (and all they start) run
# at a lower priority: the waiting one's tests time what they wait for, and are woken on time.
WAITING_FILES = _files_marked("waits")
COMPUTING_NICE = 10


def _waits_lane(info: dict[str, Any]) -> bool:
    """Whether the test process `info` (xdist's `workerinput`) is the one for the waiting files."""
    return bool(info["workercount"] >= 3 and info["workerid"] == f"gw{info['workercount'] - 1}")


def pytest_configure(config: pytest.Config) -> None:
    info = getattr(config, "workerinput", None)
    if info is not None and info["workercount"] >= 3 and not _waits_lane(info):
        os.nice(COMPUTING_NICE)


def _unit_of_work(nodeid: str) -> str:
    """A whole module, or all the real-vLLM files."""
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

        def _assign_work_unit(self, node: Any) -> None:
            """The next unit of the node's own kind (waiting or computing), else the next."""
            waiter = _waits_lane(node.workerinput)
            queue = self.workqueue
            scope = next((s for s in queue if (s in WAITING_FILES) == waiter), None)
            if scope is not None:
                queue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # (the order above, not by the number of tests)
    return ByModule(config, log)


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
