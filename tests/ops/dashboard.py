"""Every PromQL expression in the Grafana dashboard, ready to run against a real Prometheus.

`dashboard_queries()` walks the panels (rows included), the annotations and the template
variables (a `label_values(metric, label)` query becomes `count by (label) (metric)`), and
`resolve()` substitutes Grafana's variables so the expression can go to Prometheus's API.

    python -m tests.ops.dashboard [DASHBOARD.json] [--resolve]

prints one `where<TAB>expression` line per query (expressions on one line).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "grafana" / "loadwatch.json"

# What the dashboard's variables stand for when every job, instance and GPU is selected.
ALL_SELECTED = {"job": ".+", "deployment": ".*", "instance": ".+", "gpu": ".+"}
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<metric>.+?)\s*,\s*(?P<label>\w+)\s*\)\s*$")


@dataclass(frozen=True)
class DashboardQuery:
    where: str  # "panel 'Title' A", "annotation 'name'", "variable 'job'"
    expr: str
    instant: bool = False


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries(path: Path = DASHBOARD) -> list[DashboardQuery]:
    board = json.loads(path.read_text(encoding="utf-8"))
    found: list[DashboardQuery] = []
    for panel in _panels(board.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                where = f"panel {panel.get('title')!r} {target.get('refId', '?')}"
                found.append(DashboardQuery(where, target["expr"], bool(target.get("instant"))))
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            found.append(DashboardQuery(f"annotation {annotation['name']!r}", annotation["expr"]))
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, Mapping) else str(query)
        match = _LABEL_VALUES.match(text)
        if match is None:
            raise ValueError(f"variable {variable['name']!r}: not a label_values() query: {text}")
        expr = f"count by ({match['label']}) ({match['metric']})"
        found.append(DashboardQuery(f"variable {variable['name']!r}", expr, instant=True))
    return found


def resolve(
    expr: str, values: Mapping[str, str] = ALL_SELECTED, *, rate_interval: str = "1m"
) -> str:
    """`expr` with Grafana's variables replaced; an unknown variable is an error."""
    builtins = {
        "__rate_interval": rate_interval,
        "__interval": rate_interval,
        "__range": rate_interval,
    }

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        if name in values:
            return values[name]
        raise KeyError(f"unknown dashboard variable ${name} in: {expr}")

    return _VAR.sub(one, expr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="List the dashboard's PromQL expressions.")
    parser.add_argument("dashboard", nargs="?", type=Path, default=DASHBOARD)
    parser.add_argument("--resolve", action="store_true", help="substitute Grafana variables")
    args = parser.parse_args(argv)
    for query in dashboard_queries(args.dashboard):
        expr = resolve(query.expr) if args.resolve else query.expr
        print(f"{query.where}\t{' '.join(expr.split())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
