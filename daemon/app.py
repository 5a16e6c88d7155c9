"""`loadwatch run`: turn flags and a config file into a running daemon, and stop it cleanly.

Everything that can go wrong before the loop starts (bad config, a state directory that cannot be
written, a port in use, a bad certificate, a `[model] dir` whose files the bounds refuse) ends in
one line on stderr and a non-zero exit.
SIGTERM/SIGINT stop the daemon (and the supervised vLLM); SIGHUP reopens the event log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvloop

from loadwatch.daemon.aftercare import model_dir_problem
from loadwatch.daemon.cli import EX_CANTCREAT, EX_CONFIG, EX_DATAERR, fail
from loadwatch.daemon.config import (
    Config,
    ConfigError,
    VllmConfig,
    load_config,
    with_api_key,
)
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.parts import make_log_input
from loadwatch.daemon.sdnotify import SdNotifier
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource, NullGpuSource
from loadwatch.daemon.sources.gpu.scope import ScopedGpuSource, devices_from_env
from loadwatch.daemon.sources.inputs import IoReader
from loadwatch.daemon.sources.log.inputs import InputError, LogInput
from loadwatch.daemon.statelock import StateDirBusy, lock_state_dir
from loadwatch.daemon.supervise.config import SupervisorConfigError
from loadwatch.daemon.tuning import tune_running_daemon
from loadwatch.exporters.eventlog import EventLog
from loadwatch.exporters.http.process import HttpProcess
from loadwatch.exporters.http.routes import BoardMaker
from loadwatch.exporters.http.server import ServerError
from loadwatch.exporters.http.settings import files_problem
from loadwatch.parsers.vllm.argv_secrets import Redactor

EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75  # another daemon holds the state directory: try again later
DEFAULT_STATE_DIR = Path("/var/lib/loadwatch")


def config_from_args(args: argparse.Namespace) -> Config:
    # `-- COMMAND` is `[vllm] argv`: it replaces the file's, or completes a [vllm] table that
    # holds only the other keys, which apply to it as they would to the file's own argv.
    argv = [a for a in (args.vllm or []) if a != "--"]
    overrides: dict[str, Any] = {
        "vllm.argv": argv or None,
        "log.path": str(args.log) if args.log else None,
        "state_dir": str(args.state_dir) if args.state_dir else None,
        "http.listen": args.listen,
        "gpu.source": args.gpu,
        "gpu.devices": args.gpu_devices.split(",") if args.gpu_devices else None,
        "events_file": str(args.events_file) if args.events_file else None,
        "model.dir": str(args.model_dir) if args.model_dir else None,
    }
    cfg = load_config(args.config, overrides)
    if args.state_dir is None and args.config is None and not os.access("/var/lib", os.W_OK):
        # A user running `loadwatch run --log X` by hand gets a state dir it can write.
        cfg = replace(cfg, state_dir=Path.home() / ".local" / "state" / "loadwatch")
    if cfg.supervise and cfg.log.path is None:
        cfg = replace(cfg, log=replace(cfg.log, path=cfg.state_dir / "vllm.log"))
    if cfg.log.journal_unit is not None and cfg.supervise:
        raise ConfigError("[log] journal_unit", "supervise mode writes vLLM's log itself")
    if cfg.log.path is None and not cfg.supervise and cfg.log.journal_unit is None:
        raise ConfigError(
            "[log] path", "nothing to watch: give --log PATH, a config, or -- VLLM COMMAND"
        )
    return cfg


def make_gpu_source(cfg: Config, progress: Callable[[], float]) -> GuardedGpuSource | NullGpuSource:
    if cfg.gpu.source == "none":
        return NullGpuSource()
    if cfg.gpu.source == "simulated":
        from loadwatch.daemon.sim.gpus import SimulatedGpuSource

        inner: Any = SimulatedGpuSource(cfg.gpu.simulated_count, progress=progress)
    else:
        from loadwatch.daemon.sources.gpu.nvml import NvmlSource

        inner = NvmlSource(logger=lambda line: print(f"loadwatch: {line}", file=sys.stderr))
    devices = gpu_devices(cfg)
    if devices is not None:
        inner = ScopedGpuSource(inner, devices)
    return GuardedGpuSource(inner, deadline_s=cfg.gpu.deadline_s)


def load_progress(daemon: Daemon) -> float:
    """How far the load is, for simulated GPUs whose memory follows it: by the daemon's live
    state, as a real GPU's memory follows the load itself. Not the published board: its
    counters wait for a reader to ask for them (daemon/publish.py), and memory that lags the
    fraction the OOM forecast fits it against reads as a load that fits. (Called on the GPU poll's thread: the
    state is immutable, each fold makes a new one.)"""
    session = daemon.state.snapshot(daemon.clock()).session
    return (session.progress.ratio or 0.0) if session is not None else 0.0


def gpu_devices(cfg: Config) -> tuple[int | str, ...] | None:
    """`[gpu] devices`; else, supervising, the CUDA_VISIBLE_DEVICES vLLM will start with."""
    if cfg.gpu.devices is not None:
        return cfg.gpu.devices
    if cfg.vllm is None or not cfg.supervise:
        return None
    env = {**os.environ, **cfg.vllm.env} if cfg.vllm.inherit_env else dict(cfg.vllm.env)
    return devices_from_env(env)


def prepare_state_dir(path: Path) -> str | None:
    """Create the state directory (0700); one line when it cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = path / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return f"cannot write the state directory {path}: {exc.strerror or exc}"
    return None


