"""The catalog: every message loadwatch knows, as data.

An entry is (id, needles, pattern, builder, severity). `needles` are plain substrings one of which
every matching message contains; the union of all needles is the pre-filter that keeps the common,
uninteresting record almost free. Patterns are searched in the message body (prefix and header
removed) and are written to stay linear on hostile input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import repeat
from typing import Any

from loadwatch.parsers.events import (
    EpWeightFilter,
    Event,
    Failure,
    FailureKind,
    KvScaleWarning,
    Milestone,
    NodeLaunch,
    ParallelInit,
    ScaleFactorWarning,
    Severity,
    ShardProgress,
    StallHint,
)
from loadwatch.parsers.vllm.lines import Head

Builder = Callable[["re.Match[str]", Head, dict[str, Any]], Event | None]


Level = str | None  # "DEBUG" .. "CRITICAL", or None for a record without a logging header
MESSAGE: frozenset[Level] = frozenset({"INFO", "DEBUG"})
# Failures fire only on ERROR/CRITICAL records or records without a header (tracebacks, stderr),
# so a user prompt echoed at INFO that says "CUDA out of memory" is not a failure.
FAILURE: frozenset[Level] = frozenset({"ERROR", "CRITICAL", None})
WARNING: frozenset[Level] = frozenset({"WARNING", "INFO", "DEBUG", None})
BARE: frozenset[Level] = frozenset({None})


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    needles: tuple[str, ...]
    pattern: re.Pattern[str]
    build: Builder
    severity: Severity
    levels: frozenset[Level] = MESSAGE  # the record levels this message is printed at
    serving: bool = False  # still looked for once the server is up (restart markers, stalls)
    more: bool = False  # the same record may hold a second message: keep looking after a match


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    value = _num(text)
    return None if value is None else int(value)


def hms_seconds(text: str | None) -> float | None:
    """tqdm's `MM:SS` / `H:MM:SS` (or `?`) to seconds."""
    if not text or "?" in text:
        return None
    total = 0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return float(total)


def _rate(text: str | None) -> float | None:
    if not text or "?" in text:
        return None
    if text.endswith("s/it"):
        per = _num(text[:-4])
        return None if not per else 1.0 / per
    if text.endswith("it/s"):
        return _num(text[:-4])
    return None


def bar_kind(desc: str) -> str:
    d = desc.lower()
    if "graph" in d:
        return "graph_capture"
    if "prefetch" in d:
        return "prefetch"
    if "shard" in d or "loading safetensors" in d or "checkpoint" in d or "loader" in d:
        return "weights"
    return "other"


def bar_unit(desc: str, kind: str) -> str:
    """What a bar without a byte form counts, by its desc (vllm-log-formats.md section 9)."""
    d = desc.lower()
    if "instanttensor" in d or "runai" in d or "run:ai" in d or "model streamer" in d:
        return "tensors"
    return "files" if kind in ("weights", "prefetch") else "items"


# tqdm's unit-scaled numbers (`unit_scale=True`, divisor 1000): `0.00`, `13.3G`, `155G`, `1.20T`
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def scaled(text: str | None) -> float | None:
    if not text:
        return None
    suffix = text[-1] if text[-1] in _SCALE else ""
    value = _num(text[: len(text) - len(suffix)])
    return None if value is None else value * _SCALE[suffix]


_PROGRESS_FIELDS = (
    "desc",
    "bar",
    "done",
    "total",
    "elapsed_s",
    "remaining_s",
    "rate_per_s",
    "unit",
    "offset",
    "ts",
    "process",
    "pid",
)
assert set(_PROGRESS_FIELDS) == {f.name for f in fields(ShardProgress)}, "ShardProgress changed"


