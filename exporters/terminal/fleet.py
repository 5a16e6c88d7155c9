"""`loadwatch status --url A --url B ...`: one screen for a multi-node deployment, a line per
node, from each node's own /status (its role, ranks, progress by its own signals, ETA).

Every value is read by type (docread.py: a wrong one shows as `-` or `?`) and every string the
nodes sent, errors that quote them included, is cleaned of control sequences (clean.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from loadwatch.exporters.terminal.clean import clean_text, one_line, print_error
from loadwatch.exporters.terminal.docread import amount, count, mapping, number, string, yes
from loadwatch.exporters.terminal.fetch import (
    EX_UNAVAILABLE,
    TIMEOUT_S,
    StatusError,
    fetch_status,
    status_target,
)
from loadwatch.exporters.terminal.fmt import duration
from loadwatch.exporters.terminal.watch import json_line

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
    r = number(x)
    return f"{100 * r:5.1f}%" if r is not None else "    - "


def _ratio(doc: dict[str, Any] | None) -> float | None:
    return number(mapping(mapping(mapping(doc).get("node")).get("progress")).get("ratio"))


def node_line(url: str, doc: dict[str, Any] | None, error: str | None) -> str:
    url = one_line(url)
    if doc is None:
        return f"{url:<24} unreachable: {one_line(error or '?')}"
    node = mapping(doc.get("node"))
    role = mapping(node.get("role"))
    prog = mapping(node.get("progress"))
    eta = amount(prog.get("eta_s"))
    if eta is not None:
        low, high = amount(prog.get("eta_low_s")), amount(prog.get("eta_high_s"))
        span = (
            f" ({duration(low)}-{duration(high)})" if low is not None and high is not None else ""
        )
        eta_text = duration(eta) + span
    else:
        eta_text = "-"
    state = (
        "ready"
        if yes(node.get("ready"))
        else "STALLED"
        if yes(prog.get("stalled"))
        else string(doc.get("phase")) or "-"
    )
    rank = count(role.get("node_rank"))
    name = string(role.get("role")) or "?"
    ranks = string(role.get("ranks")) or "-"
    return (
        f"{url:<24} {one_line(name):<15} {'-' if rank is None else rank:>4} "
        f"{one_line(ranks):<8} {one_line(state):<16} {_pct(prog.get('ratio'))} "
        f"io {_pct(prog.get('io_ratio'))} gpu {_pct(prog.get('gpu_ratio'))}  ETA {eta_text}"
    )


def render_fleet(answers: Sequence[Answer]) -> str:
    header = (
        f"{'node':<24} {'role':<15} {'rank':>4} {'ranks':<8} {'state':<16} {'progress':>6}"
        "  by its own signals"
    )
    lines = [node_line(u, d, e) for u, d, e in answers]
    known = [r for _, d, _ in answers if (r := _ratio(d)) is not None]
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
            status_target(url)
        except StatusError as exc:
            print_error(str(exc))
            return exc.code
    try:
        while True:
            answers = fetch_all(urls, timeout_s)
            if as_json:
                out = [{"url": u, "status": d, "error": e} for u, d, e in answers]
                sys.stdout.write(json_line(out))
            else:
                sys.stdout.write(clean_text(render_fleet(answers)))
            sys.stdout.flush()
            if not watch:
                return 0 if all(d is not None for _, d, _ in answers) else EX_UNAVAILABLE
            sleep(interval_s)
            if not as_json:
                sys.stdout.write("\n")
    except (KeyboardInterrupt, BrokenPipeError):
        return 0


__all__ = ["fetch_all", "fleet_command", "node_line", "render_fleet"]