def run_command(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ConfigError as exc:
        return fail(f"config error: {exc}", EX_CONFIG)
    return run_daemon(cfg)


def run_daemon(
    cfg: Config,
    *,
    supervisor_factory: Callable[[Daemon], Any] | None = None,
    on_started: Callable[[Daemon, HttpProcess], None] | None = None,
    stdout: Any = None,
    gpu_factory: Callable[[Callable[[], float]], GuardedGpuSource | NullGpuSource] | None = None,
    io_reader: IoReader | None = None,
) -> int:
    problem = files_problem(cfg.http)
    if problem:
        return fail(f"config error: {problem}", EX_CONFIG)
    try:
        cfg = with_api_key(cfg)
    except ConfigError as exc:
        return fail(f"config error: {exc}", EX_CONFIG)
    problem = model_dir_problem(cfg)
    if problem:
        return fail(problem, EX_DATAERR)
    problem = prepare_state_dir(cfg.state_dir)
    if problem:
        return fail(problem, EX_CANTCREAT)
    return _run_daemon(cfg, supervisor_factory, on_started, stdout, gpu_factory, io_reader)


def _run_daemon(
    cfg: Config,
    supervisor_factory: Callable[[Daemon], Any] | None,
    on_started: Callable[[Daemon, HttpProcess], None] | None,
    stdout: Any,
    gpu_factory: Callable[[Callable[[], float]], GuardedGpuSource | NullGpuSource] | None,
    io_reader: IoReader | None = None,
) -> int:
    with _early_stop() as early:
        try:
            lock = lock_state_dir(cfg.state_dir)
        except StateDirBusy as exc:
            return fail(str(exc), EX_TEMPFAIL)
        except OSError as exc:
            return fail(
                f"cannot lock the state directory {cfg.state_dir}: {exc.strerror}", EX_CANTCREAT
            )
        try:
            # The log input (parts.py, inputs.py), opened once the state directory is ours: its
            # checkpoint and the journal's spool are this daemon's.
            log_input = make_log_input(cfg)
            try:
                if log_input is not None:
                    log_input.open()
            except InputError as exc:
                return fail(str(exc), EX_UNAVAILABLE)
            try:
                return _run_locked(
                    cfg, supervisor_factory, on_started, stdout, gpu_factory, io_reader, early,
                    log_input,
                )  # fmt: skip
            finally:
                if log_input is not None:
                    log_input.close(checkpoint=False)  # (the source closed it, if it ran)
        finally:
            os.close(lock)


@contextlib.contextmanager
def _early_stop() -> Iterator[list[int]]:
    """A stop asked for (SIGTERM, SIGINT) before the loop's own handlers are in place, as soon
    as "listening" is printed say, is kept (in the list) and honoured by the loop, not met by
    the default handler's exit, which would skip the last checkpoint. The handlers before are
    put back after. Signal handlers belong to the main thread; tests run the daemon on others."""
    early: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield early
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in before:
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    try:
        yield early
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _run_locked(
    cfg: Config,
    supervisor_factory: Callable[[Daemon], Any] | None,
    on_started: Callable[[Daemon, HttpProcess], None] | None,
    stdout: Any,
    gpu_factory: Callable[[Callable[[], float]], GuardedGpuSource | NullGpuSource] | None,
    io_reader: IoReader | None,
    early: list[int],
    log_input: LogInput | None = None,
) -> int:
    redactor = Redactor()
    if cfg.vllm is not None:
        redactor.learn(cfg.vllm.argv, cfg.vllm.env)
        if cfg.vllm.api_key is not None:
            redactor.add(cfg.vllm.api_key)
        if cfg.vllm.inherit_env:
            redactor.learn((), os.environ)
    eventlog = EventLog(stdout, cfg.events_file, redactor=redactor, stdout=cfg.events.stdout)
    if eventlog.last_error:
        print(f"loadwatch: {eventlog.last_error}", file=sys.stderr)
    holder: dict[str, Daemon] = {}

    def progress() -> float:
        d = holder.get("daemon")
        return load_progress(d) if d is not None else 0.0

    if cfg.supervise and supervisor_factory is None:
        try:
            supervisor_factory = _supervisor_factory(cfg)
        except SupervisorConfigError as exc:
            return fail(f"config error: [vllm] {exc}", EX_CONFIG)
    gpu = gpu_factory(progress) if gpu_factory is not None else make_gpu_source(cfg, progress)
    daemon = Daemon(
        cfg,
        eventlog=eventlog,
        gpu=gpu,
        notifier=SdNotifier(),
        redactor=redactor,
        supervisor_factory=supervisor_factory,
        io_reader=io_reader,
        log_input=log_input,
    )
    holder["daemon"] = daemon
    server = HttpProcess(
        cfg.http,
        on_problem=lambda line: daemon.feed.line("daemon.problem", error=line),
        on_want=lambda: daemon.loop_call(daemon.publisher.want),
    )
    boards = BoardMaker(time.time, redactor)
    daemon.on_publish.append(lambda pub: server.send(boards.make(pub)))
    daemon.publisher.stale_hooks.append(server.stale)
    daemon.publisher.heartbeats.append(server.alive)
    try:
        server.start()
    except ServerError as exc:
        gpu.close()
        return fail(str(exc), EX_UNAVAILABLE)
    if not cfg.http.loopback:
        daemon.feed.line("daemon.warning", warning=f"listening on {cfg.http.host}, not loopback")
    if server.probe_url is not None:
        daemon.feed.line("daemon.listening", url=server.url, probes=server.probe_url)
    else:
        daemon.feed.line("daemon.listening", url=server.url)
    tune_running_daemon()
    try:
        # libuv's loop: beside a serving vLLM the loop wakes several times a second for days,
        # and each wake-up of asyncio's own loop costs more than the read it wakes for
        # (docs/figures.md)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(_main(daemon, server, on_started, early))
    finally:
        server.stop()
        gpu.close()
        eventlog.close()


async def _main(
    daemon: Daemon,
    server: HttpProcess,
    on_started: Callable[[Daemon, HttpProcess], None] | None,
    early: list[int],
) -> int:
    loop = asyncio.get_running_loop()
    # Signal handlers belong to the main thread; tests run the daemon on another one.
    signals = threading.current_thread() is threading.main_thread()
    if signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, daemon.eventlog.reopen)
        if early:
            daemon.stop_event.set()
    if on_started is not None:
        loop.call_soon(on_started, daemon, server)
    try:
        return await daemon.run()
    finally:
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)


