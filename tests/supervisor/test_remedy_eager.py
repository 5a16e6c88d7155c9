"""The opt-in `enforce_eager` remedy: a start stalled in `torch_compile` or `graph_capture` is
ended by the supervisor as a failure of kind `stall` and started again with `--enforce-eager`,
driven on a virtual clock as the other remedies are (test_remedies.py), with children that hang
until the supervisor signals them."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import load_config
from loadwatch.daemon.sources.inputs import ProcessEvent
from loadwatch.daemon.supervise.config import supervisor_config
from loadwatch.daemon.supervise.ladder import Ladder
from loadwatch.daemon.supervise.remedies import EAGER_PHASES, Failed, Settings, propose
from loadwatch.daemon.supervise.supervisor import Supervisor
from loadwatch.parsers.vllm.argv import with_flag
from tests.supervisor.harness import Recorder
from tests.supervisor.test_remedies import Script, ladder, write
from tests.supervisor.test_supervisor_logic import VirtualOps, _cfg

ARGV = ("vllm", "serve", "/m", "--max-model-len", "4096")


class _Hanging:
    """A child that runs until the supervisor signals its group."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ended = threading.Event()

    def wait(self) -> int:
        self.ended.wait(10)
        return -signal.SIGTERM


class StallingOps(VirtualOps):
    """VirtualOps whose starts listed in `hang` (1-based) hang until signalled."""

    def __init__(self, codes: list[int], hang: set[int]) -> None:
        super().__init__(codes)
        self.hang = hang
        self.hanging: list[_Hanging] = []

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, output_fd: int
    ) -> Any:
        child = super().spawn(argv, env, cwd, output_fd)
        if len(self.spawned) not in self.hang:
            return child
        hung = _Hanging(child.pid)
        self.hanging.append(hung)
        return hung

    def signal_group(self, pgid: int, sig: int) -> None:
        super().signal_group(pgid, sig)
        for child in self.hanging:
            if child.pid == pgid:
                child.ended.set()


def eager_ladder(tmp_path: Path, script: Script) -> Ladder:
    return ladder(tmp_path, script, ("max_model_len", "enforce_eager"), argv=ARGV)


def run(
    tmp_path: Path,
    lad: Ladder,
    ops: StallingOps,
    stalls: dict[int, str],
    ready_on: int | None = None,
    **kw: object,
) -> tuple[Supervisor, Recorder, list[bool]]:
    """Supervise; start N (1-based) stalls in phase `stalls[N]` as soon as it runs."""
    rec = Recorder()
    holder: list[Supervisor] = []
    decided: list[bool] = []

    def on_event(e: ProcessEvent) -> None:
        rec(e)
        if e.kind != "started":
            return
        n = len(rec.of("started"))
        if n in stalls:
            decided.append(holder[0].note_stall(120.0, stalls[n]))
        if n == ready_on:
            holder[0].note_ready()

    cfg = _cfg(tmp_path, argv=ARGV, stall_end_phases=EAGER_PHASES, **kw)
    sup = Supervisor(cfg, on_event=on_event, ops=ops, planner=lad)
    holder.append(sup)
    asyncio.run(sup.run())
    return sup, rec, decided


def eager(argv: Sequence[str]) -> bool:
    return "--enforce-eager" in argv


def test_a_stall_in_torch_compile_restarts_with_enforce_eager_which_helps(tmp_path: Path) -> None:
    script = Script()  # (the log is not read: the supervisor says what the failure was)
    ops = StallingOps([0, 0], hang={1})
    sup, rec, decided = run(tmp_path, eager_ladder(tmp_path, script), ops, {1: "torch_compile"}, 2)
    assert decided == [True]
    assert [eager(a) for a, _, _ in ops.spawned] == [False, True]
    assert ops.spawned[1][0] == (*ARGV, "--enforce-eager")
    assert rec.of("exited")[0].reason == "restarting: stalled for 120 s in torch_compile"
    applied, helped = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert applied["remedy"] == "enforce_eager" and applied["outcome"] == "applied"
    assert applied["diff"] == ["+ --enforce-eager"]
    assert applied["kind"] == "stall" and applied["phase"] == "torch_compile"
    assert "stall in torch_compile" in applied["reason"]
    assert helped["outcome"] == "helped"
    first = script.shown[1][0].first_failure
    assert first is not None and (first.kind, first.phase) == ("stall", "torch_compile")
    assert sup.state == "exited"


def test_a_stall_again_reverts_it_and_it_is_not_tried_twice(tmp_path: Path) -> None:
    script = Script()
    ops = StallingOps([0, 0, 0], hang={1, 2, 3})
    stalls = {1: "graph_capture", 2: "graph_capture", 3: "graph_capture"}
    sup, _rec, decided = run(
        tmp_path, eager_ladder(tmp_path, script), ops, stalls, crash_loop_starts=3
    )
    assert decided == [True, True, True] and sup.state == "fatal"
    assert [eager(a) for a, _, _ in ops.spawned] == [False, True, False]
    lines = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert [(d["remedy"], d["outcome"]) for d in lines[:2]] == [
        ("enforce_eager", "applied"),
        ("enforce_eager", "reverted"),
    ]
    assert lines[1]["diff"] == ["- --enforce-eager"]
    assert all(d["outcome"] == "none" for d in lines[2:])
    assert lines[2]["reason"].startswith("ladder exhausted")


def test_without_the_remedy_a_stall_in_those_phases_ends_nothing(tmp_path: Path) -> None:
    ops = StallingOps([0], hang={1})
    sup = Supervisor(_cfg(tmp_path, argv=ARGV), ops=ops)  # stall policy alert, no remedy
    decided: list[bool] = []

    async def scenario() -> None:
        task = asyncio.create_task(sup.run())
        for _ in range(1000):
            if sup.state == "running":
                break
            await asyncio.sleep(0.001)
        decided.append(sup.note_stall(10_000.0, "torch_compile"))
        await sup.stop()
        await task

    asyncio.run(scenario())
    assert decided == [False] and len(ops.spawned) == 1


def test_the_rule_is_about_stalls_in_compile_and_graph_capture_only() -> None:
    def said(kind: str, phase: str, argv: Sequence[str] = ARGV) -> object:
        return propose("enforce_eager", Failed(kind, phase, ""), argv, Settings())

    assert said("stall", "weights") is None  # a stall while the weights load: not eager's
    assert said("cuda_oom", "graph_capture") is None
    assert said("stall", "graph_capture", (*ARGV, "--enforce-eager")) == (
        "--enforce-eager is given already"
    )
    assert with_flag(("v", "--no-enforce-eager", "--x", "1"), "--enforce-eager") == (
        "v",
        "--x",
        "1",
        "--enforce-eager",
    )


def test_only_an_operator_who_lists_it_gets_it(tmp_path: Path) -> None:
    plain = load_config(write(tmp_path, "[vllm]\nargv = ['vllm']\nremedies = ['max_model_len']\n"))
    assert plain.vllm is not None and "enforce_eager" not in plain.vllm.remedies
    assert supervisor_config(plain.vllm, tmp_path / "v.log").stall_end_phases == frozenset()
    cfg = load_config(write(tmp_path, "[vllm]\nargv = ['vllm']\nremedies = ['enforce_eager']\n"))
    assert cfg.vllm is not None and cfg.vllm.remedies == ("enforce_eager",)
    sup_cfg = supervisor_config(cfg.vllm, tmp_path / "v.log")
    assert sup_cfg.stall_end_phases == {"torch_compile", "graph_capture"}
