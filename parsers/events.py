"""Value types that cross the parser boundary: records in, events out.

Every event is a small frozen dataclass. ``ts`` is the record's own time (epoch seconds, from the
vLLM header or derived from a progress bar's elapsed field) and is ``None`` when the record carries
none. ``offset`` is the byte offset of the record that produced the event; for a folded traceback it
is the offset of its first record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal, TypeVar

_fill: Callable[..., Any] | None
try:  # the C helper, where it was built (a pure-Python install has not)
    from loadwatch.parsers._scan import fill as _fill
except ImportError:
    _fill = None

Severity = Literal["info", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Record:
    """One record of the log: the bytes between two terminators (``\\n``, ``\\r\\n`` or ``\\r``)."""

    text: str
    offset: int = 0
    file_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Fields every event has."""

    type: ClassVar[str] = "event"
    offset: int = 0
    ts: float | None = None
    process: str | None = None  # the `(NAME pid=P)` name, e.g. "Worker_TP0", "EngineCore_0"
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the type name first; used by golden files and the event log."""
        out: dict[str, Any] = {"type": self.type}
        for name in field_names(type(self)):
            value = getattr(self, name)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_E = TypeVar("_E")


def field_names(cls: type) -> tuple[str, ...]:
    """An event class's field names, in order (read once per class)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def filler(cls: type[_E], names: Sequence[str]) -> Callable[..., _E]:
    """`make(values, *more)`: a new event of `cls` with its fields `names` set, in order, to
    `values` then `more`, each as `object.__setattr__` (where a frozen dataclass's `__init__`
    ends) sets it. A load builds one event per record: in C (_scan.c's `fill`), that costs a
    third of setting the fields one Python-level call at a time, as below."""
    slots = tuple(_slot(cls, name) for name in names)
    if _fill is not None:
        return partial(_fill, cls, slots)
    setters = tuple(slot.__set__ for slot in slots)

    def make(values: tuple[Any, ...], *more: Any) -> _E:
        event = object.__new__(cls)
        for set_slot, value in zip(setters, (*values, *more), strict=True):
            set_slot(event, value)
        return event

    return make


