"""The records the load state is made of: its configuration, one session's facts, per-GPU
tracks, and the small readings of a session that both the fold and the snapshot need.

All frozen for everyone outside the fold. Within one run of inputs the fold (fold.py) works on
copies it made in that run, and changes those in place; what it hands out is never changed
again. Collections are capped by `StateConfig` so a long or noisy load keeps bounded memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

from loadwatch.daemon.sources.inputs import (
    CompletionProbe,
    GpuReading,
    GpuSample,
    HealthProbe,
    IoSample,
    LoggedProcessSeen,
    ModelInfo,
    OrphanCheck,
    PageCache,
    ProcessEvent,
    Tick,
)
from loadwatch.daemon.state.crashloop import CrashLoop, RemedyCounts
from loadwatch.daemon.state.failures import FailureTally
from loadwatch.daemon.state.forecast import EtaConfig, EtaState
from loadwatch.daemon.state.kvdtype import KvEvidence
from loadwatch.daemon.state.learned import PastStart
from loadwatch.daemon.state.memfit import MemoryConfig, MemoryFit, MemoryProjection
from loadwatch.daemon.state.node import NodeFacts
from loadwatch.daemon.state.nodeprogress import NodeLoad
from loadwatch.daemon.state.snapshot import SessionSummary, Transition
from loadwatch.daemon.state.timeline import Timeline, timeline_view
from loadwatch.parsers.events import FAILURE_RANK, Event

Phase = Literal["starting", "loading_weights", "post_load", "ready", "failed", "stalled", "stopped"]
Input = (
    Event
    | GpuReading
    | ProcessEvent
    | IoSample
    | ModelInfo
    | HealthProbe
    | CompletionProbe
    | LoggedProcessSeen
    | OrphanCheck
    | PageCache
    | Tick
)

ORDER: dict[str, int] = {"starting": 0, "loading_weights": 1, "post_load": 2, "ready": 3}
TERMINAL = frozenset({"failed", "stopped"})
EXITED_RANK = 100  # a bad exit with no failure in the log names nothing better
POST_LOAD_MILESTONES = frozenset(
    {
        "weights_loaded",  # `Loading weights took`: the weights are in
        "model_memory",
        "torch_compile",
        "kv_cache",
        "graph_capture",
        "engine_init",
        "api_server_start",
    }
)
LOADING_MILESTONES = frozenset({"model_load_start", "checkpoint_info", "gguf_shards"})


# The daemon's hold of a fatal failure for the crash's echoes (`[forecast] failure_hold_s`'s
# default; analyze holds as long, on the log's own time): vLLM logs `EngineCore failed to
# start.` before the traceback that says why.
FAILURE_HOLD_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class StateConfig:
    max_sessions: int = 16  # earlier sessions kept
    max_bars: int = 32  # per session
    max_warning_codes: int = 64  # further codes count as "other"
    max_layer: int = 4096  # layer numbers kept as bits below this
    max_processes: int = 16  # per warning code / failure
    max_failures: int = 32  # distinct (kind, message) per session
    max_phase_history: int = 64
    stall_k: float = 5.0  # stall: no progress for k x the expected shard time ...
    stall_floor_s: float = 60.0  # ... and never less than this
    health_failures_not_ready: int = 2  # failed /health probes in a row that end readiness
    require_completion: bool = False  # ready only once one tiny completion succeeded
    stall_first_shard_s: float = 600.0  # before any shard finished (model init, first file)
    # nothing logged at all outside the weights bar (`[forecast] quiet_stall_s`); None: never
    quiet_stall_s: float | None = 1800.0
    io_progress_bytes: int = 4 * 1024**2  # bytes read that count as progress
    adopt_window_s: float = 30.0  # a log-opened session adopts a process start this soon
    # Once serving, a failure the log showed is fatal only if the server dies or /health fails
    # within this many seconds of it (fold_failure.py `corroborate`).
    corroboration_window_s: float = 120.0
    # A fatal failure is held this long (the daemon's clock) before the session fails, so the
    # echoes one crash leaves (`EngineCore failed to start.` before the traceback that says why)
    # are folded into its root cause first (fold_failure.py `settle_failure`). The daemon's is
    # `[forecast] failure_hold_s` (`FAILURE_HOLD_S` unless set); 0 decides at the first fatal
    # record.
    failure_hold_s: float = 0.0
    eta: EtaConfig = field(default_factory=EtaConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    # the last starts that got ready (learned.py), oldest first: the daemon reads them from its
    # state directory (daemon/history.py) and hands them in; () : no history, no ETA to ready,
    # and `quiet_stall_s` alone judges a step without a bar
    history: tuple[PastStart, ...] = ()


# -- per-session records ------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseSpan:
    phase: str
    entered_at: float
    left_at: float
    failure_kind: str | None


@dataclass(frozen=True)
class BarTrack:
    key: str
    process: str | None
    kind: str
    desc: str
    index: int  # nth bar of this process and kind in the session
    done: int
    total: int
    started_at: float
    last_update_at: float
    last_progress_at: float | None
    finished_at: float | None
    updates: int
    longest_gap_s: float | None
    tqdm_remaining_s: float | None
    eta: EtaState | None  # weights bars only
    unit: str = "items"  # what done/total count: files, tensors, bytes, items
    # where the ETA's byte weights come from: "model_dir" (the shards' sizes), "checkpoint_size"
    # (vLLM's `Checkpoint size: N GiB` divided evenly over the files), None (counted as is)
    sizes_from: str | None = None
    # vLLM's own seconds per file at the last update (tqdm's rate, else elapsed / done): what a
    # file takes when the daemon saw the updates too close together to time them itself
    tqdm_item_s: float | None = None


@dataclass(frozen=True)
class WarningTally:
    code: str
    severity: str
    count: int
    first_at: float
    last_at: float
    layers_mask: int  # bit n set: layer n warned
    layers_over: int  # layer numbers too large to keep
    scales: frozenset[str]
    processes: frozenset[str]
    sample: str


class MilestoneSeen(NamedTuple):
    """A milestone's sightings in a session (a named tuple, made with `new_tuple` per milestone
    line: see timeline.py's `Step`)."""

    kind: str
    detail: str | None
    count: int  # type: ignore[assignment]  # (the field hides the tuple's `count()`)
    first_at: float
    last_at: float
    seconds: float | None
    gib: float | None
    tokens: int | None
    blocks: int | None
    value: str | None


