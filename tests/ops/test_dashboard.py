"""The Grafana dashboard's structure: schema, variables, layout, and the panels operators need."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from .common import DASHBOARD, GRAFANA, ROOT
from .dashboard import ALL_SELECTED, dashboard_queries, resolve


def board() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def test_schema_and_variables() -> None:
    b = board()
    assert b["schemaVersion"] >= 39
    assert b["uid"] and b["title"] and b["id"] is None  # importable anywhere
    variables = {v["name"]: v for v in b["templating"]["list"]}
    assert list(variables) == [
        "datasource",
        "job",
        "deployment",
        "instance",
        "gpu",
        "runbook_base_url",
    ]
    runbook = variables["runbook_base_url"]  # one place for the runbooks' base, as the alerts'
    assert runbook["type"] == "constant" and runbook["hide"] == 2
    links = [link["url"] for link in b["links"]]
    assert "${runbook_base_url}/runbook.md" in links
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "deployment", "instance", "gpu"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"]
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert "$job" in variables["instance"]["definition"]  # instance follows the job choice
    # ... and the deployment's (the scrape config's `deployment` label: one per multi-node
    # deployment), so the node row shows the nodes of one deployment side by side
    assert "$deployment" in variables["instance"]["definition"]


def test_every_panel_uses_the_datasource_variable() -> None:
    for panel in panels(board()["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"].strip()
        assert panel.get("description"), f"{panel['title']}: say what it shows"


def test_queries_filter_by_job_and_instance_and_use_rate_interval() -> None:
    for query in dashboard_queries():
        if query.where.startswith("variable"):
            continue
        for selector in re.findall(r"\b((?:loadwatch_\w+|up)\{[^}]*\})", query.expr):
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, (
                query.where,
                selector,
            )
        for window in re.findall(r"\[([^\]]+)\]", query.expr):
            assert window == "$__rate_interval", (query.where, window)
        assert "$gpu" not in query.expr or "gpu=~" in query.expr


def test_layout_has_no_overlaps() -> None:
    taken: set[tuple[int, int]] = set()
    ids = []
    for panel in panels(board()["panels"]):
        ids.append(panel["id"])
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        cells = {(g["x"] + dx, g["y"] + dy) for dx in range(g["w"]) for dy in range(g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    assert len(ids) == len(set(ids))


def titles() -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in panels(board()["panels"])}


@pytest.mark.parametrize(
    ("title", "kind", "metrics"),
    [
        ("Phase over time", "state-timeline", ["loadwatch_load_phase"]),
        ("Start-up step over time", "state-timeline", ["loadwatch_startup_phase{"]),
        ("Start-up phases: this start and the last", "bargauge", ["loadwatch_startup_phase_seconds"]),
        ("Load progress", "timeseries", ["loadwatch_load_progress_ratio"]),
        ("ETA and budget", "timeseries", ["loadwatch_load_eta_seconds", "loadwatch_load_budget"]),
        ("Shard rate", "timeseries", ['rate(loadwatch_load_shards_loaded_total{job=~"$job", instance=~"$instance"}[$__rate_interval])']),
        (
            "GPU memory: used, capacity, projected",
            "timeseries",
            ["loadwatch_gpu_memory_used_bytes", "loadwatch_gpu_memory_total_bytes", "loadwatch_gpu_memory_projected_bytes"],
        ),
        ("GPU utilisation", "timeseries", ["loadwatch_gpu_utilization_ratio"]),
        ("GPU temperature", "timeseries", ["loadwatch_gpu_temperature_celsius"]),
        ("GPU power", "timeseries", ["loadwatch_gpu_power_watts"]),
        ("Warnings this session: benign", "bargauge", ['verdict="benign"']),
        ("Warnings this session: not benign", "bargauge", ['verdict!="benign"']),
        ("Failures by kind", "timeseries", ["loadwatch_failures_total"]),
        ("Restarts, exits, stalls", "timeseries", ["loadwatch_vllm_restarts_total"]),
        ("Time to ready per session", "timeseries", ["loadwatch_time_to_ready_seconds"]),
        ("Scrape and sources", "state-timeline", ["up{", "loadwatch_source_up"]),
        ("Nodes side by side", "table", ["loadwatch_node_info", "loadwatch_node_progress_ratio", "loadwatch_node_ready"]),
        ("Node progress, side by side", "timeseries", ["loadwatch_node_progress_ratio", "min by (deployment)"]),
    ],
)  # fmt: skip
def test_the_panels_operators_need(title: str, kind: str, metrics: list[str]) -> None:
    panel = titles()[title]
    assert panel["type"] == kind
    exprs = " ".join(t["expr"] for t in panel["targets"])
    for metric in metrics:
        assert metric in exprs, (title, metric)


def test_memory_panel_styles_capacity_and_projection_apart() -> None:
    panel = titles()["GPU memory: used, capacity, projected"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "bytes"
    legends = [t["legendFormat"] for t in panel["targets"]]
    styled = {o["matcher"]["options"]: o["properties"] for o in panel["fieldConfig"]["overrides"]}
    for suffix in ("capacity", "projected"):
        (legend,) = [x for x in legends if x.endswith(suffix)]
        (regex,) = [r for r in styled if re.fullmatch(r, legend.replace("{{instance}}", "h:9321"))]
        assert any(p["id"] == "custom.lineStyle" for p in styled[regex])


def test_phase_mapping_covers_every_phase() -> None:
    panel = titles()["Phase over time"]
    (expr,) = [t["expr"] for t in panel["targets"]]
    codes = dict(re.findall(r'phase="(\w+)"\} \* (\d+)', expr))
    options = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {options[code]["text"]: code for code in options} == codes
    assert len(codes) == 7


def test_startup_step_mapping_covers_every_documented_phase() -> None:
    """The state timeline of the start-up's step names each phase docs/metrics.md lists."""
    from .test_metric_names import documented

    panel = titles()["Start-up step over time"]
    (expr,) = [t["expr"] for t in panel["targets"]]
    codes = dict(re.findall(r'phase="(\w+)"\} \* (\d+)', expr))
    options = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {options[code]["text"]: code for code in options if code != "0"} == codes
    assert set(codes) == documented()["loadwatch_startup_phase"].values["phase"]
    assert options["0"]["text"] == "not starting"


def test_listing_script_prints_every_query() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.ops.dashboard", "--resolve"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == len(dashboard_queries())
    assert all("\t" in line and "$" not in line.split("\t", 1)[1] for line in lines)
    assert any(line.startswith("variable 'instance'\tcount by (instance)") for line in lines)


def test_resolve() -> None:
    expr = 'rate(x{job=~"$job", instance=~"${instance}"}[$__rate_interval])'
    assert resolve(expr, rate_interval="30s") == 'rate(x{job=~".+", instance=~".+"}[30s])'
    assert resolve("$gpu", {**ALL_SELECTED, "gpu": "3"}) == "3"
    with pytest.raises(KeyError, match="nope"):
        resolve("x{a=~'$nope'}")


def test_provisioning_points_at_the_dashboard() -> None:
    provider = (GRAFANA / "provisioning" / "dashboards.yml").read_text()
    assert "apiVersion: 1" in provider and "type: file" in provider
    assert re.search(r"^\s+path: /\S+", provider, re.M)
    source = (GRAFANA / "provisioning" / "datasources.yml").read_text()
    assert "type: prometheus" in source and "timeInterval:" in source
