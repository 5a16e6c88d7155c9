"""The daemon's parts as its configuration makes them: the log source it follows and the
state's settings."""

from __future__ import annotations

from collections.abc import Callable

from loadwatch.daemon.config import Config
from loadwatch.daemon.sources.log.container import resolve_format
from loadwatch.daemon.sources.log.source import LogSource
from loadwatch.daemon.state.session import StateConfig
from loadwatch.parsers import ChunkScanner
from loadwatch.parsers.grammar import load as load_grammar


def open_log_source(cfg: Config, clock: Callable[[], float]) -> LogSource | None:
    """The log source the config names (None: no log)."""
    path = cfg.log.path
    if path is None:
        return None
    grammar = load_grammar(cfg.log.grammar)  # (parsers/grammar.py)
    fmt = "plain" if cfg.supervise else resolve_format(cfg.log.format, path)
    return LogSource(
        path,
        container=fmt,
        state_dir=cfg.state_dir / "follower",
        scanner=lambda: ChunkScanner(grammar.new_stream(clock()), grammar=grammar),
        events_file=cfg.events_file,
        cap_bytes=cfg.log.max_record_bytes,
        poll_interval_s=cfg.log.poll_interval_s,
        mode=cfg.log.mode,
        clock=clock,
        coalesce_s=cfg.log.coalesce_ms / 1000,
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
