"""The daemon's parts as its configuration makes them: the log source it follows and the
state's settings."""

from __future__ import annotations

import sys
from collections.abc import Callable

from loadwatch.daemon.config import Config
from loadwatch.daemon.sources.log.inputs import LogInput, open_input
from loadwatch.daemon.sources.log.journal import JournalSource
from loadwatch.daemon.sources.log.source import LogSource
from loadwatch.daemon.state.session import StateConfig
from loadwatch.parsers import ChunkScanner
from loadwatch.parsers.grammar import load as load_grammar


def make_log_input(cfg: Config) -> LogInput | None:
    """The log input the config names (`[log] input`, inputs.py), not yet opened; None: no log."""
    log = cfg.log
    if log.path is None and log.journal_unit is None:
        return None
    journal = None
    if log.journal_unit is not None:
        journal = JournalSource(log.journal_unit, log.journal_file, log.journal_directory)
    return open_input(
        "file" if cfg.supervise else log.input,  # (supervised, the log is vLLM's output as is)
        log.path,
        state_dir=cfg.state_dir,
        journal=journal,
        on_problem=lambda line: print(f"loadwatch: journal: {line}", file=sys.stderr),
        cap_bytes=log.max_record_bytes,
        poll_interval_s=log.poll_interval_s,
        mode=log.mode,
        coalesce_s=log.coalesce_ms / 1000,
    )


def open_log_source(
    cfg: Config, clock: Callable[[], float], log_input: LogInput | None = None
) -> LogSource | None:
    """The log source over `log_input` (else the input the config names, opened here); None:
    no log."""
    if log_input is None:
        log_input = make_log_input(cfg)
        if log_input is None:
            return None
        log_input.open()
    grammar = load_grammar(cfg.log.grammar)  # (parsers/grammar.py)
    return LogSource(
        log_input,
        state_dir=cfg.state_dir / "follower",
        scanner=lambda: ChunkScanner(grammar.new_stream(clock()), grammar=grammar),
        events_file=cfg.events_file,
        clock=clock,
    )


def state_config(cfg: Config) -> StateConfig:
    """The state's settings, from the daemon's."""
    f = cfg.forecast
    return StateConfig(
        max_sessions=cfg.sessions_kept,
        stall_k=f.stall_factor,
        stall_floor_s=f.stall_floor_s,
        quiet_stall_s=f.quiet_stall_s,
        failure_hold_s=f.failure_hold_s,
        require_completion=cfg.vllm is not None and cfg.vllm.servable,
    )
