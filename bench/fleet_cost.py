"""What a fleet of loadwatch nodes costs Prometheus: series per node, scrape bytes, rule evaluation.

    .venv/bin/python bench/fleet_cost.py [--nodes 64] [--gpus 8]

1. One real daemon (`loadwatch run`, simulated GPUs) supervises the simulated vLLM loading a
   Kimi-K2.5-shaped checkpoint with TP=`--gpus`; at half way its /metrics is fetched: bytes,
   series, and the series that are per GPU (so a node of G GPUs is fixed + G x per-GPU).
2. A real Prometheus scrapes that exposition from `--nodes` loopback targets (one HTTP server
   each, all one `deployment`), with alerts.yml and fleet-rules.yml, then from 1 target, every
   second; its rules API (`evaluationTime`, what `prometheus_rule_group_last_duration_seconds`
   exports) gives each group's evaluation time, median over the run, side by side for 1 and N.
The last line is key=value pairs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadwatch.daemon.tools.demo import free_port, make_model_dir  # noqa: E402
from tests.ops.promserver import PromServer  # noqa: E402

PROM = ROOT / "prometheus"


def daemon_exposition(tmp: Path, gpus: int) -> bytes:
    model = make_model_dir(tmp, fp8_kv=False)
    port, vport = free_port(), free_port()
    loadwatch = Path(sys.executable).with_name("loadwatch")
    argv = [
        str(loadwatch), "run", "--log", str(tmp / "vllm.log"), "--state-dir", str(tmp / "st"),
        "--listen", f"127.0.0.1:{port}", "--gpu", "simulated", "--model-dir", str(model), "--",
        sys.executable, "-m", "loadwatch.daemon.sim.vllm_server", "--model", str(model),
        "--speed", "15", "--port", str(vport), "--tensor-parallel-size", str(gpus),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                    doc = json.load(r)
            except OSError:
                continue
            ratio = ((doc.get("session") or {}).get("progress") or {}).get("ratio")
            if ratio is not None and ratio >= 0.5:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return bytes(r.read())
        raise SystemExit("fleet_cost: the load did not reach half way in 120 s")
    finally:
        proc.terminate()
        proc.wait(30)


def serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class Labelled(PromServer):
    def config(self) -> dict[str, Any]:
        cfg = super().config()
        for sc in cfg["scrape_configs"]:
            for group in sc["static_configs"]:
                group["labels"] = {"deployment": "d1"}
        return cfg


def rule_cost(tmp: Path, body: bytes, nodes: int, wait_s: float) -> dict[str, float]:
    servers = [serve(body) for _ in range(nodes)]
    targets = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    (tmp / "prom").mkdir(parents=True)
    rules = [PROM / "alerts.yml", PROM / "fleet-rules.yml"]
    out: dict[str, list[float]] = {}
    try:
        with Labelled(tmp / "prom", targets=targets, rule_files=rules) as prom:
            prom.wait_scraped(timeout_s=60, scrapes=2)
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                time.sleep(1.0)
                for group in prom.rules():  # /api/v1/rules: each group's last evaluation
                    out.setdefault(group["name"], []).append(float(group["evaluationTime"]))
            series = prom.query("sum(scrape_samples_scraped)")
            total = series[0].value if series else 0.0
    finally:
        for s in servers:
            s.shutdown()
    cost = {group: statistics.median(v) for group, v in out.items()}
    cost["_samples_scraped"] = total
    return cost


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15.0, help="rule evaluations sampled")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="loadwatch-fleet-") as d:
        tmp = Path(d)
        body = daemon_exposition(tmp / "daemon", args.gpus)
        lines = [x for x in body.decode().splitlines() if x and not x.startswith("#")]
        per_gpu = [x for x in lines if 'gpu="' in x]
        node_series = [x for x in lines if x.startswith("loadwatch_node_")]
        fixed = len(lines) - len(per_gpu)
        print(
            f"one node, {args.gpus} GPUs: {len(lines)} series ({fixed} fixed + "
            f"{len(per_gpu) / args.gpus:.0f} per GPU x {args.gpus}; {len(node_series)} of them "
            f"loadwatch_node_*), {len(body)} bytes per scrape"
        )
        one = rule_cost(tmp / "one", body, 1, args.seconds)
        many = rule_cost(tmp / "many", body, args.nodes, args.seconds)
    print(f"{'rule group':<30} {'1 node ms':>10} {f'{args.nodes} nodes ms':>12}")
    for group in sorted(k for k in many if not k.startswith("_")):
        print(f"{group:<30} {1e3 * one.get(group, 0.0):>10.3f} {1e3 * many[group]:>12.3f}")
    total_one = sum(v for k, v in one.items() if not k.startswith("_"))
    total_many = sum(v for k, v in many.items() if not k.startswith("_"))
    deploy_many = many.get("loadwatch.deployment", 0.0) + many.get(
        "loadwatch.deployment.records", 0.0
    )
    print(
        f"series_per_node={len(lines)} series_fixed={fixed} "
        f"series_per_gpu={len(per_gpu) / args.gpus:.0f} scrape_bytes_per_node={len(body)} "
        f"series_{args.nodes}x{args.gpus}={int(many['_samples_scraped'])} "
        f"scrape_bytes_{args.nodes}_nodes={len(body) * args.nodes} "
        f"rules_ms_1_node={1e3 * total_one:.2f} rules_ms_{args.nodes}_nodes={1e3 * total_many:.2f} "
        f"deployment_rules_ms_{args.nodes}_nodes={1e3 * deploy_many:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
