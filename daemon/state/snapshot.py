"""What exporters read: an immutable, JSON-ready view of the load state, and state transitions.

`LoadState.snapshot(now)` builds a `Snapshot`; `Snapshot.to_dict()` is the `/status` JSON. Times
are epoch seconds, durations `_s`, sizes `_bytes`; a value that is not known is `null`, never 0.

The `/status` JSON (schema 1) is documented in docs/status.md; keep the two in step.

Transitions (`LoadState.transitions` after each `apply`), one JSON object each for the event log:
`{"transition": kind, "at": ..., "session": id, ...}` with kind one of `session_started`,
`phase`, `stall_raised`, `stall_cleared`, `forecast_raised`, `forecast_cleared`, `failure`;
fields that do not apply are left out. Forecast transitions name the forecast
(`"forecast": "oom_predicted"`), the GPU, and for a raise the projected bytes, the GPU's total,
the shortfall and the fraction of the weights loaded when it was raised.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from loadwatch.daemon.state.records import plain

if TYPE_CHECKING:
    from loadwatch.daemon.state.crashloop import FirstFailure, RemedyStep
    from loadwatch.daemon.state.node import NodeRoleView
    from loadwatch.daemon.state.nodeprogress import NodeProgressView
    from loadwatch.daemon.state.ranks import ProcessView

SCHEMA = 1


TransitionKind = Literal[
    "session_started",
    "phase",
    "stall_raised",
    "stall_cleared",
    "forecast_raised",
    "forecast_cleared",
    "failure",
]


@dataclass(frozen=True, slots=True)
class Transition:
    kind: TransitionKind
    at: float
    session: int | None
    phase_from: str | None = None
    phase_to: str | None = None
    reason: str | None = None
    failure_kind: str | None = None
    message: str | None = None
    fatal: bool | None = None
    forecast: str | None = None  # "oom_predicted"
    gpu_index: int | None = None
    projected_bytes: float | None = None
    total_bytes: int | None = None
    shortfall_bytes: float | None = None
    fraction: float | None = None
    since: float | None = None
    threshold_s: float | None = None
    duration_s: float | None = None
    offset: int | None = None  # where the log record that made it starts (None: not a record)
    # decided on records read back (a restart's replay, the backlog of a first start), though
    # after it: the event log marks it so, and the supervisor's current run is not told of it
    replay: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"transition": self.kind}
        for f in dataclasses.fields(self):
            if f.name == "kind":
                continue
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = plain(v)
        return out


# The start-up timeline's phases in load order (daemon/state/timeline.py says what each is), and
# the step whose phase the log has not said yet.
STARTUP_PHASES = (
    "config",
    "weights",
    "weight_postprocess",
    "torch_compile",
    "autotune",
    "kv_cache",
    "graph_capture",
    "engine_ready",
    "api_server",
    "first_completion",
)
STARTUP_UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class StartupStepView:
    """One step of the start-up timeline (daemon/state/timeline.py): a phase as an operator
    names it, from its start to the next step's (None: under way)."""

    phase: str
    started_at: float
    ended_at: float | None
    duration_s: float  # to its end, or to the snapshot's time while under way
    last_line_at: float | None  # its own last line; the time after it is the step's quiet end
    began_before_log: bool  # the log begins inside it: its true start is earlier
    detail: str | None  # e.g. "loaded from the compile cache"
    bars: tuple[str, ...]  # what each of its bars counted: "desc: done/total unit"


@dataclass(frozen=True, slots=True)
class StartupEtaView:
    """The time left to ready from earlier comparable starts (daemon/state/learned.py)."""

    remaining_low_s: float
    remaining_s: float  # the median
    remaining_high_s: float
    ready_at: float  # now + remaining_s
    step: str  # the step under way
    past_starts: int  # how many earlier starts it rests on
    overdue_s: float | None  # how far past the slowest of them this start has run (None: not known)
    basis: str  # one line: what the figures come from
    # How far the step under way has run past the slowest of them in its phase (None: no past
    # start has the phase, or the log has not named the step yet)
    phase_overdue_s: float | None = None


@dataclass(frozen=True, slots=True)
class SessionSummary:
    id: int
    reason: str
    pid: int | None
    started_at: float
    ended_at: float | None
    phase: str
    failure_kind: str | None
    stop_requested: bool
    exit_code: int | None
    exit_signal: int | None
    time_to_ready_s: float | None
    weights_load_s: float | None
    shards_done: int | None
    shards_total: int | None
    warnings_total: int
    failures_total: int
    stalls_total: int
    timeline: tuple[StartupStepView, ...] = ()  # the start-up's steps, as the session ended