def _progress(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    # A load prints a bar line per shard: built as `__init__` would, with every field set from
    # C (`map`) instead of one Python-level call per field.
    desc = m["desc"].strip()
    kind = bar_kind(desc)
    values = (
        desc,
        kind,
        int(m["n"]),
        int(m["total"]),
        hms_seconds(m["el"]),
        hms_seconds(m["rem"]),
        _rate(m["rate"]),
        bar_unit(desc, kind),
        ctx["offset"],
        ctx["ts"],
        ctx["process"],
        ctx["pid"],
    )
    event = object.__new__(ShardProgress)
    any(map(object.__setattr__, repeat(event), _PROGRESS_FIELDS, values))
    return event


def _byte_progress(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event | None:
    """A bar in bytes (`13.3G/155G [00:01<00:10, 14.3GB/s]`): done and total as bytes."""
    desc = m["desc"].strip()
    done, total = scaled(m["n"]), scaled(m["total"])
    if done is None or total is None:
        return None
    rate = None if m["rate"].startswith("?") else scaled(m["rate"][:-3])
    return ShardProgress(
        desc=desc,
        bar=bar_kind(desc),  # type: ignore[arg-type]
        done=int(done),
        total=int(total),
        elapsed_s=hms_seconds(m["el"]),
        remaining_s=hms_seconds(m["rem"]),
        rate_per_s=rate,
        unit="bytes",
        **ctx,
    )


def _prefetch(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return ShardProgress(
        desc="Prefetching checkpoint files",
        bar="prefetch",
        done=int(m["n"]),
        total=int(m["total"]),
        unit="files",
        **ctx,
    )


def _ep_filter(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return EpWeightFilter(
        ep_size=int(m["size"]),
        ep_rank=int(m["rank"]),
        experts_loaded=int(m["n"]),
        experts_total=int(m["total"]),
        **ctx,
    )


_SCALE_NAMES = {"k": "k", "v": "v", "q": "q", "kv": "kv", "prob": "prob"}
_LAYER = re.compile(r"layers?\.(\d{1,6}+)\.")


def _kv_scale(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    raw = m["name"].lstrip(".").replace("-", "_").replace(" ", "_").lower()
    if raw.endswith("zero_point"):
        scale = "zero_point"
    else:
        scale = _SCALE_NAMES.get(raw.removesuffix("_scale").rsplit(".", 1)[-1], "other")
    ckpt = m["ckpt"]
    layer = _LAYER.search(ckpt or "") or _LAYER.search(m["model"] or "")
    return KvScaleWarning(
        scale=scale,  # type: ignore[arg-type]
        layer=int(layer.group(1)) if layer else None,
        checkpoint_name=ckpt,
        model_name=m["model"],
        deprecated=bool(m["dep"]),
        **ctx,
    )


def _deprecated_kv(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return KvScaleWarning(scale="kv", deprecated=True, **ctx)


def _scale_factor(code: str) -> Builder:
    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        return ScaleFactorWarning(code=code, message=head.body.strip()[:500], **ctx)  # type: ignore[arg-type]

    return build


def _milestone(kind: str, detail: str | None = None, **groups: str) -> Builder:
    """Build a Milestone; `groups` maps Milestone fields to regex group names."""

    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        values: dict[str, Any] = {}
        for fld, grp in groups.items():
            text = m[grp]
            if fld in ("seconds", "gib"):
                values[fld] = _num(text)
            elif fld in ("tokens", "blocks", "count"):
                values[fld] = _int(text)
            else:
                values[fld] = text
        return Milestone(kind=kind, detail=detail, **values, **ctx)  # type: ignore[arg-type]

    return build


def _backend(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    # "Triton MLA" and "TRITON_MLA" name the same backend
    name = m["b"].strip().upper().replace(" ", "_")
    return Milestone(kind="attention_backend", value=name, **ctx)


_KV_ARG = re.compile(r"""['"]?kv_cache_dtype['"]?(?::\s?|=)['"](?P<v>[A-Za-z0-9_]{1,40}+)['"]""")


def _launch_args(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    """vLLM logs its arguments at start: the KV-cache dtype is the one watch mode needs.
    `non-default args` leaves out what was not given, which means `auto`."""
    kv = _KV_ARG.search(head.body, 0, 20000)
    value = kv["v"] if kv else ("auto" if head.body.lstrip().startswith("non-default") else None)
    return Milestone(kind="launch_args", detail="kv_cache_dtype", value=value, **ctx)


_ENGINE_KV = re.compile(r"[ ,]kv_cache_dtype=(?P<v>[A-Za-z0-9_]{1,40}+)")


def _engine_config(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    """`Initializing a V1 LLM engine (v0.32.0) with config: model='/models/X', ...,
    kv_cache_dtype=auto, ...`: the engine's own config. `detail` is its `kv_cache_dtype` (None
    when the line leaves it out), `value` the model path."""
    kv = _ENGINE_KV.search(head.body, m.end(), 60000)
    return Milestone(
        kind="engine_config", detail=kv["v"] if kv else None, value=m["model"] or None, **ctx
    )


def _shutdown(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return Milestone(kind="shutdown", value=(m["what"] or m["uv"]).strip(), **ctx)


def _parallel_init(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return ParallelInit(
        world_size=int(m["ws"]),
        rank=int(m["rank"]),
        local_rank=int(m["local"]),
        init_method=m["method"],
        backend=m["backend"],
        **ctx,
    )


def _headless(mode: str) -> Builder:
    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        engines = _int(m["n"]) if "n" in m.re.groupindex else None
        return NodeLaunch(mode=mode, head_address=m["addr"], engines=engines, **ctx)  # type: ignore[arg-type]

    return build


def _stall(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return StallHint(seconds=_num(m["sec"]), **ctx)


def _failure(kind: FailureKind | None) -> Builder:
    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        message = head.body.strip()
        exc = EXCEPTION_LINE.match(message)
        exc_type = exc["exc"] if exc else None
        text = exc["msg"] if exc and exc["msg"] is not None else message
        return Failure(
            kind=kind or classify(exc_type, text),
            message=text[:2000],
            exc_type=exc_type,
            first_line=message[:500],
            last_offset=ctx["offset"],
            **ctx,
        )

    return build


def _c(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_SEC = r"(?P<sec>\d{1,9}+(?:\.\d{1,9}+)?)"
_GIB = r"(?P<gib>\d{1,9}+(?:\.\d{1,9}+)?)"

CATALOG: tuple[Entry, ...] = (
    # -- progress bars ---------------------------------------------------------------------
    Entry(
        "progress.tqdm",
        ("it/s]", "s/it]"),
        _c(
            # The description starts where a run of its characters starts: a search then tries
            # the run once, not again from each of its characters (linear on a long run).
            r"(?<![^\r\n:|])(?P<desc>[^\r\n:|]{1,200}+):\s{0,8}+(?P<pct>\d{1,3}+)%"
            r"(?: Completed \| ?|\|[^|\r\n]{0,400}+\| ?| )"  # tqdm's compact form has no bar
            r"(?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?it/s|\d{1,9}+(?:\.\d{1,9}+)?(?:it/s|s/it))\]"
        ),
        _progress,
        "info",
        levels=BARE,
    ),
    Entry(
        "progress.tqdm_bytes",
        ("B/s]",),
        _c(
            # tqdm with unit="B", unit_scale=True: InstantTensor's bar since vLLM PR #46868
            r"(?<![^\r\n:|])(?P<desc>[^\r\n:|]{1,200}+):\s{0,8}+(?P<pct>\d{1,3}+)%"
            r"(?: Completed \| ?|\|[^|\r\n]{0,400}+\| ?| )"
            r"(?P<n>\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?)/(?P<total>\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?B/s|\d{1,15}+(?:\.\d{1,9}+)?[kKMGTP]?B/s)\]"
        ),
        _byte_progress,
        "info",
        levels=BARE,
    ),
    Entry(
        "progress.prefetch",
        ("Prefetching checkpoint",),
        _c(
            r"Prefetching checkpoint files: (?P<pct>\d{1,3}+)% \((?P<n>\d{1,9}+)/(?P<total>\d{1,9}+)\)"
        ),
        _prefetch,
        "info",
    ),
    # -- KV-cache scale warnings -----------------------------------------------------------
    Entry(
        "warn.kv_scale_missing",
        ("in the checkpoint (e.g.",),
        _c(
            r"(?P<dep>DEPRECATED\. )?Found (?P<name>[.A-Za-z_ -]{1,40}?) in the checkpoint "
            r"\(e\.g\. (?P<ckpt>[^()\s]{0,400}+)\), but not found the expected name in the model "
            r"\(e\.g\. (?P<model>[^()\s]{0,400}+)\)"
        ),
        _kv_scale,
        "warning",
        levels=WARNING,
    ),
    Entry(
        "warn.kv_scale_deprecated",
        ("DEPRECATED. Found kv_scale",),
        _c(r"DEPRECATED\. Found kv_scale in the checkpoint\. "),
        _deprecated_kv,
        "warning",
        levels=WARNING,
    ),
    Entry(
        "warn.kv_scale_default",
        ("KV cache scaling factor",),
        _c(r"Using KV cache scaling factor 1\.0 for fp8"),
        _scale_factor("kv_scale_default"),
        "warning",
        levels=WARNING,
    ),
    Entry(
        "warn.q_scale_from_k",
        ("q scaling factor",),
        _c(r"Checkpoint does not provide a q scaling factor"),
        _scale_factor("q_scale_from_k"),
        "warning",
        levels=WARNING,
    ),
    Entry(
        "warn.q_prob_scale_default",
        ("Q scale", "uncalibrated q_scale"),
        _c(r"Using (?:Q scale \S{1,20}+ and prob scale|uncalibrated q_scale)"),
        _scale_factor("q_prob_scale_default"),
        "warning",
        levels=WARNING,
    ),
    # -- milestones, in load order ---------------------------------------------------------
    Entry(
        "ms.version",
        ("server version",),
        _c(
            r"vLLM (?:API )?server version (?P<v>[^\s,]{1,80}+)(?:, serving model (?P<model>\S{1,400}+))?"
        ),
        _milestone("version", value="v"),
        "info",
        serving=True,
    ),
    Entry(
        "ms.version_logo",
        ("  version ",),
        _c(r"^[\s\u2580-\u259f]{3,80}+version\s{1,8}+(?P<v>\S{1,80}+)\s*+$"),
        _milestone("version", value="v"),
        "info",
        serving=True,
    ),
    Entry(
        "ms.launch_args",
        ("non-default args: {", "args: Namespace("),
        _c(r"^(?:non-default args: \{|args: Namespace\()"),
        _launch_args,
        "info",
    ),
    Entry(
        "ms.engine_config",
        ("LLM engine (v",),
        _c(
            r"^Initializing an? (?:V\d{1,2}+ )?LLM engine \(v?[^)\s]{1,80}+\) with config: "
            r"(?:model='(?P<model>[^']{1,4000}+)')?"
        ),
        _engine_config,
        "info",
    ),
    Entry(
        "ms.model_load_start",
        ("Starting to load model",),
        _c(r"Starting to load model (?P<model>\S{1,400}?)(?:\.\.\.)?\s*+$"),
        _milestone("model_load_start", value="model"),
        "info",
        serving=True,
    ),
    Entry(
        "ms.checkpoint_info",
        ("Filesystem type for checkpoints", "Checkpoint size:"),
        _c(
            r"(?:Filesystem type for checkpoints: (?P<fs>[^.\s]{1,40}+)\.\s{0,4}+)?"
            r"Checkpoint size: " + _GIB + r" GiB"
        ),
        _milestone("checkpoint_info", value="fs", gib="gib"),
        "info",
    ),
    # -- where this node stands in a multi-node deployment ----------------------------------
    Entry(
        "ms.ep_weight_filter",
        ("EP weight filter:",),
        _c(
            r"EP weight filter: ep_size=(?P<size>\d{1,7}+), ep_rank=(?P<rank>\d{1,7}+), "
            r"loading (?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) experts"
        ),
        _ep_filter,
        "info",
    ),
    Entry(
        "node.parallel_init",
        ("distributed_init_method=",),
        _c(
            r"world_size=(?P<ws>\d{1,7}+) rank=(?P<rank>\d{1,7}+) local_rank=(?P<local>\d{1,7}+) "
            r"distributed_init_method=(?P<method>\S{1,400}+) backend=(?P<backend>\w{1,40}+)"
        ),
        _parallel_init,
        "info",
    ),
    Entry(
        "node.headless_tp_pp",
        ("headless multiproc executor",),
        _c(
            r"Launching vLLM (?:\(v?[^()\s]{1,60}+\) )?headless multiproc executor, with head "
            r"node address (?P<addr>[^\s,]{1,200}+) for torch"
        ),
        _headless("headless_tp_pp"),
        "info",
    ),
    Entry(
        "node.headless_dp",
        ("in headless mode, with head node",),
        _c(
            r"Launching (?P<n>\d{1,7}+) data parallel engine\(s\) in headless mode, with head "
            r"node address (?P<addr>[^\s,]{1,200}?)\.?(?:\s|$)"
        ),
        _headless("headless_dp"),
        "info",
    ),
    Entry(
        "ms.gguf_shards",
        ("GGUF shard files",),
        _c(r"Discovered (?P<n>\d{1,9}+) GGUF shard files"),
        _milestone("gguf_shards", count="n"),
        "info",
    ),
    Entry(
        "ms.attention_backend",
        ("backend",),
        _c(
            r"^Using (?:AttentionBackendEnum\.)?"
            r"(?P<b>[A-Za-z0-9_]{1,40}+(?: (?:Attention|MLA|SDPA))?) (?:attention )?backend"
            r"(?: on V1 engine)?(?:\.|,| out of potential backends|\s*+$)"
        ),
        _backend,
        "info",
    ),
    Entry(
        "ms.model_init",
        ("Initializing model took",),
        _c(r"^Initializing model took " + _SEC + r" s"),
        _milestone("model_init", seconds="sec"),
        "info",
    ),
    Entry(
        "ms.weights_loaded",
        ("Loading weights took",),
        _c(r"Loading weights took " + _SEC + r" s"),
        _milestone("weights_loaded", seconds="sec"),
        "info",
    ),
    Entry(
        "ms.runai_stream",
        ("Overall time to stream",),
        _c(r"Overall time to stream " + _GIB + r" ?GiB of all files(?: to cpu)?: " + _SEC + r" ?s"),
        _milestone("weights_loaded", detail="runai_stream", gib="gib", seconds="sec"),
        "info",
        levels=WARNING,  # the streamer prints it without a header; vLLM may log it
    ),
    Entry(
        "ms.model_memory",
        ("Model loading took", "Loading model weights took"),
        _c(
            r"(?:Model loading took|Loading model weights took) "
            + _GIB
            + r" ?(?:GiB|GB)(?: memory)?(?: and "
            + _SEC
            + r" s)?"
        ),
        _milestone("model_memory", gib="gib", seconds="sec"),
        "info",
    ),
    Entry(
        "ms.compile_cache_dir",
        ("for vLLM's torch.compile",),
        _c(r"Using cache directory: (?P<d>\S{1,400}+) for vLLM's torch\.compile"),
        _milestone("torch_compile", detail="cache_dir", value="d"),
        "info",
    ),
    Entry(
        "ms.compile_dynamo",
        ("Dynamo bytecode transform time",),
        _c(r"Dynamo bytecode transform time: " + _SEC + r" s"),
        _milestone("torch_compile", detail="dynamo", seconds="sec"),
        "info",
    ),
    Entry(
        "ms.compile_graph",
        ("Compiling a graph for",),
        _c(r"Compiling a graph for (?P<shape>.{1,200}?) takes " + _SEC + r" s"),
        _milestone("torch_compile", detail="compile_graph", seconds="sec", value="shape"),
        "info",
    ),
    Entry(
        "ms.compile_cache_load",
        ("from the cache, took",),
        _c(
            r"Directly load the compiled graph\(s\) for (?P<shape>.{1,200}?) from the cache, took "
            + _SEC
            + r" s"
        ),
        _milestone("torch_compile", detail="cache_load", seconds="sec", value="shape"),
        "info",
    ),
    Entry(
        "ms.compile_total",
        ("torch.compile take", "torch.compile took"),
        _c(r"torch\.compile (?:takes|took) " + _SEC + r" s in total"),
        _milestone("torch_compile", detail="total", seconds="sec"),
        "info",
    ),
    Entry(
        "ms.kv_available",
        ("KV cache memory:",),
        _c(r"Available KV cache memory: " + _GIB + r" ?GiB"),
        _milestone("kv_cache", detail="available_memory", gib="gib"),
        "info",
    ),
    Entry(
        "ms.kv_explicit",
        ("GiB for KV cache",),
        _c(r"Explicitly set \((?P<gib>\d{1,9}+(?:\.\d{1,9}+)?)/[\d.]{1,20}+\) GiB for KV cache"),
        _milestone("kv_cache", detail="available_memory", gib="gib"),
        "info",
    ),
    Entry(
        "ms.kv_dtype",
        ("data type to store kv cache",),
        _c(r"Using (?P<dtype>[A-Za-z0-9_]{1,40}+) data type to store kv cache"),
        _milestone("kv_cache", detail="dtype", value="dtype"),
        "info",
    ),
    Entry(
        "ms.kv_size",
        ("KV cache size:",),
        _c(r"(?P<dev>GPU|CPU|XPU|TPU)? ?KV cache size: (?P<tok>[\d,]{1,20}+) tokens"),
        _milestone("kv_cache", detail="size", tokens="tok", value="dev"),
        "info",
        more=True,  # the CPU backend prints the concurrency on the same line
    ),
    Entry(
        "ms.kv_blocks",
        ("blocks:",),
        _c(r"# (?:GPU|cuda|CUDA|gpu) blocks: (?P<b>\d{1,12}+)"),
        _milestone("kv_cache", detail="blocks", blocks="b"),
        "info",
    ),
    Entry(
        "ms.kv_concurrency",
        ("Maximum concurrency for",),
        _c(
            r"Maximum concurrency for (?P<tok>[\d,]{1,20}+) tokens per request: (?P<x>\d{1,9}+(?:\.\d{1,9}+)?)x"
        ),
        _milestone("kv_cache", detail="concurrency", tokens="tok", value="x"),
        "info",
    ),
    Entry(
        "ms.graph_capture",
        ("Graph capturing finished",),
        _c(r"Graph capturing finished in " + _SEC + r" secs?(?:, took " + _GIB + r" GiB)?"),
        _milestone("graph_capture", seconds="sec", gib="gib"),
        "info",
    ),
    Entry(
        "ms.engine_init",
        ("init engine",),
        _c(r"init engine \(profile, create kv cache, warmup model\) took " + _SEC + r" s"),
        _milestone("engine_init", seconds="sec"),
        "info",
    ),
    Entry(
        "ms.api_server",
        ("Starting vLLM",),
        _c(r"Starting vLLM (?:API )?server(?: \d{1,4}+)? on (?P<url>\S{1,400}+)"),
        _milestone("api_server_start", value="url"),
        "info",
    ),
    Entry(
        "ms.uvicorn_running",
        ("Uvicorn running on",),
        _c(r"Uvicorn running on (?P<url>\S{1,400}+)"),
        _milestone("api_server_start", detail="uvicorn", value="url"),
        "info",
        serving=True,  # uvicorn prints it after "Application startup complete"
    ),
    Entry(
        "ms.routes",
        ("Available routes are",),
        _c(r"^Available routes are:"),
        _milestone("api_server_start", detail="routes"),
        "info",
    ),
    Entry(
        "ms.uvicorn_started",
        ("Started server process",),
        _c(r"^Started server process \[(?P<pid>\d{1,10}+)\]"),
        _milestone("api_server_start", detail="server_process", value="pid"),
        "info",
    ),
    Entry(
        "ms.app_waiting",
        ("Waiting for application startup",),
        _c(r"^Waiting for application startup\."),
        _milestone("api_server_start", detail="waiting_startup"),
        "info",
    ),
    Entry(
        "ms.app_complete",
        ("Application startup complete",),
        _c(r"^Application startup complete\."),
        _milestone("app_startup_complete"),
        "info",
    ),
    Entry(
        "ms.shutdown",
        ("[shutdown]", "Shutting down", "application shutdown", "Application shutdown complete"),
        _c(
            r"^\[shutdown\] (?P<what>.{1,200}+)|^(?P<uv>Shutting down|Waiting for application shutdown"
            r"|Application shutdown complete)"
        ),
        _shutdown,
        "info",
        serving=True,  # a stop usually comes while serving
    ),
    # -- stall hints -----------------------------------------------------------------------
    Entry(
        "stall.shm_broadcast",
        ("No available",),
        _c(r"No available (?:shared memory broadcast )?block found in " + _SEC + r" seconds?"),
        _stall,
        "warning",
        levels=frozenset({"INFO", "DEBUG", "WARNING"}),
        serving=True,
    ),
    # -- failures --------------------------------------------------------------------------
    Entry(
        "fail.engine_core_start",
        ("failed to start",),
        _c(r"(?:EngineCore|WorkerProc|Engine process|Engine core) failed to start"),
        _failure("engine_init_failed"),
        "error",
        levels=FAILURE,
    ),
    Entry(
        "fail.engine_fatal",
        ("encountered a fatal error", "hit an exception", "died unexpectedly", "died, exit code"),
        _c(
            r"(?:EngineCore encountered a fatal error|WorkerProc hit an exception"
            r"|Worker proc \S{1,80}+ died unexpectedly|Worker \S{1,80}+ pid \d{1,10}+ died, exit code)"
        ),
        _failure("worker_died"),
        "error",
        levels=FAILURE,
    ),
    Entry(
        "fail.error_executing",
        ("This might cause deadlock",),
        _c(r"Error executing method '?(?P<m>\w{1,80}+)'?\. This might cause deadlock"),
        _failure("other"),
        "error",
        levels=FAILURE,
    ),
    Entry(
        "fail.classified",
        (
            "out of memory",
            "not enough GPU memory",
            "No available memory for the cache blocks",
            "KV cache is needed",
            "stored in KV cache",
            "max_model_len",
            "NCCL error",
            "FP8 Triton MLA",
            "with FP8 KV cache not yet supported",
            "No valid attention backend",
            "Engine core initialization failed",
            "Timed out waiting for engine",
            "Did not receive response from front-end",
        ),
        _c(
            r"CUDA out of memory|out of memory|not enough GPU memory|No available memory for the cache"
            r"|KV cache is needed|stored in KV cache|max_model_len|NCCL error|FP8 Triton MLA"
            r"|FP8 KV cache not yet supported|No valid attention backend"
            r"|Engine core initialization failed|Timed out waiting for engines?"
            r"|Did not receive response from front-end"
        ),
        _failure(None),
        "error",
        levels=FAILURE,
    ),
)


# A bare exception line outside any traceback whose head was seen (a log cut, a paste): the
# worker's root cause can stand alone like this (`RuntimeError: CUDA error: invalid argument`).
CATALOG = (
    *CATALOG,
    Entry(
        "fail.bare_exception",
        ("Error: ",),
        _c(r"^(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Z][A-Za-z0-9_]{0,80}Error: \S"),
        _failure(None),
        "error",
        levels=BARE,
    ),
    # vLLM's own CUDA checks (csrc, custom all-reduce) print `Failed: Cuda error FILE:LINE 'msg'`
    # on stderr and the worker dies: the root cause the dead worker's echoes point at.
    Entry(
        "fail.cuda_check",
        ("Failed: Cuda error",),
        _c(r"^Failed: Cuda error \S{1,400}+ '[^'\r\n]{1,400}+'"),
        _failure(None),
        "error",
        levels=BARE,
    ),
)

# `torch.OutOfMemoryError: CUDA out of memory...`, `RuntimeError: ...`, `KeyboardInterrupt`.
# The last name gives back characters for its ending (Error, ...): not possessive there, which
# costs at most 80 steps back, once, since the pattern is anchored.
EXCEPTION_LINE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Za-z_][A-Za-z0-9_]{0,80}"
    r"(?:Error|Exception|Exit|Interrupt|Warning|Fault|Failure|Dead))(?:: ?(?P<msg>.*+))?$"
)
# In a traceback anything shaped `dotted.Name: message` ends it, whatever the class is called.
EXCEPTION_LINE_LOOSE = re.compile(
    r"^(?P<exc>(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Z][A-Za-z0-9_]{0,80}+)(?:: (?P<msg>.*+))?$"
)

# Ordered: the first that matches names the kind. More specific kinds come first.
_CLASSIFY: tuple[tuple[re.Pattern[str], FailureKind], ...] = (
    (
        _c(
            r"FP8 Triton MLA|TritonMLA(?: V1)? with FP8 KV cache not yet supported"
            r"|expected scalar type \w{1,40}+ but found Float8_e\dm\d"
            r"|No valid attention backend.{0,4000}?kv_cache_dtype not supported"
        ),
        "fp8_kv_unsupported",
    ),
    (_c(r"OutOfMemoryError|CUDA out of memory|out of memory|not enough GPU memory"), "cuda_oom"),
    (
        _c(
            r"No available memory for the cache blocks|KV cache is needed, which is larger than"
            r"|larger than the maximum number of tokens that can be stored in KV cache"
        ),
        "kv_cache_too_small",
    ),
    (_c(r"max_model_len|max model len|max_position_embeddings"), "max_model_len"),
    (_c(r"NCCL error|NCCL|DistBackendError"), "nccl"),
    # the engine did not come up in time (VLLM_ENGINE_READY_TIMEOUT_S), a DP handshake stalled
    (
        _c(
            r"Timed out waiting for engines?(?: core processes)? to (?:start|send)"
            r"|Did not receive response from front-end process"
        ),
        "startup_timeout",
    ),
    (
        _c(r"Engine core initialization failed|initialization failed|failed to start"),
        "engine_init_failed",
    ),
    (_c(r"EngineDeadError|died unexpectedly|died, exit code|fatal error"), "worker_died"),
)

CUT_TRACEBACK = "traceback without an exception line"  # a traceback cut before its end
# Messages that say something failed elsewhere, not what: echoes of a root cause (the state's
# failure grouping folds them into it).
CONSEQUENCE_MESSAGES: tuple[str, ...] = (
    CUT_TRACEBACK,
    "Error executing method",
    "got fatal signal from worker processes",
    "Got fatal signal from worker processes",
)

# When several failures describe one crash, the most telling one names it.
KIND_RANK: dict[str, int] = {
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
}


def classify(exc_type: str | None, message: str) -> FailureKind:
    text = message if exc_type is None else f"{exc_type}: {message}"
    text = text[:8000]
    for pattern, kind in _CLASSIFY:
        if pattern.search(text):
            return kind
    return "other"


NEEDLES: tuple[str, ...] = tuple(sorted({n for e in CATALOG for n in e.needles}))
