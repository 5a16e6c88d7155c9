"""Alerts, dashboard and the scripted exposition use only the metrics docs/metrics.md defines."""

from __future__ import annotations

import re
import subprocess
import typing
from dataclasses import dataclass

from loadwatch.parsers.events import FailureKind

from .common import ALERTS, METRICS_DOC, require
from .dashboard import dashboard_queries
from .exposition import FAILURE_KINDS, Scene, render

# Labels every scraped series gets from Prometheus, and series Prometheus makes itself.
# `deployment` is the target label prometheus/prometheus.yml.example gives every node of one
# deployment (the fleet rules group by it).
TARGET_LABELS = {"job", "instance", "deployment"}
PROMETHEUS_SERIES = {"up", "ALERTS"}
_METRIC = re.compile(r"\b(loadwatch_[a-z0-9_]+)\b")
_SELECTOR = re.compile(r"\b(loadwatch_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


@dataclass(frozen=True)
class DocMetric:
    kind: str
    labels: frozenset[str]
    values: dict[str, frozenset[str]]  # label -> values the doc lists, where it lists them


def documented() -> dict[str, DocMetric]:
    metrics: dict[str, DocMetric] = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`loadwatch_"):
            continue
        name, kind, label_cell, meaning = cells
        labels = frozenset(re.findall(r"`(\w+)`(?!\))", re.sub(r"\([^)]*\)", "", label_cell)))
        values: dict[str, frozenset[str]] = {}
        listed = re.findall(r"`(\w+)`\s*\(([^)]*)\)", label_cell)
        listed += [m for m in re.findall(r"(\w+) \((`[^)]*)\)", meaning) if m[0] in labels]
        if not listed and len(labels) == 1 and "(`" in meaning:
            listed = [(next(iter(labels)), meaning[meaning.index("(`") :])]
        for label, text in listed:
            values[label] = frozenset(re.findall(r"`([\w/]+)`", text))
        metrics[name.strip("`")] = DocMetric(kind, labels, values)
    return metrics


def test_the_doc_parses() -> None:
    doc = documented()
    assert len(doc) >= 50
    assert doc["loadwatch_load_phase"].values["phase"] >= {"loading_weights", "stalled", "ready"}
    assert doc["loadwatch_vllm_state"].values["state"] >= {"fatal", "backoff"}
    assert doc["loadwatch_source_up"].values["source"] == {"log", "gpu", "vllm"}
    assert doc["loadwatch_gpu_up"].labels == {"gpu", "UUID"}
    assert doc["loadwatch_failures_total"].kind == "counter"
    assert doc["loadwatch_session_warnings"].values["verdict"] == {
        "benign",
        "flagged",
        "unknown",
        "unrated",
    }


def allowed_values(metric: str, label: str) -> frozenset[str] | None:
    if label == "kind" and metric in ("loadwatch_failures_total", "loadwatch_session_failure"):
        return frozenset(typing.get_args(FailureKind))
    return documented()[metric].values.get(label)


