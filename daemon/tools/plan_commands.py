"""`loadwatch preflight` and `loadwatch patch-model`: the two commands that plan a start's memory
from the command line's flags (plan_args.py), each run from the parsed arguments."""

from __future__ import annotations

import argparse
from typing import Any

from loadwatch.daemon.cli import EX_NOINPUT, UsageError, fail
from loadwatch.daemon.tools.plan_args import (
    gpu_cc_of,
    needs_nvml,
    nvml_gpu,
    plan_capacity,
    plan_layout,
)


def preflight_command(args: argparse.Namespace) -> int:
    import json

    from loadwatch.daemon.tools import preflight_remedy as pr
    from loadwatch.exporters.terminal.clean import clean_text

    try:
        model_dir, command = pr.target(args)
        cc = gpu_cc_of(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not model_dir.is_dir():
        what = "not a directory" if model_dir.exists() else "no such directory"
        return fail(f"preflight: model directory {model_dir}: {what}", EX_NOINPUT)
    nvml_cc, nvml_total = nvml_gpu() if needs_nvml(args, for_cc=True) else (None, None)
    layout, capacity = plan_inputs(args, nvml_total)
    text, doc, code = pr.report(args, model_dir, command, cc or nvml_cc, layout, capacity)
    print(json.dumps(doc, indent=2) if args.json else clean_text(text))
    return code


def plan_inputs(args: argparse.Namespace, nvml_total: int | None) -> tuple[Any, Any]:
    try:
        return plan_layout(args), plan_capacity(args, nvml_total)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def patch_model_command(args: argparse.Namespace) -> int:
    from loadwatch.daemon.sources.model.model_info import read_model_dir
    from loadwatch.daemon.tools.patch import patch_model_cli
    from loadwatch.daemon.tools.patch_plan import patch_effect_lines
    from loadwatch.exporters.terminal.clean import clean_text

    if args.force and not args.revert:
        raise UsageError("patch-model: --force goes with --revert")
    before = read_model_dir(args.model_dir, tensor_bytes=True) if args.drop_fp8_kv_cache else None
    text, code = patch_model_cli(
        str(args.model_dir),
        drop_fp8=args.drop_fp8_kv_cache,
        revert=args.revert,
        dry_run=args.dry_run,
        force=args.force,
    )
    if before is not None and code == 0 and before.checkpoint_kv_dtype == "fp8":
        nvml_total = nvml_gpu()[1] if needs_nvml(args, for_cc=False) else None
        layout, capacity = plan_inputs(args, nvml_total)
        lines = patch_effect_lines(before, layout, capacity, args.dry_run)
        text += "".join(line + "\n" for line in lines)
    if code != 0:
        return fail(text.rstrip("\n"), code)
    print(clean_text(text))  # the diff quotes the model's files (a downloaded checkpoint's text)
    return code
