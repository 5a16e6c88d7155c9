"""Will this model start in vLLM on these GPUs? Checked from the model directory alone.

The checks, each with a reason: attention type (MLA or not), the effective KV-cache dtype, whether
an MLA attention backend exists on this compute capability for that dtype, the shards, and
whether the k/v scale warnings vLLM will print are benign. Verdict: ok (exit 0), warnings (2),
will fail (1).

Backend facts (vLLM's MLA backends and the compute capabilities they accept): FLASH_ATTN_MLA 9.x
(no FP8 KV cache); FLASHMLA 9.x and 10.x; FLASHINFER_MLA and CUTLASS_MLA 10.x; TRITON_MLA any,
with an FP8 KV cache only from 2026-03-12 (before: ``TritonMLA V1 with FP8 KV cache not yet
supported``). So on 12.x (SM120) an MLA model with an FP8 KV cache cannot start on older vLLM.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.sources.model.model_info import MLA_MODEL_TYPES, read_model_dir
from loadwatch.daemon.sources.model.modelfiles import ModelFileError
from loadwatch.daemon.state import memplan
from loadwatch.daemon.state.memplan_inputs import NO_CAPACITY, layout_from_argv, plan_start
from loadwatch.daemon.supervise.vllm_probe import TritonMlaAnswer, ask_triton_mla_fp8
from loadwatch.daemon.tools.memplan_render import memory_check_message, plan_dict, plan_lines
from loadwatch.parsers.vllm import argv as vllm_argv

Verdict = Literal["ok", "warnings", "will_fail"]
CheckStatus = Literal["ok", "info", "warn", "fail"]

EXIT_CODES: dict[Verdict, int] = {"ok": 0, "will_fail": 1, "warnings": 2}
TRITON_MLA_FP8_SINCE = dt.date(2026, 3, 12)
AUTO_TAKES_CHECKPOINT_SINCE = dt.date(2025, 12, 1)

FP8_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})
PLAIN_DTYPES = frozenset({"bfloat16", "float16", "half", "float", "fp16", "bf16"})
QUANTIZED_DTYPES = FP8_DTYPES | {"nvfp4"}


@dataclass(frozen=True, slots=True)
class MlaBackend:
    name: str
    majors: frozenset[int] | None  # None: any compute capability
    fp8: bool


MLA_BACKENDS = (
    MlaBackend("FLASHINFER_MLA", frozenset({10}), fp8=True),
    MlaBackend("CUTLASS_MLA", frozenset({10}), fp8=True),
    MlaBackend("FLASHMLA", frozenset({9, 10}), fp8=True),
    MlaBackend("FLASH_ATTN_MLA", frozenset({9}), fp8=False),
    MlaBackend("TRITON_MLA", None, fp8=False),  # fp8 from TRITON_MLA_FP8_SINCE
)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: CheckStatus
    message: str  # one line


@dataclass(frozen=True, slots=True)
class PreflightReport:
    model_path: str
    checks: tuple[Check, ...]
    attention: Literal["mla", "standard"] | None = None
    kv_cache_dtype: str | None = None  # effective: "auto" means the model's dtype
    kv_cache_quantized: bool | None = None
    gpu_cc: tuple[int, int] | None = None
    backends: tuple[str, ...] = ()  # MLA backends able to run this KV dtype on gpu_cc
    shard_count: int = 0
    total_bytes: int | None = None
    scale_warnings_benign: bool | None = None
    fix: str | None = None  # the one suggested remedy when it will fail
    model: dict[str, Any] = field(default_factory=dict)
    memory: memplan.MemoryPlan | None = None

    @property
    def verdict(self) -> Verdict:
        statuses = {c.status for c in self.checks}
        if "fail" in statuses:
            return "will_fail"
        if "warn" in statuses:
            return "warnings"
        return "ok"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def failures(self) -> tuple[str, ...]:
        return tuple(c.message for c in self.checks if c.status == "fail")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "attention": self.attention,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_cache_quantized": self.kv_cache_quantized,
            "gpu_cc": None if self.gpu_cc is None else f"{self.gpu_cc[0]}.{self.gpu_cc[1]}",
            "mla_backends": list(self.backends),
            "shard_count": self.shard_count,
            "total_bytes": self.total_bytes,
            "scale_warnings_benign": self.scale_warnings_benign,
            "fix": self.fix,
            "model": self.model,
            "memory": None if self.memory is None else plan_dict(self.memory),
            "checks": [
                {"name": c.name, "status": c.status, "message": c.message} for c in self.checks
            ],
        }

    def to_text(self) -> str:
        labels = {"ok": "ok  ", "info": "info", "warn": "WARN", "fail": "FAIL"}
        lines = [f"preflight {self.model_path}"]
        lines += [f"  {labels[c.status]}  {c.name:<18} {c.message}" for c in self.checks]
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        if self.memory is not None:
            lines += plan_lines(self.memory)
        lines.append(f"verdict: {self.verdict.replace('_', ' ')}")
        return "\n".join(lines) + "\n"


def parse_gpu_cc(text: str) -> tuple[int, int]:
    """``"12.0"`` -> (12, 0); ValueError with a one-line message otherwise."""
    major, sep, minor = text.strip().partition(".")
    try:
        value = (int(major), int(minor or "0"))
    except ValueError:
        value = None
    if value is None or (sep and not minor) or value[0] <= 0 or value[1] < 0:
        raise ValueError(f"compute capability must look like 12.0 or 9.0, got {text!r}")
    return value


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _effective_kv(
    info: ModelInfo, arg: str | None, vllm_date: dt.date | None
) -> tuple[str, str, Check | None]:
    """(effective dtype, where it came from, an extra check for odd input)."""
    requested = (arg or "auto").strip().lower()
    if requested != "auto":
        extra = None
        if requested not in QUANTIZED_DTYPES | PLAIN_DTYPES:
            extra = Check("kv_cache_dtype", "warn", f"unknown --kv-cache-dtype {arg!r}")
        return requested, "--kv-cache-dtype (explicit, wins over the checkpoint)", extra
    ckpt = info.checkpoint_kv_dtype
    if ckpt is None:
        return "auto", "model dtype (the checkpoint declares no KV-cache quantisation)", None
    if vllm_date is not None and vllm_date < AUTO_TAKES_CHECKPOINT_SINCE:
        return "auto", f"model dtype (vLLM before 2025-12 ignores the checkpoint's {ckpt})", None
    where = next((s for s in info.kv_sources if s.startswith("config.json")), None)
    where = where or (info.kv_sources[0] if info.kv_sources else "checkpoint")
    dtype = "fp8_e4m3" if ckpt == "fp8" else ckpt
    return dtype, f"checkpoint, {where} (--kv-cache-dtype auto takes it)", None


def _error_check(line: str) -> Check:
    fatal = line.startswith(("model directory", "config.json:")) or "missing on disk" in line
    return Check("model_dir", "fail" if fatal else "warn", line)


def preflight(
    model_info: ModelInfo,
    kv_cache_dtype_arg: str | None = None,
    gpu_cc: tuple[int, int] | None = None,
    *,
    vllm_date: dt.date | None = None,
    layout: memplan.Layout | None = None,
    capacity: tuple[int, str] | None = None,
    triton: TritonMlaAnswer | None = None,
) -> PreflightReport:
    """Judge ``model_info`` for a start with ``--kv-cache-dtype kv_cache_dtype_arg`` on ``gpu_cc``.

    ``layout`` (from the vLLM argv) and ``capacity`` (bytes per GPU, and where that came from)
    feed the memory plan; without a layout there is no plan. ``triton``: what the installed vLLM
    said of TRITON_MLA and FP8 (supervise mode asks it); its answer wins over ``vllm_date``.

    ``vllm_date``: the date of the vLLM build, when known; unknown means the older behaviour
    (TRITON_MLA refuses FP8), which is the one that fails.
    """
    info = model_info
    checks = [_error_check(e) for e in info.errors]
    model = {
        "architecture": info.architecture,
        "model_type": info.model_type,
        "num_layers": info.num_layers,
        "quant_algo": info.quant_algo,
        "checkpoint_kv_dtype": info.checkpoint_kv_dtype,
        "kv_sources": list(info.kv_sources),
    }

    attention: Literal["mla", "standard"] | None = None
    if info.is_mla is None:
        checks.append(Check("attention", "warn", "unknown: config.json could not be read"))
    elif info.is_mla:
        attention = "mla"
        checks.append(Check("attention", "ok", f"MLA ({info.model_type}, kv_lora_rank set)"))
    else:
        attention = "standard"
        note = ""
        if info.model_type in MLA_MODEL_TYPES:
            note = f" ({info.model_type} without kv_lora_rank: vLLM does not use MLA)"
        checks.append(Check("attention", "ok", "standard (not MLA)" + note))

    kv_dtype, kv_from, extra = _effective_kv(info, kv_cache_dtype_arg, vllm_date)
    quantized = kv_dtype in QUANTIZED_DTYPES
    checks.append(Check("kv_cache_dtype", "ok", f"{kv_dtype}, from {kv_from}"))
    if extra is not None:
        checks.append(extra)
    if info.kv_sources and info.checkpoint_kv_dtype is None:
        checks.append(
            Check(
                "kv_cache_dtype",
                "info",
                f"{', '.join(info.kv_sources)} declares a KV dtype, but vLLM reads config.json's "
                "quantization_config, which declares none",
            )
        )

    backends: tuple[str, ...] = ()
    fix: str | None = None
    if attention == "mla":
        explicit = (kv_cache_dtype_arg or "auto").strip().lower() != "auto"
        check, backends, fix = _mla_backend_check(
            info, kv_dtype, explicit, gpu_cc, vllm_date, triton
        )
        checks.append(check)
    elif attention == "standard":
        checks.append(Check("attention_backend", "ok", "standard attention: no MLA constraint"))

    if info.shards:
        checks.append(
            Check(
                "shards",
                "ok",
                f"{len(info.shards)} file(s), {_gib(info.total_bytes or 0)} "
                f"({info.total_bytes or 0} bytes), first {info.shards[0].name}",
            )
        )
    elif not any(c.status == "fail" and c.name == "model_dir" for c in checks):
        checks.append(Check("shards", "fail", "no weight files found (*.safetensors, *.bin, *.pt)"))

    benign, scale_check = _scale_warning_check(info, kv_dtype, quantized)
    checks.append(scale_check)
    plan = (
        None if layout is None else plan_start(info, kv_dtype, layout, *(capacity or NO_CAPACITY))
    )
    if plan is not None:
        status: CheckStatus = {"fits": "ok", "tight": "warn", "will_fail": "fail"}.get(
            plan.verdict, "info"
        )  # type: ignore[assignment]
        checks.append(Check("memory", status, memory_check_message(plan)))
        if plan.verdict == "will_fail" and fix is None and plan.fixes:
            fix = "; ".join(plan.fixes)
    return PreflightReport(
        model_path=info.path,
        checks=tuple(checks),
        attention=attention,
        kv_cache_dtype=kv_dtype,
        kv_cache_quantized=quantized,
        gpu_cc=gpu_cc,
        backends=backends,
        shard_count=len(info.shards),
        total_bytes=info.total_bytes,
        scale_warnings_benign=benign,
        fix=fix,
        model=model,
        memory=plan,
    )


def _mla_backend_check(
    info: ModelInfo,
    kv_dtype: str,
    explicit: bool,
    gpu_cc: tuple[int, int] | None,
    vllm_date: dt.date | None,
    triton: TritonMlaAnswer | None = None,
) -> tuple[Check, tuple[str, ...], str | None]:
    if gpu_cc is None:
        return (
            Check("attention_backend", "warn", "GPU compute capability unknown: not checked"),
            (),
            None,
        )
    cc = f"{gpu_cc[0]}.{gpu_cc[1]}"
    present = [b for b in MLA_BACKENDS if b.majors is None or gpu_cc[0] in b.majors]
    if kv_dtype == "nvfp4":
        msg = f"on {cc}: MLA backends for an nvfp4 KV cache are not known here: not checked"
        return Check("attention_backend", "warn", msg), (), None
    fp8 = kv_dtype in FP8_DTYPES
    triton_fp8 = vllm_date is not None and vllm_date >= TRITON_MLA_FP8_SINCE
    said = ""
    if triton is not None and triton.fp8 is not None:
        triton_fp8, said = triton.fp8, f" ({triton.asked} says so: {triton.reason})"
    elif triton is not None:
        said = f" (could not ask the installed vLLM: {triton.reason}; by the date rule)"
    able = tuple(
        b.name for b in present if not fp8 or b.fp8 or (b.name == "TRITON_MLA" and triton_fp8)
    )
    if able:
        shown = (
            "the model-dtype (auto)"
            if kv_dtype == "auto"
            else f"an {kv_dtype}"
            if kv_dtype[:1] in "aeiou"
            else f"a {kv_dtype}"
        )
        msg = f"on {cc}: {', '.join(able)} can run {shown} KV cache"
        if fp8 and able == ("TRITON_MLA",):
            msg += said
        return Check("attention_backend", "ok", msg), able, None
    # Only TRITON_MLA exists below 9.x and from 11.x on; FP8-capable backends cover 9.x and 10.x.
    unless = "" if vllm_date is not None else " (unless this vLLM build is newer)"
    refuses = "which refuses an FP8 KV cache before vLLM of 2026-03-12" + unless + said
    if triton is not None and triton.fp8 is False:
        refuses = f"and {triton.asked} refuses an FP8 KV cache ({triton.reason})"
    msg = (
        f"on compute capability {cc} the only MLA backend is TRITON_MLA, {refuses}: expect "
        "'TritonMLA V1 with FP8 KV cache not yet supported' or 'No valid attention backend found'"
    )
    if explicit:
        fix = "drop --kv-cache-dtype or pass --kv-cache-dtype bfloat16"
    else:
        fix = (
            f"loadwatch patch-model {info.path} --drop-fp8-kv-cache "
            "(or start vLLM with --kv-cache-dtype bfloat16)"
        )
    return Check("attention_backend", "fail", msg), (), fix


def _scale_warning_check(info: ModelInfo, kv_dtype: str, quantized: bool) -> tuple[bool, Check]:
    layers = f"{info.num_layers} layers" if info.num_layers else "each layer"
    has_scales = info.checkpoint_kv_dtype is not None or bool(info.kv_sources)
    if not quantized:
        if has_scales:
            msg = (
                f"expect 'Found k_scale/v_scale in the checkpoint ... not loaded' once per layer "
                f"({layers}): benign, the {kv_dtype} KV cache does not use them"
            )
        else:
            msg = f"k/v scale warnings, if any, are benign: the {kv_dtype} KV cache uses no scales"
        return True, Check("kv_scale_warnings", "ok", msg)
    if has_scales:
        msg = (
            f"{kv_dtype} KV cache uses the checkpoint's k/v scales: a 'not loaded' or "
            "'scaling factor 1.0' warning would mean uncalibrated FP8 (accuracy risk), not benign"
        )
        return False, Check("kv_scale_warnings", "info", msg)
    msg = (
        f"{kv_dtype} KV cache without scales in the checkpoint: vLLM will use 1.0 "
        "('Using KV cache scaling factor 1.0'), which can cost accuracy"
    )
    return False, Check("kv_scale_warnings", "warn", msg)


def preflight_cli(
    model_dir: str,
    kv_cache_dtype: str | None = None,
    gpu_cc: tuple[int, int] | None = None,
    *,
    vllm_date: dt.date | None = None,
    layout: memplan.Layout | None = None,
    capacity: tuple[int, str] | None = None,
) -> tuple[str, dict[str, Any], int]:
    """``loadwatch preflight``: (text for the terminal, dict for --json, exit code); a file of
    the directory the bounds refuse raises ModelFileError (the CLI's one line, exit 65)."""
    report = preflight(
        read_model_dir(model_dir, tensor_bytes=True),
        kv_cache_dtype,
        gpu_cc,
        vllm_date=vllm_date,
        layout=layout,
        capacity=capacity,
    )
    return report.to_text(), report.to_dict(), report.exit_code


PreflightMode = Literal["warn", "refuse", "off"]


def start_hook(
    model_dir: str,
    mode: PreflightMode,
    *,
    kv_cache_dtype_arg: str | None = None,
    gpu_cc: Callable[[], tuple[int, int] | None] | None = None,
    on_report: Callable[[PreflightReport], None] | None = None,
    vllm_date: dt.date | None = None,
    layout: memplan.Layout | None = None,
    capacity: Callable[[], tuple[int, str] | None] | None = None,
    ask_triton: Callable[[], TritonMlaAnswer] | None = None,
) -> Callable[[], str | None] | None:
    """The supervisor's pre-start hook for ``preflight = mode``; None for ``off``.

    The hook re-reads the model directory before every start (a patch between starts counts),
    and asks the installed vLLM about TRITON_MLA (``ask_triton``) only on GPUs where it is the
    only MLA backend. It returns a veto reason only in ``refuse`` mode and only when the verdict
    is will-fail. ``on_report`` runs in the hook's thread: hand the report to the loop from there.
    """
    if mode == "off":
        return None

    def hook() -> str | None:
        cc = gpu_cc() if gpu_cc is not None else None
        triton = ask_triton() if ask_triton is not None and cc and cc[0] not in (9, 10) else None
        report = preflight(
            _read_for_hook(model_dir),
            kv_cache_dtype_arg,
            cc,
            vllm_date=vllm_date,
            layout=layout,
            capacity=capacity() if capacity is not None else None,
            triton=triton,
        )
        if on_report is not None:
            on_report(report)
        if mode == "refuse" and report.verdict == "will_fail":
            return "preflight: " + report.failures[0]
        return None

    return hook


def _read_for_hook(model_dir: str) -> ModelInfo:
    """The directory's facts; one refused by the bounds is a directory that will fail."""
    try:
        return read_model_dir(model_dir, tensor_bytes=True)
    except ModelFileError as exc:  # (its line names the directory: a fatal model_dir check)
        return ModelInfo(path=model_dir, errors=(str(exc),))


def start_hook_for_argv(
    argv: Sequence[str],
    mode: PreflightMode,
    *,
    gpu_cc: Callable[[], tuple[int, int] | None] | None = None,
    on_report: Callable[[PreflightReport], None] | None = None,
    vllm_date: dt.date | None = None,
    env: Mapping[str, str] | None = None,
    capacity: Callable[[], tuple[int, str] | None] | None = None,
) -> Callable[[], str | None] | None:
    """``start_hook`` with the model directory, KV dtype and parallel layout taken from the
    vLLM argv (and ``env``, the supervised environment: VLLM_CPU_KVCACHE_SPACE, PATH), asking
    the interpreter that argv runs about TRITON_MLA."""
    model = vllm_argv.model_path(argv)
    if model is None:
        return None
    environment = dict(env) if env is not None else {}
    return start_hook(
        model,
        mode,
        kv_cache_dtype_arg=vllm_argv.kv_cache_dtype(argv),
        gpu_cc=gpu_cc,
        on_report=on_report,
        vllm_date=vllm_date,
        layout=layout_from_argv(argv, environment),
        capacity=capacity,
        ask_triton=lambda: ask_triton_mla_fp8(argv, environment),
    )
