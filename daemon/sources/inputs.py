"""Value types the sources hand to the state fold (besides parser events).

Units are in the names; "not available" is ``None``, never 0. Times are epoch seconds from the
injected clock of whoever made the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of whole records from the followed file, as the follower read them.

    ``data`` ends with a record terminator (``\\n`` or ``\\r``). A record longer than the cap is
    delivered cut to the cap with a ``\\n`` appended; ``cut`` says so (then ``data`` is not the
    file's bytes and ``offset + len(data)`` is not the next offset: use ``next_offset``).
    """

    data: bytes
    offset: int
    file_id: str
    next_offset: int
    cut: bool = False


JOIN_BYTES = 256 * 1024  # a backlog read as pieces of this size (see `joined`)


def joined(chunks: list[Chunk], limit: int = JOIN_BYTES) -> list[Chunk]:
    """Back-to-back chunks of one file's own bytes as chunks of up to `limit` bytes. The
    follower reads a record's cap at a time without the C scanner (and around a record of the
    cap or more); handing a backlog over in larger pieces costs a copy and saves the per-piece
    work of everything after it (on the load-phase log of bench/throughput_vs_mtail.py, 64 KiB
    to 256 KiB: the scan and fold about 20% faster; 1 MiB gains nothing more)."""
    out: list[Chunk] = []
    run: list[Chunk] = []
    size = 0

    def close() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            first, last = run[0], run[-1]
            data = b"".join(c.data for c in run)
            out.append(Chunk(data, first.offset, first.file_id, last.next_offset))

    for c in chunks:
        whole = not c.cut and c.offset + len(c.data) == c.next_offset
        follows = (
            run
            and whole
            and c.file_id == run[-1].file_id
            and c.offset == run[-1].next_offset
            and size + len(c.data) <= limit
        )
        if not follows:
            close()
            run, size = [], 0
        if whole:
            run.append(c)
            size += len(c.data)
        else:
            out.append(c)
    close()
    return out


# -- GPUs -------------------------------------------------------------------------------------

GpuHealth = Literal["ok", "lost", "error", "stale", "unknown"]


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    health: GpuHealth = "unknown"
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_ratio: float | None = None  # 0..1, GPU busy
    memory_utilization_ratio: float | None = None  # 0..1, memory controller busy
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    pstate: int | None = None
    clock_event_reasons: int | None = None  # NVML bitmask (throttle reasons)
    ecc_uncorrected_total: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    sampled_at: float | None = None
    error: str | None = None  # one line, when health is not "ok"

    @property
    def up(self) -> bool:
        return self.health == "ok"


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu_index: int
    xid: int
    ts: float
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One poll of every GPU, plus what happened since the last one."""

    ts: float
    samples: tuple[GpuSample, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    source_up: bool = True
    error: str | None = None  # one line when the source as a whole is down
    poll_seconds: float | None = None
    stale: bool = False  # the poll overran its deadline: samples are the last good ones, flagged

    def uuid_of(self, x: XidEvent) -> str | None:
        """The UUID of the GPU an Xid came from: its sample's in this reading, else the
        event's own."""
        return next((s.uuid for s in self.samples if s.index == x.gpu_index), x.uuid)


class GpuSource(Protocol):
    def poll(self) -> GpuReading: ...


# -- the vLLM process -------------------------------------------------------------------------

# "stopping": a stop or restart was asked for; "ending_leftovers": vLLM's main process exited by
# itself and the supervisor ends what is left of its tree (no stop was asked for: the exit, and
# whatever the log said before it, decide how the session ended)
ProcessEventKind = Literal["started", "exited", "stopping", "ending_leftovers", "backoff", "fatal"]


@dataclass(frozen=True, slots=True)
class ProcessEvent:
    kind: ProcessEventKind
    ts: float
    pid: int | None = None
    argv: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None  # one line: why it exited, why fatal, why backing off
    backoff_s: float | None = None
    tree_pids: tuple[int, ...] = ()  # "exited": every pid seen in the run's process tree
    # "exited": the supervisor's verdict; an exit with code 0 after a fatal error in the log, or
    # a restart it asked for, failed
    failed: bool = False

    @property
    def outcome(self) -> str:
        """How an exit ended: `signal`, `failed` or `clean` (/metrics' exit outcomes)."""
        return "signal" if self.signal is not None else ("failed" if self.failed else "clean")