@dataclass(frozen=True)
class IoTrack:
    last_bytes: int
    last_at: float
    mark_bytes: int  # bytes at the last io progress
    mark_at: float | None  # when bytes last grew by io_progress_bytes
    line_bytes: int  # bytes when the last weights line came


@dataclass(frozen=True)
class Stall:
    # "rank": one process went silent while its peers moved on (ranks.py)
    kind: Literal["progress", "quiet", "rank"]
    since: float
    raised_at: float
    threshold_s: float
    expected_shard_s: float | None
    reason: str
    resume_phase: str
    process: str | None = None  # the silent process (ranks.py `who`), for a "rank" stall


class ProcessTrack(NamedTuple):
    """One process of a session, as its lines tell (ranks.py: a named tuple made anew with
    `new_tuple` for each run of lines it prints, as milestones are)."""

    name: str
    family: str  # the name without its rank numbers: its peers share it
    pid: int | None
    first_offset: int
    first_at: float
    last_offset: int
    last_at: float
    phase: str  # the session's (live) phase at its last line
    mark: int  # the session's weights-bar updates seen by its last line (peers past it: later)
    shard: int  # the weights shards done (the bar's count) at its last line
    bar_done: int | None = None  # its own weights bar, where it prints one
    bar_total: int | None = None
    step: str = ""  # the start-up's step under way at its last line (timeline.py)


@dataclass(frozen=True, slots=True)
class Failing:
    """A fatal failure held for its echoes: the session fails once the hold is over."""

    since: float  # the daemon's clock when the first fatal record was folded (the hold's start)
    at: float  # when it happened on the session's timeline (a replayed record: its stamp)
    replayed: bool  # first seen in records read back (a restart, a log of the past)


