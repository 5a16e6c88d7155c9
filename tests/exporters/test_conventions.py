"""/metrics and / at the conventions of the exporters beside loadwatch: GPU labels that join
dcgm-exporter's (`gpu`, `UUID`), a `loadwatch_vllm_info` that joins vLLM's own series, counters
rather than rate gauges, `process_*` for both processes, and a landing page at `/`. Served by the
real HTTP process from boards rendered from a real fold."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadwatch.daemon.config import HttpConfig
from loadwatch.exporters.http.process import HttpProcess
from loadwatch.exporters.http.routes import BoardMaker
from tests.helpers import wait_for
from tests.views.test_status import mid_load, published


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, float]]:
    state, now, _ = mid_load(gpus=2)
    board = BoardMaker(lambda: now).make(published(state, now))
    proc = HttpProcess(HttpConfig(port=0))
    url = proc.start()
    proc.send(board)
    wait_for(lambda: get(url + "/status")[0] == 200, "the board at the server's process", 10)
    yield url, now
    proc.stop()


def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def families(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    _, _, text = get(url + "/metrics")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_gpu_series_carry_the_labels_dcgm_exporter_uses(served: tuple[str, float]) -> None:
    fams = families(served[0])
    for name in ("loadwatch_gpu_memory_used_bytes", "loadwatch_gpu_up", "loadwatch_gpu_info"):
        assert fams[name], name
        for labels, _ in fams[name]:
            assert {"gpu", "UUID"} <= set(labels) and "uuid" not in labels, (name, labels)
            assert labels["UUID"].startswith("GPU-"), labels


def test_vllm_info_names_the_model_and_version(served: tuple[str, float]) -> None:
    [(labels, value)] = families(served[0])["loadwatch_vllm_info"]
    assert value == 1.0
    assert labels["version"] == "0.15.1"  # what the log's engine line said
    assert labels["model_name"] and set(labels) == {"model_name", "served_model_name", "version"}


def test_progress_is_counted_not_rated(served: tuple[str, float]) -> None:
    fams = families(served[0])
    assert "loadwatch_load_rate" not in fams
    [(_, shards)] = fams["loadwatch_load_shards_loaded_total"]
    [(_, done)] = fams["loadwatch_load_shards_done"]
    assert shards == done == 60
    [(_, loaded)] = fams["loadwatch_load_bytes_total"]
    assert loaded == 60 * 5 * 2**30


def test_process_metrics_for_the_daemon_and_the_http_process(served: tuple[str, float]) -> None:
    fams = families(served[0])
    for prefix in ("process_", "loadwatch_http_process_"):
        for name in ("cpu_seconds_total", "resident_memory_bytes", "open_fds"):
            [(_, value)] = fams[prefix + name]
            assert value > 0, prefix + name
    # Two processes: the board was rendered here, the page served by a child.
    [(_, here)] = fams["process_start_time_seconds"]
    [(_, child)] = fams["loadwatch_http_process_start_time_seconds"]
    assert child >= here


def test_landing_page_links_every_endpoint(served: tuple[str, float]) -> None:
    status, ctype, body = get(served[0] + "/")
    assert status == 200 and ctype.startswith("text/html")
    for path in ("metrics", "status", "healthz", "readyz"):
        assert f'href="{path}' in body
