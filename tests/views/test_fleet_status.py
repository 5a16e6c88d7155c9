"""`loadwatch status --url A --url B ...`: a line per node of a deployment, from real daemons
following the two real logs of one two-node PP deployment, and a node that does not answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadwatch.daemon.config import Config, GpuConfig, HttpConfig, LogConfig
from loadwatch.daemon.tools.demo import free_port
from tests.daemon.harness import running

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def watching(tmp: Path, fixture: str) -> Config:
    tmp.mkdir()
    log = tmp / "vllm.log"
    log.write_bytes((FIXTURES / fixture).read_bytes())
    return Config(
        log=LogConfig(path=log, poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        state_dir=tmp / "state",
    )


def status(*args: str) -> subprocess.CompletedProcess[str]:
    loadwatch = Path(sys.executable).with_name("loadwatch")
    return subprocess.run(
        [str(loadwatch), "status", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_one_line_per_node(tmp_path: Path) -> None:
    with (
        running(watching(tmp_path / "head", "real-v0.32-pp2-head.log")) as head,
        running(watching(tmp_path / "node1", "real-v0.32-pp2-node1.log")) as node1,
    ):
        for d in (head, node1):
            d.wait(lambda d=d: d.get("/status")[0] == 200 and d.status()["node"]["role"]["ranks"], "the log read")  # type: ignore[misc]  # fmt: skip
        gone = f"127.0.0.1:{free_port()}"
        r = status("--url", head.url, "--url", node1.url, "--url", gone)
        assert r.returncode == 69, r.stderr  # one node did not answer
        lines = r.stdout.splitlines()
        assert lines[0].split()[:3] == ["node", "role", "rank"]
        head_line, node_line, gone_line, summary = lines[1:]
        assert head_line.split()[1:4] == ["head", "0", "0"]
        assert node_line.split()[1:4] == ["headless_tp_pp", "-", "1"]
        assert "100.0%" in node_line  # its own 'Loading weights took'
        assert gone_line.startswith(gone) and "unreachable" in gone_line
        assert summary.startswith("3 nodes, 2 answering")
        j = status("--json", "--url", head.url, "--url", node1.url)
        assert j.returncode == 0
        docs = json.loads(j.stdout)
        roles = [d["status"]["node"]["role"]["role"] for d in docs]
        assert roles == ["head", "headless_tp_pp"]