@dataclass(frozen=True)
class Session:
    """One vLLM start: who it is and how it started and ended, its phase and stall, its bars
    and bytes read, its warnings, failures and milestones. One flat record: the fold copies it
    once per run of inputs (`LoadState.apply_run`), not per input, so splitting it buys nothing."""

    id: int
    reason: str
    started_at: float
    pid: int | None = None
    argv: tuple[str, ...] | None = None
    version: str | None = None
    load_started_by: frozenset[str] = frozenset()
    kv: KvEvidence = field(default_factory=KvEvidence)  # what the log says about the KV-cache dtype
    api_server_at: float | None = None
    # the options that size memory as vLLM logged them at start (its `non-default args`),
    # argv-shaped: the memory plan's layout when the process's own argv is not known
    launch_args: tuple[str, ...] | None = None
    server_pid: int | None = None  # the API server's pid as the log gives it
    completion: CompletionProbe | None = None  # the servable check's answer, once it came
    ready_at: float | None = None
    # vLLM seen running by this daemon: the ready line read live, a /health 200, or its process
    # here. A session read back ready (a restart, the log of a vLLM since killed) is not ready
    # until one says so (snapshot_builder.py `readiness`).
    seen_live: bool = False
    # The model's page cache when the start began ("warm", "cold"; None: not looked at): the
    # start history compares starts by it (learned.py).
    page_cache: str | None = None
    stop_requested: bool = False
    ended_at: float | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    # the phase, its history, the failure kind and the stall
    phase: str = "starting"
    phase_entered_at: float = 0.0
    history: tuple[PhaseSpan, ...] = ()
    failure_kind: str | None = None
    failing: Failing | None = None  # a fatal failure held for its echoes
    stall: Stall | None = None
    stalls_total: int = 0
    # progress bars and bytes read
    bars: Mapping[str, BarTrack] = field(default_factory=dict)
    bar_latest: Mapping[str, str] = field(default_factory=dict)
    last_progress_at: float | None = None
    io: IoTrack | None = None
    # warnings, failures, milestones
    warnings: Mapping[str, WarningTally] = field(default_factory=dict)
    warnings_total: int = 0
    failures: Mapping[tuple[str, str], FailureTally] = field(default_factory=dict)
    failures_total: int = 0
    milestones: Mapping[str, MilestoneSeen] = field(default_factory=dict)
    ep_filter: EpFilterSeen | None = None  # `EP weight filter: ...` (vLLM PR #37136)
    last_event_at: float = 0.0
    log_seen: bool = False  # a log event came in this session
    backlog_read_at: float | None = None  # the daemon's clock when it last read a backlog
    stall_hints: int = 0
    last_hint_s: float | None = None
    timeline: Timeline = field(default_factory=Timeline)  # the start-up's steps (timeline.py)
    # every process that wrote to the log, by `Worker_TP5 pid=1234` (ranks.py `who`), and what
    # a rank's peers past it are told by
    processes: Mapping[str, ProcessTrack] = field(default_factory=dict)
    weights_updates: int = 0  # weights-bar updates so far (a rank's peers past it: later ones)
    weights_done: int = 0  # the latest weights-bar update's count


@dataclass(frozen=True)
class EpFilterSeen:
    """The expert-parallel weight filter this load runs with: a rank reads only its experts."""

    ep_size: int
    ep_rank: int
    experts_loaded: int
    experts_total: int
    at: float
    process: str | None


@dataclass(frozen=True)
class GpuTrack:
    sample: GpuSample
    fit: MemoryFit | None = None
    projection: MemoryProjection | None = None
    oom_since: float | None = None
    last_xid: int | None = None  # (the counts: `StateData.xids`)
    # the last a sample gave (a poll whose static read failed gives none: the one known stays)
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class Lifetime:
    """Counts over every session the state has seen, the current one not yet in: what a
    session carried when the next one began. /metrics' counters are these plus the current
    session's, so they stay exact however many sessions are kept."""

    warnings: Mapping[str, int] = field(default_factory=dict)  # by code
    failures: Mapping[str, int] = field(default_factory=dict)  # sessions failed, by kind
    stalls: int = 0
    ready: int = 0  # sessions that became ready


@dataclass(frozen=True)
class StateData:
    """The fields of `LoadState` (loadstate.py adds its behaviour)."""

    config: StateConfig = field(default_factory=StateConfig)
    session: Session | None = None
    transitions: tuple[Transition, ...] = ()
    inputs_total: int = 0
    # sessions before the current one, summarised
    past: tuple[SessionSummary, ...] = ()
    sessions_total: int = 0
    lifetime: Lifetime = field(default_factory=Lifetime)
    # what the daemon knows besides the log: the checkpoint, the supervisor, health, GPUs
    model: ModelInfo | None = None
    cum_bytes: tuple[int, ...] | None = None  # bytes of the first n shards, n = 0..N
    supervisor: ProcessEvent | None = None
    health: HealthProbe | None = None
    health_failures: int = 0
    gpus: Mapping[int, GpuTrack] = field(default_factory=dict)
    gpu_source_up: bool | None = None
    gpu_error: str | None = None
    node: NodeFacts = field(default_factory=NodeFacts)  # this node's place in the deployment
    node_load: NodeLoad = field(default_factory=NodeLoad)  # the load as this node sees it
    node_pids: tuple[int, ...] = ()  # vLLM pids from the log's prefixes (watch mode reads them)
    # Counts over the state's life, /metrics' counters (a daemon restart rebuilds the log's from
    # the current session's records; the GPUs' and the processes' begin again):
    # records of text a client chose (parsers' `ClientText`), by kind, set aside unread
    client_text: Mapping[str, int] = field(default_factory=dict)
    events: Mapping[str, int] = field(default_factory=dict)  # log events folded, by type
    # NVML Xid errors by (GPU index, its UUID, Xid code)
    xids: Mapping[tuple[int, str | None, int], int] = field(default_factory=dict)
    vllm_exits: Mapping[str, int] = field(default_factory=dict)  # clean, failed, signal
    vllm_started_at: float | None = None  # the supervisor's last start of vLLM
    # processes of the last exited vLLM tree still holding GPU memory; None: not checked yet
    orphans: int | None = None
    # supervise mode: the crash loop under way and the remedies' counts (supervise/ladder.py)
    crash_loop: CrashLoop = field(default_factory=CrashLoop)
    remedy_counts: RemedyCounts = field(default_factory=RemedyCounts)

    @property
    def restarts(self) -> int:
        return max(self.sessions_total - 1, 0)


