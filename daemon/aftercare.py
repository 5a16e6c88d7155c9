"""What the daemon does around a vLLM run besides folding inputs: the model directory's facts
(read once per path) and the orphan check after a run's process tree exited.

`ModelDirs` reads the configured model directory (or the one vLLM's argv names) when a run
starts, and, with none configured, the one the engine config in the log names. `OrphanChecks`
waits out the moment in which the driver still lists an exited tree, then writes one
``gpu.orphans`` line per tree (also when clean: how long the tree took to give its memory back).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loadwatch.daemon.publish import Host
from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.sources.model.model_info import model_named_in_log, read_model_dir
from loadwatch.daemon.supervise.orphans import ORPHAN_GRACE_S, settle_orphans


class ModelDirs:
    def __init__(self, daemon: Host) -> None:
        self._d = daemon
        self._tried: str | None = None  # the model path of the log last looked for here
        self._said: str | None = None  # the configured model dir's problem, said once

    def load(self, argv: Iterable[str] = ()) -> None:
        """At start, and when the supervisor starts vLLM (with its argv)."""
        from loadwatch.parsers.vllm import argv as vllm_argv

        d = self._d
        model_dir = d.cfg.model.dir
        if model_dir is None and argv:
            found = vllm_argv.model_path(list(argv))
            model_dir = Path(found) if found else None
        if model_dir is None:
            return
        try:
            is_dir = stat.S_ISDIR(os.stat(model_dir).st_mode)
            why = "is not a directory"
        except OSError as exc:
            is_dir, why = False, f"cannot be read: {exc.strerror or exc}"
        if not is_dir:
            if d.cfg.model.dir is not None and why != self._said:
                # configured, so meant: say what is off without it (a path from argv may be a
                # Hugging Face model id, no directory at all)
                self._said = why
                d.feed.problem(
                    f"[model] dir {model_dir} {why}: no byte progress and no memory forecast "
                    "from the checkpoint's size"
                )
            return
        info: ModelInfo = read_model_dir(model_dir)
        for err in info.errors:
            d.feed.line("model.error", path=str(model_dir), error=err)
        d.apply(info)

    def read_logged(self) -> ModelInfo | None:
        """Without a model directory configured, the one the engine config names, when it is
        here (analyze reads it the same way: the same verdicts); None when nothing new."""
        d = self._d
        s = d.state.session
        path = s.kv.model_path if s is not None else None
        if path is None or path == self._tried or d.cfg.model.dir is not None:
            return None
        self._tried = path
        return model_named_in_log(path)


class OrphanChecks:
    def __init__(self, daemon: Host) -> None:
        self._d = daemon
        self.grace_s = ORPHAN_GRACE_S
        self._running: dict[tuple[int, ...], asyncio.Task[None]] = {}  # by tree, in flight

    def start(self, tree_pids: tuple[int, ...]) -> asyncio.Task[None]:
        """The check waits out the moment in which the driver still lists the exited tree."""
        task = self._running.get(tree_pids)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._check(tree_pids), name="orphans")
            self._running[tree_pids] = task
            task.add_done_callback(lambda _: self._running.pop(tree_pids, None))
        return task

    async def finish(self) -> None:
        for check in list(self._running.values()):
            with contextlib.suppress(Exception):
                await check

    async def _check(self, tree_pids: tuple[int, ...]) -> None:
        d = self._d
        marker: Any = getattr(d.supervisor, "run_marker", None)
        report = await settle_orphans(
            d.gpu.poll_async, tree_pids, grace_s=self.grace_s, run_marker=marker
        )
        if report is None:
            return
        d.tally.orphans = len(report.leaked)
        # Also when clean: how long the exited tree took to give its memory back is worth a line.
        d.feed.line(
            "gpu.orphans",
            summary=report.summary(),
            leaked=len(report.leaked),
            unknown=len(report.unknown),
            exiting=len(report.exiting),
            leaked_bytes=report.leaked_bytes,
            gpus=sorted({h.gpu_index for h in report.leaked}),
            pids=sorted({h.pid for h in report.leaked}),
            waited_s=round(report.waited_s, 2),
        )
        d.publisher.now()