@dataclass(frozen=True, slots=True)
class PhaseSpanView:
    phase: str
    entered_at: float
    left_at: float | None
    duration_s: float
    failure_kind: str | None


@dataclass(frozen=True, slots=True)
class EtaView:
    remaining_s: float
    low_s: float
    high_s: float
    finish_at: float
    finish_low_at: float
    finish_high_at: float
    rate_per_s: float
    units: str
    # what the estimate rests on, in words: what the bar counts, where the byte weights come
    # from, what makes per-shard time unlike the shards' sizes (the EP weight filter)
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProgressView:
    stage: int  # 0: the model's weights; 1, 2, ...: bars that followed (a draft model)
    shards_done: int | None
    shards_total: int | None
    bytes_done: int | None
    bytes_total: int | None
    ratio: float | None
    last_progress_at: float | None
    read_bytes: int | None
    eta: EtaView | None


@dataclass(frozen=True, slots=True)
class BarView:
    key: str
    process: str | None
    kind: str
    desc: str
    index: int
    done: int
    total: int
    started_at: float
    last_update_at: float
    last_progress_at: float | None
    finished_at: float | None
    rate_per_s: float | None
    longest_gap_s: float | None
    updates: int
    tqdm_remaining_s: float | None
    unit: str = "items"  # what done/total count: files, tensors, bytes, items
    sizes_from: str | None = None  # the ETA's byte weights: model_dir, checkpoint_size, None


@dataclass(frozen=True, slots=True)
class EpFilterView:
    """`EP weight filter: ep_size=8, ep_rank=0, loading 32/256 experts` (vLLM PR #37136)."""

    ep_size: int
    ep_rank: int
    experts_loaded: int
    experts_total: int
    at: float
    process: str | None


@dataclass(frozen=True, slots=True)
class StallView:
    active: bool
    kind: str | None  # "progress": weights stopped; "quiet": nothing logged; "rank": ranks.py
    since: float | None
    raised_at: float | None
    silent_s: float | None
    threshold_s: float | None
    expected_shard_s: float | None
    reason: str | None
    stalls_total: int
    hints: int
    last_hint_s: float | None


@dataclass(frozen=True, slots=True)
class WarningView:
    code: str
    severity: str
    count: int
    verdict: str
    reason: str
    layers: tuple[int, ...]
    layer_count: int
    scales: tuple[str, ...]
    processes: tuple[str, ...]
    first_at: float
    last_at: float
    sample: str


@dataclass(frozen=True, slots=True)
class EchoView:
    """One record folded into a root cause: an echo, a wrapper, a re-raise, or the root itself."""

    offset: int
    exc_type: str | None
    message: str
    process: str | None


@dataclass(frozen=True, slots=True)
class FailureView:
    """One root cause; `count` counts its records, the root's first one and `echoes` more."""

    kind: str
    exc_type: str | None
    message: str
    first_line: str
    count: int
    fatal: bool
    first_at: float
    last_at: float
    processes: tuple[str, ...]
    offset: int | None = None  # the root's first record (the anchor)
    echoes: int = 0
    evidence: tuple[EchoView, ...] = ()


@dataclass(frozen=True, slots=True)
class MilestoneView:
    key: str
    kind: str
    detail: str | None
    count: int
    first_at: float
    last_at: float
    seconds: float | None
    gib: float | None
    tokens: int | None
    blocks: int | None
    value: str | None


@dataclass(frozen=True, slots=True)
class KvCacheView:
    dtype: str | None
    quantized: bool | None
    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class MemoryPlanView:
    """The memory plan per GPU and, once vLLM sized its KV cache, what it reported
    (daemon/state/plan_actual.py). None fields: not known."""

    verdict: str  # fits, tight, will_fail, unknown
    predicted_error: str | None
    kv_dtype: str
    kv_bytes_per_token: float | None
    block_size: int
    max_model_len: int | None
    weights_bytes_per_gpu: int | None
    capacity_bytes_per_gpu: int | None
    budget_low_bytes: int | None
    budget_high_bytes: int | None
    planned_tokens_low: int | None
    planned_tokens_high: int | None
    actual_available_bytes: int | None  # vLLM's "Available KV cache memory"
    actual_tokens: int | None  # vLLM's "GPU KV cache size"
    expected_tokens: int | None  # the plan's bytes per token over vLLM's available memory
    actual_vs_plan: str  # pending, as_planned, below_budget, above_budget, differs
    explain: str


