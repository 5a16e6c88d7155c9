"""The alert rules through promtool: syntax, unit tests, and unit tests that catch broken rules."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .common import ALERTS, PROMETHEUS, RUNBOOK, require

RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
RUNBOOK_BASE = "RUNBOOK_BASE_URL/runbook.md"  # filled in by `loadwatch alerts --runbook-base-url`


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
    )


def alert_names(text: str) -> list[str]:
    return re.findall(r"^\s*- alert: (\w+)\s*$", text, re.M)


def test_check_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    count = len(alert_names(ALERTS.read_text()))
    assert count >= 14
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_example_prometheus_config() -> None:
    result = promtool("check", "config", str(PROMETHEUS / "prometheus.yml.example"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_fleet_examples() -> None:
    """The multi-node scrape config (static and file_sd, a `deployment` label) and the
    deployment's recording rules."""
    result = promtool("check", "config", str(PROMETHEUS / "fleet.yml.example"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rule files found" in result.stdout
    text = (PROMETHEUS / "fleet.yml.example").read_text()
    assert "file_sd_configs:" in text and "static_configs:" in text and "deployment:" in text
    rules = promtool("check", "rules", str(PROMETHEUS / "fleet-rules.yml"))
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_rule_unit_tests_pass() -> None:
    assert {p.name for p in RULE_TESTS} >= {"load.yml", "failures.yml", "quiet.yml"}
    result = promtool("test", "rules", *(str(p) for p in RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_every_alert_is_tested_firing_and_silent() -> None:
    """Each alert has a test where it fires (exp_alerts with items) and one where it must not."""
    texts = "\n".join(p.read_text() for p in RULE_TESTS)
    check = re.compile(
        r"- alertname: (?P<name>\w+)\n\s+eval_time: \S+[^\n]*\n\s+exp_alerts:(?P<rest>[^\n]*)"
    )
    fires: set[str] = set()
    silent: set[str] = set()
    for m in check.finditer(texts):
        (silent if m["rest"].strip() == "[]" else fires).add(m["name"])
    names = set(alert_names(ALERTS.read_text()))
    assert fires >= names, f"never seen firing: {sorted(names - fires)}"
    assert silent >= names, f"never checked silent: {sorted(names - silent)}"
    assert fires <= names  # no test of an alert that no longer exists


def run_tests_against(tmp_path: Path, rules_text: str, test_file: str) -> str:
    """promtool's unit test `test_file` run against `rules_text` in place of alerts.yml."""
    (tmp_path / "alerts.yml").write_text(rules_text)
    (tmp_path / "tests").mkdir(exist_ok=True)
    shutil.copy(PROMETHEUS / "tests" / test_file, tmp_path / "tests" / test_file)
    shutil.copy(PROMETHEUS / "fleet-rules.yml", tmp_path / "fleet-rules.yml")
    result = promtool("test", "rules", f"tests/{test_file}", cwd=tmp_path)
    return result.stdout + result.stderr if result.returncode != 0 else ""


MUTANTS = [
    # (test file that must notice, what to change in alerts.yml, alert the failure names)
    ("load.yml", ("loadwatch_load_stalled == 1\n        for: 2m", "loadwatch_load_stalled == 1\n        for: 10m"), "LoadwatchLoadStalled"),
    ("load.yml", ("(0 * loadwatch_session_start_timestamp_seconds))\n", "(loadwatch_session_start_timestamp_seconds * 0 + 1e9))\n"), "LoadwatchLoadOverBudget"),
    ("failures.yml", ("  )\n                unless on(job, instance) loadwatch_load_ready == 1", "  )\n                unless on(job, instance) loadwatch_load_ready == 2"), "LoadwatchGpuOutOfMemory"),
    ("failures.yml", ('              loadwatch_session_failure{kind="cuda_oom"} == 1\n            or\n', ""), "LoadwatchGpuOutOfMemory"),
    ("vllm.yml", ("round(increase(loadwatch_vllm_restarts_total[30m])) >= 3", "round(increase(loadwatch_vllm_restarts_total[30m])) >= 2"), "LoadwatchVllmCrashLooping"),
    ("vllm.yml", ('unless on(job, instance) loadwatch_load_phase{phase="stopped"} == 1', 'unless on(job, instance) loadwatch_load_phase{phase="stopped"} == 2'), "LoadwatchVllmNotReady"),
    ("gpu.yml", ("increase(loadwatch_gpu_xid_events_total[10m]) > 0", "loadwatch_gpu_xid_events_total > 0"), "LoadwatchGpuXidErrors"),
    ("quiet.yml", ("expr: loadwatch_load_stalled == 1", "expr: loadwatch_load_stalled == 0"), "LoadwatchLoadStalled"),
    ("quiet.yml", ("round(increase(loadwatch_vllm_restarts_total[30m])) >= 3", "increase(loadwatch_vllm_restarts_total[30m]) >= 1"), "LoadwatchVllmCrashLooping"),
    ("deployment.yml", ("      ) > 0.2\n", "      ) > 0.5\n"), "LoadwatchNodeStraggler"),
    ("deployment.yml", ("          and on(job, instance) loadwatch_node_loading == 1\n", ""), "LoadwatchNodeStraggler"),
    ("deployment.yml", ('loadwatch_node_info{role=~"head|ray_head"}', 'loadwatch_node_info'), "LoadwatchNodeNotReady"),
    ("deployment.yml", ('and on(deployment) (max by (deployment) (loadwatch_node_loading{deployment!=""}) == 1)', ""), "LoadwatchNodeDown"),
    ("failures.yml", ('              (\n                  increase(loadwatch_failures_total{kind!="cuda_oom"}[15m]) > 0', '              (\n                  0 * increase(loadwatch_failures_total{kind!="cuda_oom"}[15m]) > 0'), "LoadwatchLoadFailed"),
    ("pages.yml", ('increase(loadwatch_failures_total{kind!="cuda_oom"}[15m]) > 0', 'increase(loadwatch_failures_total{kind!="cuda_oom"}[1m]) > 0'), "LoadwatchLoadFailed"),
    # the fleet rules leave alone the hosts scraped with no deployment label, and a deployment of one
    ("deployment.yml", ('(count by (deployment) (up{job="loadwatch", deployment!=""}) > 1)', '(count by (deployment) (up{job="loadwatch"}) > 0)'), "LoadwatchNodeStraggler"),
    ("deployment.yml", ('loadwatch_node_ready{deployment!=""} == 1', "loadwatch_node_ready == 1"), "LoadwatchNodeNotReady"),
    ("deployment.yml", ('max by (deployment) (loadwatch_node_loading{deployment!=""})', "max by (deployment) (loadwatch_node_loading)"), "LoadwatchNodeDown"),
]  # fmt: skip


@pytest.mark.parametrize(("test_file", "change", "alert"), MUTANTS, ids=lambda v: str(v)[:40])
def test_unit_tests_catch_a_broken_rule(
    tmp_path: Path, test_file: str, change: tuple[str, str], alert: str
) -> None:
    text = ALERTS.read_text()
    assert text.count(change[0]) == 1, f"mutation target not unique: {change[0]!r}"
    failure = run_tests_against(tmp_path, text.replace(change[0], change[1]), test_file)
    assert "FAILED" in failure and alert in failure


def github_anchor(heading: str) -> str:
    """The id GitHub gives a Markdown heading."""
    slug = heading.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def test_runbook_has_a_section_per_alert() -> None:
    rules = ALERTS.read_text()
    names = alert_names(rules)
    urls = re.findall(r"^\s+runbook_url: (\S+)\s*$", rules, re.M)
    assert len(urls) == len(names)
    runbook = RUNBOOK.read_text()
    sections = re.split(r"^## ", runbook, flags=re.M)[1:]
    by_anchor = {github_anchor(s.splitlines()[0]): s for s in sections}
    for name, url in zip(names, urls, strict=True):
        base, _, anchor = url.partition("#")
        assert base == RUNBOOK_BASE
        assert anchor == name.lower() == github_anchor(name)
        section = by_anchor.get(anchor)
        assert section is not None, f"docs/runbook.md has no section #{anchor}"
        for part in ("**What it means.**", "**What to check.**", "**What to do.**"):
            assert part in section, f"{name}: no {part}"
    assert set(by_anchor) == {n.lower() for n in names}  # no section for a removed alert
    for link in re.findall(r"\]\(#([\w-]+)\)", runbook):
        assert link in by_anchor, f"dangling link #{link}"


def test_runbook_base_url_is_set_in_one_place(tmp_path: Path) -> None:
    """`loadwatch alerts --runbook-base-url` fills every runbook_url, and the output is the same
    rules: promtool checks it and the shipped unit tests pass against it (rewritten URLs)."""
    import sys

    loadwatch = Path(sys.executable).with_name("loadwatch")
    base = "https://wiki.example.com/ops/loadwatch/"
    out = tmp_path / "rules" / "loadwatch.yml"
    out.parent.mkdir()
    r = subprocess.run(
        [str(loadwatch), "alerts", "--runbook-base-url", base, "--rules", str(ALERTS),
         "--output", str(out)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout == r.stderr == "", r.stderr
    text = out.read_text()
    urls = re.findall(r"^\s+runbook_url: (\S+)\s*$", text, re.M)
    assert len(urls) == len(alert_names(text)) >= 14
    assert all(u.startswith("https://wiki.example.com/ops/loadwatch/runbook.md#") for u in urls)
    assert "RUNBOOK_BASE_URL" not in text
    assert text == ALERTS.read_text().replace("RUNBOOK_BASE_URL", base.rstrip("/"))
    check = promtool("check", "rules", str(out))
    assert check.returncode == 0, check.stdout + check.stderr
    # The unit tests, pointed at the rendered rules with the URLs they now expect.
    for test in RULE_TESTS:
        body = test.read_text().replace("../alerts.yml", str(out))
        body = body.replace("../fleet-rules.yml", str(PROMETHEUS / "fleet-rules.yml"))
        (tmp_path / test.name).write_text(body.replace("RUNBOOK_BASE_URL", base.rstrip("/")))
    units = promtool("test", "rules", *(str(tmp_path / t.name) for t in RULE_TESTS))
    assert units.returncode == 0, units.stdout + units.stderr
    carried = subprocess.run(  # no --rules: the rules the install carries
        [str(loadwatch), "alerts", "--runbook-base-url", base],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert carried.returncode == 0 and carried.stdout == text, carried.stderr
    bad = subprocess.run(
        [str(loadwatch), "alerts", "--runbook-base-url", "wiki/loadwatch", "--rules", str(ALERTS)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 64 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert "expected an absolute http://, https:// or file:// URL" in bad.stderr
