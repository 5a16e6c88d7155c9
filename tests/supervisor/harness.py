"""Shared set-up for supervisor tests: the fake vLLM, tiny timings, an event recorder, /proc."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from loadwatch.daemon.sources.inputs import ProcessEvent
from loadwatch.daemon.sources.proc.tree import read_process_table
from loadwatch.daemon.supervise.supervisor import Supervisor, SupervisorConfig
from tests.helpers import wait_for_async

FAKE = Path(__file__).resolve().parent.parent / "fakevllm" / "fake_vllm.py"
T = TypeVar("T")


def fake_argv(*args: str) -> tuple[str, ...]:
    return (sys.executable, str(FAKE), *args)


def tiny_config(tmp_path: Path, *fake_args: str, **overrides: Any) -> SupervisorConfig:
    cfg = SupervisorConfig(
        argv=fake_argv(*fake_args),
        log_path=str(tmp_path / "vllm.log"),
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
        stop_grace_s=1.0,
        kill_wait_s=5.0,
        tree_scan_interval_s=0.05,
        exit_verdict_wait_s=0.3,
        crash_loop_starts=20,
        crash_loop_window_s=60.0,
    )
    return replace(cfg, **overrides)


class Recorder:
    def __init__(self) -> None:
        self.events: list[ProcessEvent] = []

    def __call__(self, event: ProcessEvent) -> None:
        self.events.append(event)

    @property
    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]

    def of(self, kind: str) -> list[ProcessEvent]:
        return [e for e in self.events if e.kind == kind]


async def wait_until(pred: Callable[[], bool], timeout_s: float = 20.0, what: str = "") -> None:
    await wait_for_async(pred, what or str(pred), timeout_s)


def run_async(coro: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro(), timeout_s)

    return asyncio.run(bounded())


def log_bytes(tmp_path: Path) -> bytes:
    p = tmp_path / "vllm.log"
    return p.read_bytes() if p.exists() else b""


def read_pids(pid_dir: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in pid_dir.glob("*.pid")}


def live_pids(pids: list[int] | tuple[int, ...]) -> list[int]:
    """Which of ``pids`` still run (a zombie counts as gone: it holds nothing)."""
    table = read_process_table()
    return [p for p in pids if p in table and not table[p].gone]


async def start(sup: Supervisor) -> asyncio.Task[str]:
    task: asyncio.Task[str] = asyncio.create_task(sup.run())
    await asyncio.sleep(0)
    return task