def _slot(cls: type, name: str) -> Any:
    """The slot descriptor of field `name` (the class's own, or a base's)."""
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    raise AttributeError(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardProgress(Event):
    """One update of a tqdm progress bar (weights, graph capture, prefetch, kernel autotuning:
    a bar counting a unit of its own, `profile/s`)."""

    type: ClassVar[str] = "shard_progress"
    desc: str
    bar: Literal["weights", "graph_capture", "prefetch", "autotune", "other"]
    done: int
    total: int
    elapsed_s: float | None = None
    remaining_s: float | None = None
    rate_per_s: float | None = None  # units per second, converted from `s/it` when needed
    # What `done`/`total` count: "files" (the safetensors bars), "tensors" (the Run:ai streamer,
    # InstantTensor before vLLM PR #46868), "bytes" (tqdm's unit-scaled `13.3G/155G`, ?B/s:
    # InstantTensor since PR #46868), "items" (anything else: graph sizes, ...).
    unit: Literal["files", "tensors", "bytes", "items"] = "items"


@dataclass(frozen=True, slots=True, kw_only=True)
class KvScaleWarning(Event):
    """`Found k_scale in the checkpoint (e.g. X), but not found the expected name ...`."""

    type: ClassVar[str] = "kv_scale_warning"
    scale: Literal["k", "v", "q", "kv", "prob", "zero_point", "other"]
    layer: int | None = None
    checkpoint_name: str | None = None
    model_name: str | None = None
    deprecated: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ScaleFactorWarning(Event):
    """The scaling-factor family: default 1.0 KV scale, q scale from k, uncalibrated q/prob."""

    type: ClassVar[str] = "scale_factor_warning"
    code: Literal["kv_scale_default", "q_scale_from_k", "q_prob_scale_default"]
    message: str = ""


MilestoneKind = Literal[
    "version",
    "model_load_start",
    "checkpoint_info",
    "attention_backend",
    "weights_loaded",
    "model_memory",
    "torch_compile",
    "kv_cache",
    "graph_capture",
    "engine_init",
    "api_server_start",
    "app_startup_complete",
    "gguf_shards",
    "model_init",
    "shutdown",
    "launch_args",
    "engine_config",  # detail: the config's kv_cache_dtype, value: the model path
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Milestone(Event):
    """A step of the startup sequence. Unused value fields stay ``None``."""

    type: ClassVar[str] = "milestone"
    kind: MilestoneKind
    detail: str | None = None  # sub-kind: e.g. "available_memory", "blocks", "compile_total"
    seconds: float | None = None
    gib: float | None = None
    tokens: int | None = None
    blocks: int | None = None
    count: int | None = None
    value: str | None = None  # version, backend name, model name, URL, filesystem type
    # launch_args: the options that size memory, as a command line gives them
    # (`--tensor-parallel-size`, `8`, ...), from the arguments vLLM logs at start
    args: tuple[str, ...] | None = None


FailureKind = Literal[
    "cuda_oom",
    "kv_cache_too_small",
    "max_model_len",
    "engine_init_failed",
    "worker_died",
    "nccl",
    "startup_timeout",
    "fp8_kv_unsupported",
    "completion_failed",  # the servable check's completion failed (not a log line)
    "other",
    # vLLM's process went away with no shutdown line and no stop asked for (SIGKILL, the OOM
    # killer): not a log line, the process watch's (daemon/vllm_watch.py)
    "vanished",
]


# Kinds that say something failed without saying why: a worker or engine died, start-up failed.
CONSEQUENCE_KINDS: frozenset[str] = frozenset({"worker_died", "engine_init_failed"})

# When several failures describe one crash, the most telling one names it (lowest first). Every
# grammar emits this vocabulary, so its order is stated here, once, beside it.
FAILURE_RANK: dict[str, int] = {
    "fp8_kv_unsupported": 0,
    "cuda_oom": 1,
    "kv_cache_too_small": 2,
    "max_model_len": 3,
    "nccl": 4,
    "startup_timeout": 5,
    "worker_died": 6,
    "engine_init_failed": 7,
    "completion_failed": 8,  # not from the log: loadwatch's servable check (daemon/watch.py)
    "other": 9,
    "vanished": 10,  # not from the log: the process gone without a word (daemon/vllm_watch.py)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure(Event):
    """A fatal or likely-fatal error: one ERROR line, or a whole traceback folded into one."""

    type: ClassVar[str] = "failure"
    kind: FailureKind
    message: str
    exc_type: str | None = None
    first_line: str = ""
    records: int = 1  # how many records the failure spans
    last_offset: int = 0
    # The engine's own word that it died (`EngineCore encountered a fatal error`, a worker's
    # death), not an error it reported: once vLLM serves, only such a failure (or the process's
    # exit, or /health failing) fails the session; any other error may be a request's.
    engine_fatal: bool = False
    # The grammar's word that the record says something failed elsewhere, not what (a dead
    # worker, a failed start, a traceback cut before its exception line): the state folds it
    # into the root cause it echoes.
    consequence: bool = False
    # The message a re-raising wrapper carries (`Worker failed with error '<cause>', please
    # check ...`), when the record is one: the root cause's own message.
    cause: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StallHint(Event):
    """`No available shared memory broadcast block found in N seconds`."""

    type: ClassVar[str] = "stall_hint"
    seconds: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogWarning(Event):
    """A WARNING record that no catalog entry knows; grouped by its source location."""

    type: ClassVar[str] = "log_warning"
    source: str | None = None  # "file.py:123" from the header
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogError(Event):
    """An ERROR/CRITICAL record outside a traceback that no catalog entry knows."""

    type: ClassVar[str] = "log_error"
    source: str | None = None
    message: str = ""


ClientTextKind = Literal[
    "request_received",  # `Received request ID: prompt: ...`, `Request ID details: ...`
    "request_added",  # `Added request ID.` (V1, `--enable-log-requests`)
    "request_aborted",  # `Aborted request ID.`
    "request_finished",  # `Finished request ID.` (V0)
    "response_generated",  # `Generated response ID: output: ...` (`--enable-log-outputs`)
    "model_error",  # `Error with model ...`: an unknown model name a request asked for
    "request_error",  # `Request ID failed with ...`, `Exception caught. Request id: ID`
    "request_fields_ignored",  # the request's own JSON keys, echoed in a validation warning
    "access",  # uvicorn's access line: the client's address and request path
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientText(Event):
    """A record that carries text a client of vLLM chose (a request id, a prompt, a model name,
    a request path): counted as serving traffic and never read for anything else, whatever it
    holds. Only its kind is kept, never its text."""

    type: ClassVar[str] = "client_text"
    kind: ClientTextKind


# How many of a message's words name an unrated warning's code: enough to tell messages apart,
# few enough that a value vLLM interpolates late in the line does not make a new code.
CODE_WORDS = 6


def message_code(kind: str, message: str) -> str:
    """A code for a warning or error no catalog entry knows, taken from its message, not its
    file:line (which moves with every vLLM release): `log.found_ulimit_of_and_failed_to`. Words
    are the message's first letters-only words, lowercased; numbers, paths, quoted values and
    identifiers with digits or dots are left out, so the same message keeps its code."""
    words: list[str] = []
    for raw in message.split():
        word = raw.strip(".,:;!?()[]{}<>'\"`").lower()
        if word.isascii() and word.isalpha() and len(word) > 1:
            words.append(word)
            if len(words) == CODE_WORDS:
                break
    return f"{kind}.{'_'.join(words) or 'unknown'}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelInit(Event):
    """`world_size=W rank=R local_rank=L distributed_init_method=M backend=B`: one per worker,
    as it joins torch.distributed (the rank is global across nodes)."""

    type: ClassVar[str] = "parallel_init"
    world_size: int
    rank: int
    local_rank: int
    init_method: str | None = None
    backend: str | None = None


NodeLaunchMode = Literal["headless_tp_pp", "headless_dp"]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLaunch(Event):
    """A node without the API server: `Launching vLLM (vX) headless multiproc executor, with head
    node address A for torch.distributed process group.` (TP/PP across nodes) or `Launching N
    data parallel engine(s) in headless mode, with head node address tcp://A.` (DP)."""

    type: ClassVar[str] = "node_launch"
    mode: NodeLaunchMode
    head_address: str | None = None
    engines: int | None = None  # headless DP: the engines this node runs


@dataclass(frozen=True, slots=True, kw_only=True)
class EpWeightFilter(Event):
    """`EP weight filter: ep_size=8, ep_rank=0, loading 32/256 experts` (vLLM PR #37136, opt-in
    `--enable-ep-weight-filter`): this rank reads only its experts' weights. The weights bar
    still counts every shard, but each shard costs far less than its size says."""

    type: ClassVar[str] = "ep_weight_filter"
    ep_size: int
    ep_rank: int
    experts_loaded: int
    experts_total: int


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        ShardProgress,
        KvScaleWarning,
        ScaleFactorWarning,
        Milestone,
        Failure,
        StallHint,
        LogWarning,
        LogError,
        ParallelInit,
        NodeLaunch,
        EpWeightFilter,
        ClientText,
    )
}


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of :meth:`Event.to_dict`."""
    data = dict(data)
    cls = EVENT_TYPES[data.pop("type")]
    return cls(**data)


__all__ = [
    "CONSEQUENCE_KINDS",
    "EVENT_TYPES",
    "FAILURE_RANK",
    "ClientText",
    "ClientTextKind",
    "EpWeightFilter",
    "Event",
    "Failure",
    "FailureKind",
    "KvScaleWarning",
    "LogError",
    "LogWarning",
    "Milestone",
    "MilestoneKind",
    "NodeLaunch",
    "NodeLaunchMode",
    "ParallelInit",
    "Record",
    "ScaleFactorWarning",
    "Severity",
    "ShardProgress",
    "StallHint",
    "event_from_dict",
]