@dataclass(frozen=True, slots=True)
class OrphanCheck:
    """After a vLLM process tree exited and the driver had time to let go of it: how many of
    its processes still hold GPU memory."""

    ts: float
    leaked: int


@dataclass(frozen=True, slots=True)
class IoSample:
    """Bytes read so far by the vLLM process tree (``/proc/<pid>/io`` read_bytes, summed)."""

    ts: float
    read_bytes: int | None
    pids: int = 0
    rchar: int | None = None  # bytes passed by read() calls, page-cache hits included


class IoReader(Protocol):
    """What the loop samples the vLLM processes' reads through (ProcIoReader reads /proc;
    tests hand a simulated one)."""

    def read_many(self, roots: Sequence[int]) -> IoSample: ...


# -- the checkpoint ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardInfo:
    name: str
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ModelGeometry:
    """The shapes config.json gives that decide memory: attention, KV heads, layers, vocabulary.

    "Not in config.json" is None. ``index_families`` names the weight groups the safetensors
    index lists whose placement differs from the rest (embeddings, lm_head, MLA's latent
    projections, the MoE router and experts)."""

    num_layers: int | None = None
    layer_types: tuple[str, ...] = ()  # "full_attention", "sliding_attention", "linear_attention"
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    kv_lora_rank: int | None = None  # MLA
    qk_rope_head_dim: int | None = None  # MLA
    q_lora_rank: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    torch_dtype: str | None = None
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    n_routed_experts: int | None = None
    moe_intermediate_size: int | None = None
    first_k_dense_replace: int | None = None
    tie_word_embeddings: bool = False
    index_families: tuple[str, ...] = ()
    family_bytes: tuple[tuple[str, int], ...] = ()  # from the safetensors headers; () unknown


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the model directory says, read once (and again if it changes)."""

    path: str
    shards: tuple[ShardInfo, ...] = ()  # in the order vLLM loads them
    total_bytes: int | None = None
    architecture: str | None = None
    model_type: str | None = None
    is_mla: bool | None = None
    num_layers: int | None = None
    quant_algo: str | None = None  # e.g. "NVFP4"
    checkpoint_kv_dtype: str | None = None  # "fp8" when the checkpoint declares an FP8 KV cache
    kv_sources: tuple[str, ...] = ()  # where the KV declaration was found ("hf_quant_config.json")
    geometry: ModelGeometry | None = None  # None when config.json could not be read
    errors: tuple[str, ...] = field(default_factory=tuple)  # one line each: what could not be read


# -- the fold's own inputs ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HealthProbe:
    """One answer (or none) from vLLM's `GET /health`, as the supervisor saw it."""

    ok: bool
    ts: float
    status: int | None = None  # HTTP status; None when the connection failed
    error: str | None = None  # one line, when not ok


@dataclass(frozen=True, slots=True)
class LoggedProcessSeen:
    """Watch mode: the vLLM process the log names, checked in /proc on this host."""

    ts: float
    pid: int
    alive: bool  # False: it was running here and is gone (exited, killed, its pid reused)
    argv: tuple[str, ...] = ()  # its /proc/PID/cmdline, when alive
    # False (with alive False): never seen running by this daemon (the log read back after a
    # restart), no process has its pid here, and nothing answers at its loopback /health
    was_seen: bool = True


@dataclass(frozen=True, slots=True)
class CompletionProbe:
    """The servable check: one tiny completion once `/health` answered."""

    ok: bool
    ts: float
    latency_s: float | None = None  # the request's round trip (one token: the first)
    model: str | None = None  # the served model name it asked
    error: str | None = None  # one line, when not ok


@dataclass(frozen=True, slots=True)
class PageCache:
    """How much of the model directory `model` was in the page cache when a start began
    (daemon/sources/model/page_cache.py): "warm" or "cold"."""

    ts: float
    session: int  # the start's (the session's id)
    model: str
    state: str
    resident: float  # the fraction of the sampled pages cached


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed with no other input: lets the state notice silence (stalls)."""
