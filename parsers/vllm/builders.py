"""How the vLLM catalog's entries turn a match into an event: the builders they name (the entry
type, the record levels and the number helpers are any grammar's: parsers/entries.py)."""

from __future__ import annotations

import re
from dataclasses import fields
from functools import lru_cache
from typing import Any

from loadwatch.parsers.entries import (
    Builder,
    Head,
    hms_seconds,
    integer,
    number,
    scaled,
    tqdm_rate,
)
from loadwatch.parsers.events import (
    EpWeightFilter,
    Event,
    KvScaleWarning,
    Milestone,
    NodeLaunch,
    ParallelInit,
    ScaleFactorWarning,
    ShardProgress,
    StallHint,
    filler,
)


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
_make_progress = filler(ShardProgress, _PROGRESS_FIELDS)


@lru_cache(maxsize=1024)
def _desc(raw: str) -> tuple[str, str, str]:
    """A bar's desc, kind and unit from its desc as matched: worked out once per desc (a load
    draws one bar per worker a hundred times and more)."""
    desc = raw.strip()
    kind = bar_kind(desc)
    return desc, kind, bar_unit(desc, kind)


def progress(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    # A load prints a bar line per shard: built as `__init__` would, by `filler`.
    raw, n, total, el, rem, rate = m.group("desc", "n", "total", "el", "rem", "rate")
    desc, kind, unit = _desc(raw)
    values = (
        desc,
        kind,
        int(n),
        int(total),
        hms_seconds(el),
        hms_seconds(rem),
        tqdm_rate(rate),
        unit,
        ctx["offset"],
        ctx["ts"],
        ctx["process"],
        ctx["pid"],
    )
    return _make_progress(values)


def unit_progress(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    """A bar counting a unit of its own (`21/21 [00:00<00:00, 33.51profile/s]`): kernel
    autotuning, its rate read in that unit (`1.52s/profile` is 1/1.52 a second)."""
    desc = m["desc"].strip()
    kind = bar_kind(desc)
    if kind == "other":
        kind = "autotune"
    rate_text = m["rate"]
    per, _, unit = rate_text.partition("/")
    if rate_text.startswith("?"):
        rate = None
    elif unit == "s":  # `33.51profile/s`
        rate = number(per.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    else:  # `1.52s/profile`
        secs = number(per[:-1])
        rate = 1.0 / secs if secs else None
    return ShardProgress(
        desc=desc,
        bar=kind,  # type: ignore[arg-type]
        done=int(m["n"]),
        total=int(m["total"]),
        elapsed_s=hms_seconds(m["el"]),
        remaining_s=hms_seconds(m["rem"]),
        rate_per_s=rate,
        unit=bar_unit(desc, kind),  # type: ignore[arg-type]
        **ctx,
    )


def byte_progress(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event | None:
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


def prefetch(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return ShardProgress(
        desc="Prefetching checkpoint files",
        bar="prefetch",
        done=int(m["n"]),
        total=int(m["total"]),
        unit="files",
        **ctx,
    )


def ep_filter(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return EpWeightFilter(
        ep_size=int(m["size"]),
        ep_rank=int(m["rank"]),
        experts_loaded=int(m["n"]),
        experts_total=int(m["total"]),
        **ctx,
    )


_SCALE_NAMES = {"k": "k", "v": "v", "q": "q", "kv": "kv", "prob": "prob"}
LAYER = re.compile(r"layers?\.(\d{1,6}+)\.")


def kv_scale(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    raw = m["name"].lstrip(".").replace("-", "_").replace(" ", "_").lower()
    if raw.endswith("zero_point"):
        scale = "zero_point"
    else:
        scale = _SCALE_NAMES.get(raw.removesuffix("_scale").rsplit(".", 1)[-1], "other")
    ckpt = m["ckpt"]
    layer = LAYER.search(ckpt or "") or LAYER.search(m["model"] or "")
    return KvScaleWarning(
        scale=scale,  # type: ignore[arg-type]
        layer=int(layer.group(1)) if layer else None,
        checkpoint_name=ckpt,
        model_name=m["model"],
        deprecated=bool(m["dep"]),
        **ctx,
    )


def deprecated_kv(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return KvScaleWarning(scale="kv", deprecated=True, **ctx)


def scale_factor(code: str) -> Builder:
    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        return ScaleFactorWarning(code=code, message=head.body.strip()[:500], **ctx)  # type: ignore[arg-type]

    return build


# A milestone's fields, in `filler`'s order: its kind and detail, the values its groups give
# (None where none does), then the record's context (a start prints dozens: built by `filler`).
_MILESTONE_VALUES = ("seconds", "gib", "tokens", "blocks", "count", "value", "args")
_MILESTONE_FIELDS = ("kind", "detail", *_MILESTONE_VALUES, "offset", "ts", "process", "pid")
assert set(_MILESTONE_FIELDS) == {f.name for f in fields(Milestone)}, "Milestone changed"
_make_milestone = filler(Milestone, _MILESTONE_FIELDS)


def milestone(kind: str, detail: str | None = None, **groups: str) -> Builder:
    """Build a Milestone; `groups` maps Milestone fields to regex group names."""
    unknown = set(groups) - set(_MILESTONE_VALUES)
    if unknown:
        raise ValueError(f"milestone {kind}: no field {sorted(unknown)}")

    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        values: dict[str, Any] = {}
        for fld, grp in groups.items():
            text = m[grp]
            if fld in ("seconds", "gib"):
                values[fld] = number(text)
            elif fld in ("tokens", "blocks", "count"):
                values[fld] = integer(text)
            else:
                values[fld] = text
        return _make_milestone(
            (kind, detail, *[values.get(name) for name in _MILESTONE_VALUES]),
            ctx["offset"],
            ctx["ts"],
            ctx["process"],
            ctx["pid"],
        )

    return build


def backend(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    # "Triton MLA" and "TRITON_MLA" name the same backend
    name = m["b"].strip().upper().replace(" ", "_")
    return Milestone(kind="attention_backend", value=name, **ctx)


KV_ARG = re.compile(r"""['"]?kv_cache_dtype['"]?(?::\s?|=)['"](?P<v>[A-Za-z0-9_]{1,40}+)['"]""")


# The arguments that size memory (the memory plan's), as `non-default args: {'k': v, ...}` or
# `args: Namespace(k=v, ...)` print them: numbers, or True for a flag
_SIZING_ARGS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "max_model_len",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "block_size",
)
_SIZING_ARG = re.compile(
    r"""[{(,]\s?['"]?(?P<k>"""
    + "|".join(_SIZING_ARGS)
    + r""")['"]?(?::\s?|=)(?P<v>True|[0-9]{1,20}+(?:\.[0-9]{1,10}+)?+(?:[KMGT]i?B?)?)(?=[,)}])"""
)


def launch_args(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    """vLLM logs its arguments at start: the KV-cache dtype is the one watch mode needs.
    `non-default args` leaves out what was not given, which means `auto`. `args`: those that
    size memory, as a command line would give them (a flag that is True: its name alone)."""
    body = head.body[:20000]
    kv = KV_ARG.search(body)
    value = kv["v"] if kv else ("auto" if body.lstrip().startswith("non-default") else None)
    given: dict[str, str] = {}
    for a in _SIZING_ARG.finditer(body):
        given.setdefault(a["k"], a["v"])
    args: list[str] = []
    for key in _SIZING_ARGS:  # (one order, whatever the line's)
        v = given.get(key)
        if v is None:
            continue
        args.append("--" + key.replace("_", "-"))
        if v != "True":
            args.append(v)
    return Milestone(
        kind="launch_args", detail="kv_cache_dtype", value=value, args=tuple(args) or None, **ctx
    )


_ENGINE_KV = re.compile(r"[ ,]kv_cache_dtype=(?P<v>[A-Za-z0-9_]{1,40}+)")


def engine_config(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    """`Initializing a V1 LLM engine (v0.32.0) with config: model='/models/X', ...,
    kv_cache_dtype=auto, ...`: the engine's own config. `detail` is its `kv_cache_dtype` (None
    when the line leaves it out), `value` the model path."""
    kv = _ENGINE_KV.search(head.body, m.end(), 60000)
    return Milestone(
        kind="engine_config", detail=kv["v"] if kv else None, value=m["model"] or None, **ctx
    )


def shutdown(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return Milestone(kind="shutdown", value=(m["what"] or m["uv"]).strip(), **ctx)


def parallel_init(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return ParallelInit(
        world_size=int(m["ws"]),
        rank=int(m["rank"]),
        local_rank=int(m["local"]),
        init_method=m["method"],
        backend=m["backend"],
        **ctx,
    )


def headless(mode: str) -> Builder:
    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        engines = integer(m["n"]) if "n" in m.re.groupindex else None
        return NodeLaunch(mode=mode, head_address=m["addr"], engines=engines, **ctx)  # type: ignore[arg-type]

    return build


def stall(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
    return StallHint(seconds=number(m["sec"]), **ctx)