def retire(life: Lifetime, s: Session) -> Lifetime:
    """`life` with the counts of session `s`, which ends."""
    warnings = dict(life.warnings)
    for code, w in s.warnings.items():
        warnings[code] = warnings.get(code, 0) + w.count
    failures = dict(life.failures)
    if s.failure_kind is not None:
        failures[s.failure_kind] = failures.get(s.failure_kind, 0) + 1
    return Lifetime(
        warnings, failures, life.stalls + s.stalls_total, life.ready + (s.ready_at is not None)
    )


def failure_rank(kind: str | None) -> int:
    if kind is None:
        return EXITED_RANK + 1
    return FAILURE_RANK.get(kind, EXITED_RANK)


# -- reading the state --------------------------------------------------------------------------


def stage_bars(s: Session) -> list[BarTrack]:
    """The weights bars of the latest stage (stage 0: the model; later: a draft model...)."""
    bars = [b for b in s.bars.values() if b.kind == "weights"]
    if not bars:
        return []
    stage = max(b.index for b in bars)
    return [b for b in bars if b.index == stage]


def io_since_line(s: Session) -> int | None:
    io = s.io
    if io is None:
        return None
    return max(io.last_bytes - io.line_bytes, 0)


def main_fraction(s: Session, now: float) -> tuple[float | None, float, bool]:
    """Fraction of the model's weights loaded at `now` (the slowest process), the fraction at
    which the first shard ends, and whether the fraction is by bytes. Counted files are no base
    for an OOM alarm: with shards of unknown, unequal sizes the count can run far from the
    bytes."""
    worst: float | None = None
    first = 0.0
    by_bytes = True
    for b in s.bars.values():
        if b.kind != "weights" or b.index != 0 or b.eta is None:
            continue
        if b.finished_at is not None:
            continue
        eta = b.eta
        total = eta.total
        if total <= 0:
            continue
        frac = eta.position(now, io_since_line(s)) / total
        first = eta.x(1) / total
        by_bytes = by_bytes and eta.cum is not None
        worst = frac if worst is None else min(worst, frac)
    return worst, first, by_bytes and worst is not None


def summarise(s: Session, at: float) -> SessionSummary:
    bars = [b for b in s.bars.values() if b.kind == "weights" and b.index == 0]
    done = min((b.done for b in bars), default=None)
    total = max((b.total for b in bars), default=None)
    return SessionSummary(
        id=s.id,
        reason=s.reason,
        pid=s.pid,
        started_at=s.started_at,
        ended_at=s.ended_at if s.ended_at is not None else at,
        phase=s.phase,
        failure_kind=s.failure_kind,
        stop_requested=s.stop_requested,
        exit_code=s.exit_code,
        exit_signal=s.exit_signal,
        time_to_ready_s=s.ready_at - s.started_at if s.ready_at is not None else None,
        weights_load_s=weights_load_s(s),
        shards_done=done,
        shards_total=total,
        warnings_total=s.warnings_total,
        failures_total=s.failures_total,
        stalls_total=s.stalls_total,
        timeline=timeline_view(s.timeline, s.bars, s.ended_at if s.ended_at is not None else at),
    )


def weights_load_s(s: Session) -> float | None:
    m = s.milestones.get("weights_loaded")
    if m is not None and m.seconds is not None:
        return m.seconds
    bars = [b for b in s.bars.values() if b.kind == "weights" and b.index == 0]
    if bars and all(b.finished_at is not None for b in bars):
        return max(b.finished_at - b.started_at for b in bars if b.finished_at is not None)
    return None
