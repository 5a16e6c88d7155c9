"""What `loadwatch preflight -- COMMAND` would start: the command itself when it will start, else
the command with the first remedy that has a change for the failure the preflight predicts.

The rules are supervise mode's (supervise/remedies.py `propose`, judged on `predicted` as the
ladder judges a start the preflight refused), each tried in the order of `REMEDY_NAMES` (the
preflight reads no `[vllm] remedies`); `enforce_eager` is about stalls, which no preflight predicts. Nothing is changed on disk: the FP8 remedy is shown as its
flag (`remedy_fp8 = "flag"`), as a patch of the checkpoint is an operator's choice. The command is
shown redacted (the secrets `argv_secrets.py` knows), quoted with `shlex.join` for reading only:
loadwatch never runs a shell line.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadwatch.daemon.state.memplan import Layout
from loadwatch.daemon.state.memplan_inputs import fitting_len, layout_from_argv, plan_argv
from loadwatch.daemon.supervise.fp8_kv import kv_cost
from loadwatch.daemon.supervise.remedies import (
    REMEDY_NAMES,
    Change,
    Settings,
    no_remedy,
    predicted,
    propose,
    step_diff,
    with_change,
)
from loadwatch.daemon.tools.plan_args import PLAN_FLAGS
from loadwatch.daemon.tools.preflight import preflight_cli
from loadwatch.parsers.vllm.argv import kv_cache_dtype, model_path
from loadwatch.parsers.vllm.argv_secrets import Redactor


@dataclass(frozen=True, slots=True)
class WouldRun:
    """The command the preflight would start (redacted), and the remedy that changed it."""

    argv: tuple[str, ...]
    remedy: str | None = None
    reason: str | None = None  # why the remedy, or why none where one was needed
    diff: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        out = [f"would run: {shlex.join(self.argv)}"]
        if self.remedy is not None:
            out.append(f"  remedy {self.remedy}: {self.reason}")
            out += [f"    {line}" for line in self.diff]
        elif self.reason is not None:
            out.append(f"  no remedy: {self.reason}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "argv": list(self.argv),
            "would_run": shlex.join(self.argv),
            "remedy": self.remedy,
            "reason": self.reason,
            "diff": list(self.diff),
        }


def settings_for(
    env: Mapping[str, str], capacity: tuple[int, str] | None, min_model_len: int = 2048
) -> Settings:
    """The remedies' settings for a plan on `capacity`: the memory plan behind the
    `max_model_len` fallback and the FP8 remedy's cost, as supervise mode plans them."""
    return Settings(
        min_model_len=min_model_len,
        kv_cost=lambda argv: kv_cost(argv, env, capacity),
        planned_len=lambda argv: fitting_len(plan_argv(argv, env, capacity)),
    )


def would_run(
    argv: Sequence[str],
    failures: Sequence[str],
    settings: Settings,
    remedies: Sequence[str] = REMEDY_NAMES,
) -> WouldRun:
    """The command to start: `argv` when the preflight predicts no failure (`failures`: its
    failed checks' messages, the first the one supervise mode judges), else with the first
    remedy that has a change for it."""
    red = Redactor()
    red.learn(argv)
    if not failures:
        return WouldRun(tuple(red.argv(argv)))
    failed = predicted("preflight: " + failures[0])
    reasons: list[str] = []
    for name in remedies:
        change = propose(name, failed, argv, settings)
        if isinstance(change, Change) and change.option is not None:
            after = with_change(argv, change.option, change.after)
            return WouldRun(tuple(red.argv(after)), name, change.reason, step_diff(change))
        if isinstance(change, str):
            reasons.append(f"{name}: {change}")
    why = no_remedy(failed) or "; ".join(reasons) or f"no remedy for {failed.kind}"
    return WouldRun(tuple(red.argv(argv)), None, why)


def target(args: argparse.Namespace) -> tuple[Path, tuple[str, ...] | None]:
    """The directory to check, MODEL_DIR or the model of the vLLM command (`-- vllm serve M
    ...`: more than one word), and the command; ValueError (a usage error) for plan flags
    beside a command (its own flags say that) or a command that names no model."""
    if len(args.target) == 1:
        return Path(args.target[0]), None
    command = tuple(args.target)
    flags = [f for f in PLAN_FLAGS if getattr(args, f[2:].replace("-", "_")) is not None]
    if flags or args.enable_expert_parallel or args.kv_cache_dtype is not None:
        raise ValueError("preflight: with a vLLM command, give vLLM's flags in the command")
    model = model_path(command)
    if model is None:
        raise ValueError("preflight: the vLLM command names no model (--model M, or serve M)")
    return Path(model), command


def report(
    args: argparse.Namespace,
    model_dir: Path,
    command: Sequence[str] | None,
    cc: tuple[int, int] | None,
    layout: Layout,
    capacity: tuple[int, str] | None,
) -> tuple[str, dict[str, Any], int]:
    """`preflight_cli`'s report; of a command's layout and KV dtype, and with what it would
    run, when a command was given."""
    if command is None:
        return preflight_cli(
            str(model_dir), args.kv_cache_dtype, cc, layout=layout, capacity=capacity
        )
    env = dict(os.environ) if args.device == "cpu" else {}  # VLLM_CPU_KVCACHE_SPACE
    layout = layout_from_argv(command, env, device=args.device)
    kv = kv_cache_dtype(command)
    text, doc, code = preflight_cli(str(model_dir), kv, cc, layout=layout, capacity=capacity)
    return add_would_run(text, doc, command, env, capacity), doc, code


def add_would_run(
    text: str,
    doc: dict[str, Any],
    command: Sequence[str],
    env: Mapping[str, str],
    capacity: tuple[int, str] | None,
) -> str:
    """The report's text and dict with what the preflight would run (`would_run` in --json)."""
    fails = [c["message"] for c in doc["checks"] if c["status"] == "fail"]
    would = would_run(command, fails, settings_for(env, capacity))
    doc["would_run"] = would.to_dict()
    return text + "".join(line + "\n" for line in would.lines())


__all__ = [
    "WouldRun",
    "add_would_run",
    "report",
    "settings_for",
    "target",
    "would_run",
]
