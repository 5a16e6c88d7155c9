"""The command-line options that feed the memory plan (preflight and patch-model share them):
vLLM's own flags for the layout, and the GPU's capacity when NVML is not the answer."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from loadwatch.daemon.state.memplan import Layout
from loadwatch.daemon.state.memplan_inputs import (
    GPU_MODELS_MIB,
    gpu_model_capacity,
    layout_from_argv,
    parse_bytes,
)

# vLLM's own flags that the memory plan reads, spelled as vLLM spells them.
PLAN_FLAGS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--block-size",
)
Capacity = tuple[int, str]

# The compute capability of each GPU that --gpu-model knows (memplan_inputs.GPU_MODELS_MIB, by
# the same name fragment), as NVIDIA lists it: Hopper 9.0, datacenter Blackwell 10.0, Blackwell
# workstation and GeForce (SM120) 12.0, Ampere A100 8.0, Ada 8.9. It decides which attention
# backends vLLM has (an FP8 MLA KV cache fails on 12.x), so a plan for a named GPU checks it.
GPU_MODELS_CC: dict[str, tuple[int, int]] = {
    "rtx pro 6000": (12, 0),
    "rtx 5090": (12, 0),
    "b200": (10, 0),
    "h200": (9, 0),
    "h100": (9, 0),
    "h20": (9, 0),
    "a100-40": (8, 0),
    "a100": (8, 0),
    "l40s": (8, 9),
    "rtx 4090": (8, 9),
}


def _checked(flag: str) -> Callable[[str], str]:
    """argparse type for one plan flag: the text as given, once it reads as vLLM would take it."""

    def check(text: str) -> str:
        if flag == "--kv-cache-memory-bytes":
            ok = parse_bytes(text) is not None and (parse_bytes(text) or 0) > 0
            want = "a byte count such as 4000000000 or 4G"
        elif flag == "--gpu-memory-utilization":
            try:
                ok = 0 < float(text) <= 1
            except ValueError:
                ok = False
            want = "a fraction in (0, 1]"
        else:
            ok = text.isdigit() and int(text) > 0
            want = "a whole number above 0"
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r}: {flag} wants {want}")
        return text

    return check


def add_plan_flags(p: argparse.ArgumentParser, positive: Callable[[str], float]) -> None:
    p.add_argument(
        "--gpu-memory-gib", type=positive, metavar="G", help="memory per GPU (default: NVML)"
    )
    p.add_argument(
        "--gpu-model",
        metavar="NAME",
        help="plan for this GPU, e.g. 'RTX PRO 6000', H100, H200: its memory and compute capability",
    )
    p.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="plan for GPUs or the CPU"
    )
    for flag in PLAN_FLAGS:
        p.add_argument(
            flag, type=_checked(flag), metavar="X", help=f"as vLLM's {flag} (default: vLLM's)"
        )
    p.add_argument(
        "--enable-expert-parallel", action="store_true", help="as vLLM's flag of that name"
    )


def plan_layout(args: argparse.Namespace) -> Layout:
    argv: list[str] = []
    for flag in PLAN_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            argv += [flag, value]
    if args.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    env = dict(os.environ) if args.device == "cpu" else {}  # VLLM_CPU_KVCACHE_SPACE
    return layout_from_argv(argv, env, device=args.device)


def plan_capacity(args: argparse.Namespace, nvml_total: int | None) -> Capacity | None:
    """--gpu-memory-gib, else --gpu-model, else NVML's; ValueError for an unknown model."""
    if args.gpu_memory_gib is not None:
        return int(args.gpu_memory_gib * 2**30), f"--gpu-memory-gib {args.gpu_memory_gib:g}"
    if args.gpu_model:
        cap = gpu_model_capacity(args.gpu_model)
        if cap is None:
            raise ValueError(f"--gpu-model {args.gpu_model!r}: unknown; give --gpu-memory-gib")
        return cap
    if nvml_total is not None:
        return nvml_total, "NVML: the first GPU's total memory"
    return None


def gpu_model_cc(name: str) -> tuple[int, int] | None:
    """The compute capability of the GPU --gpu-model names, matched as its memory is."""
    low = name.lower()
    fragment = next((f for f, _ in GPU_MODELS_MIB if f in low), None)
    return GPU_MODELS_CC.get(fragment) if fragment is not None else None


def gpu_cc_of(args: argparse.Namespace) -> tuple[int, int] | None:
    """--gpu-cc, else --gpu-model's (an unknown model is said by the capacity); ValueError."""
    from loadwatch.daemon.tools.preflight import parse_gpu_cc

    if args.gpu_cc:
        try:
            return parse_gpu_cc(args.gpu_cc)
        except ValueError as exc:
            raise ValueError(f"--gpu-cc: {exc}") from None
    return gpu_model_cc(args.gpu_model) if args.gpu_model else None


def needs_nvml(args: argparse.Namespace, for_cc: bool) -> bool:
    elsewhere = args.gpu_memory_gib is not None or bool(args.gpu_model)
    cc_elsewhere = bool(getattr(args, "gpu_cc", None)) or bool(args.gpu_model)
    return args.device == "cuda" and ((for_cc and not cc_elsewhere) or not elsewhere)


def nvml_gpu() -> tuple[tuple[int, int] | None, int | None]:
    """The first GPU's compute capability and total memory, when NVML answers."""
    from loadwatch.daemon.sources.gpu.nvml import NvmlSource

    src = NvmlSource(xid_events=False, logger=lambda line: None)
    try:
        reading = src.poll()
        first = next((s for s in reading.samples if s.compute_capability), None)
        if first is None:
            return None, None
        return first.compute_capability, first.memory_total_bytes
    finally:
        src.close()
