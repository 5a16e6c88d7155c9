"""What the daemon does around a vLLM run besides folding inputs: the model directory's facts
(read once per path) and the orphan check after a run's process tree exited.

`ModelDirs` reads the configured model directory (or the one vLLM's argv names) when a run
starts, and, with none configured, the one the engine config in the log names, but only under
the roots the operator allows (`[model] allowed_roots`; by default the operator's own model
directory, so in watch mode none): the log is text vLLM's clients partly choose, and what the
daemon reads because of a line is bounded by configuration. A path outside the roots named is
one `daemon.problem` line; with none named, one `model.not_read` line (the default at work). A checkpoint whose files the
bounds refuse (sources/model/modelfiles.py) is one `daemon.problem` line, and the state's model
then says why it is unknown. `OrphanChecks` waits out the moment in which the driver still lists
an exited tree, then writes one ``gpu.orphans`` line per tree (also when clean: how long the tree
took to give its memory back).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from loadwatch.daemon.config import Config
from loadwatch.daemon.eventfeed import EventFeed
from loadwatch.daemon.sources.inputs import GpuReading, ModelInfo, OrphanCheck, PageCache
from loadwatch.daemon.sources.model.model_info import read_model_dir, under_roots
from loadwatch.daemon.sources.model.modelfiles import ModelFileError, shown
from loadwatch.daemon.sources.model.page_cache import cache_state, resident_fraction
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.session import Session
from loadwatch.daemon.supervise.orphans import ORPHAN_GRACE_S, settle_orphans

PATH_SHOWN = 512  # a path from the log, as a line shows it
SAID_KEPT = 256  # problem lines remembered, so that each is said once
NOT_READ = (
    "no [model] allowed_roots: the model directory the log names is read only under them "
    "(or give [model] dir)"
)


def model_dir_problem(cfg: Config) -> str | None:
    """The configured model directory's files refused by the bounds, in one line: checked
    before the daemon starts, as bad input data (a directory that is not there is said later,
    as a problem, and the daemon runs without it)."""
    model_dir = cfg.model.dir
    if model_dir is None or not os.path.isdir(model_dir):
        return None
    try:
        read_model_dir(model_dir)
    except ModelFileError as exc:
        return f"[model] dir: {exc}"
    return None


def allowed_roots(cfg: Config) -> tuple[Path, ...]:
    """Where a model path the log names may be read: `[model] allowed_roots`; unset, the
    operator's own model directory (`[model] dir`, else the supervised argv's model path)."""
    from loadwatch.parsers.vllm import argv as vllm_argv

    if cfg.model.allowed_roots is not None:
        return cfg.model.allowed_roots
    if cfg.model.dir is not None:
        return (cfg.model.dir,)
    if cfg.vllm is not None and cfg.supervise:
        found = vllm_argv.model_path(list(cfg.vllm.argv))
        if found and os.path.isabs(found):
            return (Path(found),)
    return ()


class ModelDirs:
    """Reads a model directory's facts and hands them to `apply` (the daemon's fold); says
    what it cannot read through `feed`."""

    def __init__(
        self, cfg: Config, feed: EventFeed, apply: Callable[[ModelInfo | PageCache], None]
    ) -> None:
        self._cfg = cfg
        self._feed = feed
        self._apply = apply
        self._tried: str | None = None  # the model path of the log last looked for here
        self._cache_for: int | None = None  # the session whose page cache was looked at
        self._said: list[str] = []  # problems said, each once

    def load(self, argv: Iterable[str] = ()) -> None:
        """At start, and when the supervisor starts vLLM (with its argv)."""
        from loadwatch.parsers.vllm import argv as vllm_argv

        cfg = self._cfg
        model_dir = cfg.model.dir
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
            if cfg.model.dir is not None:
                # configured, so meant: say what is off without it (a path from argv may be a
                # Hugging Face model id, no directory at all)
                self._problem(
                    f"[model] dir {model_dir} {why}: no byte progress and no memory forecast "
                    "from the checkpoint's size"
                )
            return
        info, refused = self._read(model_dir)
        if not refused:
            for err in info.errors:
                self._feed.line("model.error", path=str(model_dir), error=err)
        self._apply(info)

    def read_logged(self, s: Session | None) -> ModelInfo | None:
        """Without a model directory configured, the one the engine config of session `s`
        names, when it is here and under the allowed roots; None when nothing new (a Hugging
        Face model id, another host's path)."""
        path = s.kv.model_path if s is not None else None
        if path is None or path == self._tried or self._cfg.model.dir is not None:
            return None
        self._tried = path
        if not os.path.isabs(path):
            return None
        roots = allowed_roots(self._cfg)
        if not under_roots(path, roots):
            where = shown(path, PATH_SHOWN)
            if roots:  # the operator named where checkpoints live, and this is elsewhere
                allowed = ", ".join(str(r) for r in roots)
                self._problem(
                    f"the model directory the log names, {where}, is outside [model] "
                    f"allowed_roots ({allowed}): not read"
                )
            else:  # none allowed (watch mode's default): as meant, a note, not a problem
                self._feed.line("model.not_read", path=where, reason=NOT_READ)
            return ModelInfo(path=where, errors=("outside [model] allowed_roots: not read",))
        if not os.path.isdir(path):
            return None
        return self._read(Path(path))[0]

    def after_fold(self, state: LoadState, now: float, *, live: bool, begun: bool) -> None:
        """After the daemon folded log records into `state` (`live`: as they were written;
        `begun`: one was a start's first line): the model directory the log names, and its page
        cache, applied."""
        info = self.read_logged(state.session)
        if info is not None:
            state = state.apply(info, now)  # (what `apply` makes of it)
            self._apply(info)
        cache = self.page_cache(state, now, begun=begun) if live else None
        if cache is not None:
            self._apply(cache)

    def page_cache(self, state: LoadState, now: float, *, begun: bool) -> PageCache | None:
        """Once a session, before it loads (`begun`: its first line was just read, or it has
        not begun to load): how much of the model directory it will load (read here, so
        allowed) is in the page cache (sources/model/page_cache.py)."""
        s, model = state.session, state.model
        if s is None or s.id == self._cache_for or s.page_cache is not None:
            return None
        if not begun and s.phase != "starting":
            return None  # (the load itself has filled the cache since)
        if model is None or not model.shards or model.errors:
            return None
        self._cache_for = s.id
        fraction = resident_fraction([Path(model.path) / shard.name for shard in model.shards])
        cache = cache_state(fraction)
        if fraction is None or cache is None:
            return None
        return PageCache(now, s.id, model.path, cache, fraction)

    def _read(self, model_dir: Path) -> tuple[ModelInfo, bool]:
        """The directory's facts, and whether the bounds refused it (then the facts say it is
        unknown, and why)."""
        try:
            return read_model_dir(model_dir), False
        except ModelFileError as exc:  # (its line names the directory)
            self._problem(f"{exc}: not read")
            return ModelInfo(path=str(model_dir), errors=(str(exc),)), True
        except (OSError, ValueError) as exc:  # (never the task's end)
            line = " ".join(str(exc).split()) or type(exc).__name__
            self._problem(f"model directory {shown(str(model_dir), PATH_SHOWN)}: {line}: not read")
            return ModelInfo(path=str(model_dir), errors=(line,)), True

    def _problem(self, line: str) -> None:
        if line in self._said:
            return
        self._said = [*self._said[-(SAID_KEPT - 1) :], line]
        self._feed.problem(line)


class OrphanChecks:
    """After a vLLM tree exited: polls the GPUs (`poll`) until the driver let go of it, hands
    the state what is left (`apply`), writes it through `feed` and publishes."""

    def __init__(
        self,
        poll: Callable[[], Awaitable[GpuReading]],
        *,
        feed: EventFeed,
        apply: Callable[[OrphanCheck], None],
        publish: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        self._poll = poll
        self._feed = feed
        self._apply = apply
        self._publish = publish
        self._clock = clock
        self.grace_s = ORPHAN_GRACE_S
        self._running: dict[tuple[int, ...], asyncio.Task[None]] = {}  # by tree, in flight

    def start(self, tree_pids: tuple[int, ...], run_marker: str | None) -> asyncio.Task[None]:
        """The check waits out the moment in which the driver still lists the exited tree;
        `run_marker`: the supervisor's mark in its runs' environment (orphans.py)."""
        task = self._running.get(tree_pids)
        if task is None:
            check = self._check(tree_pids, run_marker)
            task = asyncio.get_running_loop().create_task(check, name="orphans")
            self._running[tree_pids] = task
            task.add_done_callback(lambda _: self._running.pop(tree_pids, None))
        return task

    async def finish(self) -> None:
        for check in list(self._running.values()):
            with contextlib.suppress(Exception):
                await check

    async def _check(self, tree_pids: tuple[int, ...], marker: str | None) -> None:
        report = await settle_orphans(
            self._poll, tree_pids, grace_s=self.grace_s, run_marker=marker
        )
        if report is None:
            return
        self._apply(OrphanCheck(ts=self._clock(), leaked=len(report.leaked)))
        # Also when clean: how long the exited tree took to give its memory back is worth a line.
        self._feed.line(
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
        self._publish()
