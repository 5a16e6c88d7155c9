"""The Kubernetes manifests, against the Kubernetes schemas (kubernetes-validate, offline), and
against each other and loadwatch's own config."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from loadwatch.daemon.config import parse_config

from .common import ROOT

K8S = ROOT / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())  # the oldest supported, the newest
OPERATOR = "monitoring.coreos.com/v1"  # the Prometheus Operator's CRDs: no schema shipped


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def every_doc() -> list[tuple[str, dict[str, Any]]]:
    """Every object the Kubernetes schemas cover (the operator's monitors are checked below)."""
    return [
        (f"{p.name}:{d['kind']}", d)
        for p in MANIFESTS
        for d in docs(p)
        if d["apiVersion"] != OPERATOR
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), every_doc(), ids=[n for n, _ in every_doc()])
def test_every_manifest_passes_the_kubernetes_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validation_catches_a_broken_manifest() -> None:
    (deployment,) = [d for p in MANIFESTS for d in docs(p) if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenessProbe"]["httpGet"]["pth"] = "/livez"  # a typo strict mode rejects
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)
    del container["livenessProbe"]["httpGet"]["pth"]
    container["resources"]["limits"]["nvidia.com/gpu"] = [8]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def _pod() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    objs = {d["kind"]: d for p in MANIFESTS for d in docs(p)}
    return objs["Deployment"], objs["ConfigMap"], objs


def test_the_probes_point_at_loadwatch_and_its_config_agrees() -> None:
    deployment, configmap, objs = _pod()
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    cfg = parse_config(tomllib.loads(configmap["data"]["loadwatch.toml"]))
    assert cfg.supervise and cfg.http.port == ports["metrics"] and cfg.http.host == "0.0.0.0"
    assert container["startupProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert cfg.vllm is not None and "8000" in cfg.vllm.argv and ports["http"] == 8000
    assert cfg.vllm.output == "file+stdout"  # `kubectl logs` shows vLLM's log, as users expect
    # the kubelet waits for loadwatch to stop vLLM in order before it kills
    assert spec["terminationGracePeriodSeconds"] >= cfg.vllm.stop_grace_s + 10
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert cfg.state_dir == Path(mounts["state"]) and cfg.log.path is not None
    assert cfg.log.path.parent == cfg.state_dir
    assert container["args"] == ["run", "--config", f"{mounts['config']}/loadwatch.toml"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert objs["Service"]["spec"]["selector"] == labels
    assert {p["targetPort"] for p in objs["Service"]["spec"]["ports"]} == set(ports)


def test_the_monitors_select_the_pod_and_its_metrics_port() -> None:
    deployment, _, objs = _pod()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pm = objs["PodMonitor"]["spec"]
    assert pm["selector"]["matchLabels"].items() <= labels.items()
    assert [e["port"] for e in pm["podMetricsEndpoints"]] == ["metrics"]
    sm = objs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"].items() <= objs["Service"]["metadata"]["labels"].items()
    assert [e["port"] for e in sm["endpoints"]] == ["metrics"]
    for monitor in (objs["PodMonitor"], objs["ServiceMonitor"]):
        assert monitor["apiVersion"] == OPERATOR and set(monitor) == {
            "apiVersion", "kind", "metadata", "spec",
        }  # fmt: skip


def test_the_containerfile_runs_loadwatch_under_tini_from_the_readme_venv() -> None:
    text = (K8S / "Containerfile").read_text(encoding="utf-8")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"COPY dist/loadwatch-{version}-py3-none-any.whl" in text
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/opt/loadwatch/bin/loadwatch"]' in text
    assert 'CMD ["run", "--config", "/etc/loadwatch/loadwatch.toml"]' in text
    # a comment only at the start of a line: after an instruction it would be its argument
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert " #" not in line, line