@dataclass(frozen=True, slots=True)
class SessionView:
    id: int
    reason: str
    pid: int | None
    started_at: float
    version: str | None
    phase: str
    phase_entered_at: float
    phase_age_s: float
    failure_kind: str | None
    stop_requested: bool
    ended_at: float | None
    exit_code: int | None
    exit_signal: int | None
    ready_at: float | None
    time_to_ready_s: float | None
    weights_load_s: float | None
    server_pid: int | None  # the API server's pid as the log gives it
    first_completion_s: float | None  # the servable check's latency: time to first token
    verdict: str  # ready | failed | incomplete: what analyze says of this session, decided here
    reached: str  # the furthest of starting, loading_weights, post_load, ready
    history: tuple[PhaseSpanView, ...]
    progress: ProgressView
    bars: tuple[BarView, ...]
    stall: StallView
    warnings: tuple[WarningView, ...]
    warnings_total: int
    failures: tuple[FailureView, ...]
    failures_total: int
    milestones: tuple[MilestoneView, ...]
    ep_weight_filter: EpFilterView | None = None
    timeline: tuple[StartupStepView, ...] = ()  # the start-up's steps (timeline.py)
    startup_eta: StartupEtaView | None = None  # the time left to ready (learned.py)
    startup_eta_reason: str | None = None  # why there is none
    processes: tuple[ProcessView, ...] = ()  # every process that logged (ranks.py)


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    uuid: str | None
    name: str | None
    health: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_ratio: float | None
    temperature_celsius: float | None
    power_watts: float | None
    sampled_at: float | None
    error: str | None
    xids_total: int
    last_xid: int | None
    projected_final_bytes: float | None
    projected_low_bytes: float | None
    projected_high_bytes: float | None
    oom_predicted: bool
    shortfall_bytes: float | None
    oom_predicted_since: float | None


@dataclass(frozen=True, slots=True)
class ModelView:
    path: str
    shards: int
    total_bytes: int | None
    checkpoint_kv_dtype: str | None
    errors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SupervisorView:
    state: str
    at: float
    pid: int | None
    exit_code: int | None
    signal: int | None
    reason: str | None
    backoff_s: float | None


@dataclass(frozen=True, slots=True)
class HealthView:
    ok: bool
    at: float
    status: int | None
    error: str | None
    consecutive_failures: int


@dataclass(frozen=True, slots=True)
class NodeView:
    """This node in its deployment: its role (node.py) and the load as its own signals tell
    it (nodeprogress.py). `ready`: the head serves; a headless node has its weights loaded and
    its processes did not fail."""

    role: NodeRoleView
    progress: NodeProgressView
    ready: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    schema: int
    at: float
    phase: str | None
    ready: bool
    not_ready: str | None  # why /readyz says 503, one line (None when ready)
    live: bool  # what /livez answers: False once stalled, failed for good, or crash looping
    not_live: str | None  # why not, one line
    restarts: int
    sessions_total: int
    session: SessionView | None
    sessions: tuple[SessionSummary, ...]
    model: ModelView | None
    kv_cache: KvCacheView
    memory_plan: MemoryPlanView | None
    gpu_source_up: bool | None
    gpu_error: str | None
    gpus: tuple[GpuView, ...]
    supervisor: SupervisorView | None
    health: HealthView | None
    node: NodeView | None = None
    client_text: Mapping[str, int] = field(default_factory=dict)  # records set aside, by kind
    first_failure: FirstFailure | None = None  # of the crash loop under way (state/crashloop.py)
    remedies: tuple[RemedyStep, ...] = ()  # tried in that loop, or that helped the last one

    def to_dict(self) -> dict[str, Any]:
        """The `/status` JSON (see the module doc)."""
        out: dict[str, Any] = plain(self)
        return out


__all__ = [
    "SCHEMA",
    "STARTUP_PHASES",
    "STARTUP_UNKNOWN",
    "BarView",
    "EchoView",
    "EtaView",
    "FailureView",
    "GpuView",
    "HealthView",
    "KvCacheView",
    "MemoryPlanView",
    "MilestoneView",
    "ModelView",
    "NodeView",
    "PhaseSpanView",
    "ProgressView",
    "SessionSummary",
    "SessionView",
    "Snapshot",
    "StallView",
    "StartupEtaView",
    "StartupStepView",
    "SupervisorView",
    "Transition",
    "TransitionKind",
    "WarningView",
    "plain",
]