def check_expression(expr: str, where: str) -> list[str]:
    doc = documented()
    problems = []
    for name in _METRIC.findall(expr):
        if name not in doc:
            problems.append(f"{where}: {name} is not in docs/metrics.md")
    for name, matchers in _SELECTOR.findall(expr):
        if name not in doc:
            continue
        for label, op, value in _MATCHER.findall(matchers):
            if label in TARGET_LABELS:
                continue
            if label not in doc[name].labels:
                problems.append(f"{where}: {name} has no label {label}")
                continue
            allowed = allowed_values(name, label)
            if allowed is None:
                continue
            wanted = set(value.split("|")) if op in ("=~", "!~") else {value}
            if wanted - allowed:
                problems.append(
                    f"{where}: {name}{{{label}}} has no value {sorted(wanted - allowed)}"
                )
    every_label = set().union(*(m.labels for m in doc.values())) | TARGET_LABELS
    for clause in re.findall(r"\b(?:by|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        for label in filter(None, (x.strip() for x in clause.split(","))):
            if label not in every_label:
                problems.append(f"{where}: no metric has a label {label}")
    return problems


def alert_expressions() -> list[tuple[str, str]]:
    """(alert, expr) from alerts.yml: the one-line `expr:` or the `expr: |` block after it."""
    found = []
    lines = ALERTS.read_text().splitlines()
    name = ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("- alert:"):
            name = stripped.split(":", 1)[1].strip()
        elif stripped.startswith("expr:"):
            expr = stripped.split(":", 1)[1].strip()
            if expr == "|":
                indent = len(line) - len(line.lstrip())
                block = []
                for more in lines[i + 1 :]:
                    if more.strip() and len(more) - len(more.lstrip()) <= indent:
                        break
                    block.append(more.strip())
                expr = " ".join(block)
            found.append((name, expr))
    return found


def test_alerts_use_documented_metrics_labels_and_values() -> None:
    exprs = alert_expressions()
    assert len(exprs) == len(re.findall(r"- alert:", ALERTS.read_text()))
    problems = [p for name, expr in exprs for p in check_expression(expr, name)]
    # Annotations query metrics too.
    for m in re.finditer(r'printf "([^"]*)"', ALERTS.read_text()):
        problems += check_expression(m.group(1).replace("%q", '"x"'), "annotation")
    assert problems == []


def test_dashboard_uses_documented_metrics_labels_and_values() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 40
    problems = [p for q in queries for p in check_expression(q.expr, q.where)]
    assert problems == []
    used = {n for q in queries for n in _METRIC.findall(q.expr)}
    # The dashboard shows nearly everything loadwatch exports; what it leaves out is deliberate.
    left_out = set(documented()) - used
    assert left_out <= {
        "loadwatch_load_phase_since_timestamp_seconds",
        "loadwatch_load_last_progress_timestamp_seconds",  # the stall alert's; the dashboard
        # shows loadwatch_load_silence_seconds, the silence as the stall check counts it
        "loadwatch_load_done_bytes",
        "loadwatch_load_total_bytes",
        "loadwatch_gpu_info",  # used by the gpu variable's label_values()
        "loadwatch_gpu_xid_events_total",  # the alert's; the dashboard shows the per-code series
        "loadwatch_vllm_info",  # for joining vLLM's own vllm:* series on model_name
        "loadwatch_log_state",  # the log alerts'; the dashboard shows loadwatch_source_up
        # the learned ETA to ready and the alert's overdue time: /status and the alert show them
        "loadwatch_startup_eta_seconds",
        "loadwatch_startup_overdue_seconds",
        "loadwatch_startup_phase_overdue_seconds",
        # the remedies' alerts'; /status and the vllm.remedy lines show each step
        "loadwatch_vllm_remedies_total",
        "loadwatch_vllm_remedy_ladder_exhausted",
    } | {m for m in documented() if m.startswith("loadwatch_http_process_")}  # self-metrics


def test_the_checker_catches_mistakes() -> None:
    assert check_expression('loadwatch_load_stalled{phase="x"}', "t")
    assert check_expression('loadwatch_load_phase{phase="loading"}', "t")
    assert check_expression('loadwatch_failures_total{kind=~"cuda_oom|oom"}', "t")
    assert check_expression("loadwatch_load_eta", "t")
    assert check_expression("sum by (node) (loadwatch_gpu_up)", "t")
    assert check_expression('loadwatch_session_warnings{verdict!="harmless"}', "t")
    assert not check_expression('loadwatch_vllm_state{state="fatal", job="x"}', "t")


def rich_scene() -> Scene:
    return Scene(
        now_s=10_000.0,
        started_s=9_000.0,
        session_start_s=9_500.0,
        shards_done=20,
        eta_s=600.0,
        last_progress_s=9_990.0,
        oom_predicted=True,
        failure="cuda_oom",
        failures={"cuda_oom": 1},
        warnings={("kv_scale_not_loaded", "benign"): 61, ("unknown_warning", "unknown"): 1},
        xids={(3, 31): 1},
        time_to_ready_s=900.0,
        first_completion_s=0.4,
        weights_load_s=700.0,
        startup_seconds={"config": 60.0, "weights": 440.0},
        last_startup_seconds={"config": 58.0, "weights": 700.0, "torch_compile": 95.0},
        startup_eta_s=(500.0, 560.0, 640.0),
        log_lines=5000,
    )


def families(text: str) -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) of an exposition."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels: dict[str, set[str]] = {name: set() for name in types}
    for name, inner in re.findall(r"^(\w+)\{([^}]*)\}", text, re.M):
        labels[name] |= {m[0] for m in _MATCHER.findall(inner)}
    return {name: (kind, labels[name]) for name, kind in types.items()}


def test_scripted_exposition_is_faithful_to_the_doc() -> None:
    """The stand-in exports exactly the documented names, types and label sets."""
    assert set(FAILURE_KINDS) == set(typing.get_args(FailureKind))
    got = families(render(rich_scene()))
    doc = documented()
    assert set(got) == set(doc)
    for name, (kind, labels) in got.items():
        assert kind == doc[name].kind, name
        assert labels == set(doc[name].labels), name


def test_scripted_exposition_passes_promtool() -> None:
    """`promtool check metrics` has nothing to say about the documented names."""
    result = subprocess.run(
        [require("promtool"), "check", "metrics"],
        input=render(rich_scene()),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert complaints == []