def gpu_capacity(daemon: Daemon) -> tuple[int, str] | None:
    """The memory plan's capacity: the first GPU's total memory as NVML reports it."""
    totals = [g.memory_total_bytes for g in daemon.snapshot().gpus]
    total = next((t for t in totals if t), None)
    return (total, "NVML: the first GPU's total memory") if total else None


def ladder_for(daemon: Daemon, vllm: VllmConfig) -> Any:
    """The crash loop's keeper and ladder of remedies (supervise/ladder.py) of a supervising
    daemon: its loop in the state directory, on /status through the daemon's state."""
    from loadwatch.daemon.crashloop_file import CrashLoopFile
    from loadwatch.daemon.state.memplan_inputs import fitting_len, plan_argv
    from loadwatch.daemon.supervise.fp8_kv import kv_cost
    from loadwatch.daemon.supervise.ladder import Ladder, seen_in
    from loadwatch.daemon.supervise.remedies import Settings

    env = {**os.environ, **vllm.env} if vllm.inherit_env else dict(vllm.env)

    def changed(loop: Any, counts: Any) -> None:
        daemon.state = replace(daemon.state, crash_loop=loop, remedy_counts=counts)
        daemon.publisher.urgent()
        daemon.publisher.changed()

    return Ladder(
        vllm.argv,
        vllm.remedies,
        Settings(
            vllm.remedy_min_model_len,
            vllm.remedy_gpu_memory_step,
            vllm.remedy_fp8,
            lambda argv: kv_cost(argv, env, gpu_capacity(daemon)),
            lambda argv: fitting_len(plan_argv(argv, env, gpu_capacity(daemon))),
        ),
        CrashLoopFile(daemon.cfg.state_dir, daemon.feed.problem),
        seen=lambda: seen_in(daemon.state.session),
        redact=daemon.redactor.argv,
        say=daemon.feed.line,
        changed=changed,
        clock=daemon.clock,
    )


