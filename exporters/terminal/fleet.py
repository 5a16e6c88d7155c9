"""`loadwatch status --url A --url B ...`: one screen for a multi-node deployment, a line per
node, from each node's own /status (its role, ranks, progress by its own signals, ETA)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loadwatch.exporters.terminal.fmt import duration
from loadwatch.exporters.terminal.watch import (
    EX_UNAVAILABLE,
    TIMEOUT_S,
    StatusError,
    _target,
    fetch_status,
)

Answer = tuple[str, dict[str, Any] | None, str | None]  # url, /status, error


def fetch_all(urls: Sequence[str], timeout_s: float = TIMEOUT_S) -> list[Answer]:
    def one(url: str) -> Answer:
        try:
            doc, _ = fetch_status(url, timeout_s)
        except StatusError as exc:
            return url, None, str(exc)
        return url, doc, None

    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        return list(pool.map(one, urls))


def _pct(x: Any) -> str:
    return f"{100 * x:5.1f}%" if isinstance(x, int | float) else "    - "


def node_line(url: str, doc: dict[str, Any] | None, error: str | None) -> str:
    if doc is None:
        return f"{url:<24} unreachable: {error}"
    node = doc.get("node") or {}
    role = node.get("role") or {}
    prog = node.get("progress") or {}
    eta = prog.get("eta_s")
    if eta is not None:
        low, high = prog.get("eta_low_s"), prog.get("eta_high_s")
        span = (
            f" ({duration(low)}-{duration(high)})" if low is not None and high is not None else ""
        )
        eta_text = duration(eta) + span
    else:
        eta_text = "-"
    state = (
        "ready"
        if node.get("ready")
        else "STALLED"
        if prog.get("stalled")
        else doc.get("phase") or "-"
    )
    rank = role.get("node_rank")
    return (
        f"{url:<24} {role.get('role', '?'):<15} {'-' if rank is None else rank:>4} "
        f"{role.get('ranks') or '-':<8} {state:<16} {_pct(prog.get('ratio'))} "
        f"io {_pct(prog.get('io_ratio'))} gpu {_pct(prog.get('gpu_ratio'))}  ETA {eta_text}"
    )


def render_fleet(answers: Sequence[Answer]) -> str:
    header = (
        f"{'node':<24} {'role':<15} {'rank':>4} {'ranks':<8} {'state':<16} {'progress':>6}"
        "  by its own signals"
    )
    lines = [node_line(u, d, e) for u, d, e in answers]
    ratios = [((d or {}).get("node") or {}).get("progress", {}).get("ratio") for _, d, _ in answers]
    known = [r for r in ratios if isinstance(r, int | float)]
    summary = f"{len(answers)} nodes, {sum(d is not None for _, d, _ in answers)} answering"
    if known:
        summary += f"; slowest {100 * min(known):.1f}%, mean {100 * sum(known) / len(known):.1f}%"
    return "\n".join([header, *lines, summary]) + "\n"


def fleet_command(
    urls: Sequence[str],
    *,
    watch: bool,
    as_json: bool,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
    timeout_s: float = TIMEOUT_S,
) -> int:
    for url in urls:
        try:
            _target(url)
        except StatusError as exc:
            print(f"loadwatch: {exc}", file=sys.stderr)
            return exc.code
    try:
        while True:
            answers = fetch_all(urls, timeout_s)
            if as_json:
                out = [{"url": u, "status": d, "error": e} for u, d, e in answers]
                sys.stdout.write(json.dumps(out, separators=(",", ":")) + "\n")
            else:
                sys.stdout.write(render_fleet(answers))
            sys.stdout.flush()
            if not watch:
                return 0 if all(d is not None for _, d, _ in answers) else EX_UNAVAILABLE
            sleep(interval_s)
            if not as_json:
                sys.stdout.write("\n")
    except (KeyboardInterrupt, BrokenPipeError):
        return 0


__all__ = ["fetch_all", "fleet_command", "node_line", "render_fleet"]