def _supervisor_factory(cfg: Config) -> Callable[[Daemon], Any]:
    from loadwatch.daemon.supervise.supervisor import Supervisor, supervisor_config
    from loadwatch.daemon.tools.preflight import start_hook_for_argv

    assert cfg.vllm is not None and cfg.log.path is not None
    vllm = cfg.vllm
    supervisor_config(vllm, str(cfg.log.path))  # raises SupervisorConfigError now, not later

    def factory(daemon: Daemon) -> Any:
        def gpu_cc() -> tuple[int, int] | None:
            ccs = (g.compute_capability for g in daemon.state.gpus.values())
            return next((cc for cc in ccs if cc is not None), None)

        def on_report(report: Any) -> None:
            daemon.feed.line("preflight", verdict=report.verdict, report=report.to_dict())

        def capacity() -> tuple[int, str] | None:
            return gpu_capacity(daemon)

        ladder = ladder_for(daemon, vllm)
        hook = None
        if vllm.preflight != "off":
            env = {**os.environ, **vllm.env} if vllm.inherit_env else dict(vllm.env)

            def hook() -> str | None:  # the command the next start runs: a remedy may change it
                check = start_hook_for_argv(
                    ladder.argv(),
                    vllm.preflight,
                    gpu_cc=gpu_cc,
                    on_report=on_report,
                    env=env,
                    capacity=capacity,
                )
                return check() if check is not None else None

        sup_cfg = supervisor_config(
            vllm,
            str(cfg.log.path),
            preflight=hook,
            pid_file=cfg.state_dir / "vllm.pid",
            output_copy=daemon.eventlog.passthrough,  # with `[vllm] output = "file+stdout"`
        )
        return Supervisor(
            sup_cfg,
            on_event=daemon.on_process_event,
            on_note=lambda name, fields: daemon.feed.line(name, **fields),
            planner=ladder,
        )

    return factory
