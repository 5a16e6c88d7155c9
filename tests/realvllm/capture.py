"""Re-record the real vLLM 0.32 logs under tests/fixtures/ (``real-v0.32-*.log``).

Run it with any python 3.11+; it builds the tiny models with the vLLM environment's python (which
has ``tokenizers``) and runs the server from there, one scenario at a time (each one is CPU-heavy):

    python tests/realvllm/capture.py                 # every scenario
    python tests/realvllm/capture.py llama kv-too-small --out /tmp/logs

Paths are fixed (models under ``--root``, default /tmp/lw-real, port 8321) so that the paths and
URLs inside the logs stay the same from one recording to the next; pids and times still change.
A JSON summary per scenario (timings, exit code, peak RSS, the completion) goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import urllib.error
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

if __package__:
    from .vllmproc import ServerSpec, VllmServer, vllm_python
else:  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vllmproc import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        ServerSpec,
        VllmServer,
        vllm_python,
    )

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
PORT = 8321
PROMPT = "The model loads weights from shards"
HEALTH_DEADLINE_S = 600.0
SELF_EXIT_WAIT_S = 120.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    log_name: str
    model: str  # a key of MODELS
    expect: str  # "serve" or "fail"
    kv_cache_space_gib: int | None = 1
    extra_args: tuple[str, ...] = ()
    request: bool = False


# name -> tinymodel.py arguments
MODELS: dict[str, tuple[str, ...]] = {
    "deepseek-kvscales": ("--kv-scales",),
    "deepseek-fp8kv": ("--kv-scales", "--fp8-kv-decl"),
    "llama": ("--arch", "llama", "--shards", "4", "--shard-mb", "25"),
}

LOG_REQUESTS = ("--enable-log-requests", "--enable-log-outputs")

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "deepseek-kvscales",
            "real-v0.32-deepseek-kvscales.log",
            "deepseek-kvscales",
            "serve",
            extra_args=LOG_REQUESTS,
            request=True,
        ),
        Scenario(
            "kv-too-small",
            "real-v0.32-kv-too-small.log",
            "deepseek-kvscales",
            "fail",
            kv_cache_space_gib=None,
            extra_args=("--kv-cache-memory-bytes", "1000000"),
        ),
        Scenario("llama", "real-v0.32-llama.log", "llama", "serve"),
        Scenario(
            "deepseek-fp8kv",
            "real-v0.32-deepseek-fp8kv.log",
            "deepseek-fp8kv",
            "serve",
            extra_args=LOG_REQUESTS,
            request=True,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    log: str
    log_bytes: int
    build_s: float
    healthy: bool
    health_s: float | None
    exit_code: int | None
    exited_on_its_own: bool
    exit_s: float | None  # start to exit, when it exited on its own
    peak_rss_total_bytes: int | None
    peak_rss_largest_process_bytes: int | None
    completion_status: int | None
    completion_text: str | None


def build(python: Path, root: Path, model: str) -> tuple[Path, float]:
    out = root / "models" / model
    t0 = time.perf_counter()
    subprocess.run(
        [str(python), str(HERE / "tinymodel.py"), str(out), *MODELS[model]],
        stdin=subprocess.DEVNULL,
        check=True,
    )
    return out, time.perf_counter() - t0


def run(
    scenario: Scenario, model_dir: Path, root: Path, log: Path, build_s: float, port: int = PORT
) -> Outcome:
    work = root / "work" / scenario.name
    shutil.rmtree(work, ignore_errors=True)
    spec = ServerSpec(
        model=model_dir,
        work_dir=work,
        port=port,
        kv_cache_space_gib=scenario.kv_cache_space_gib,
        extra_args=scenario.extra_args,
    )
    text: str | None = None
    status: int | None = None
    with VllmServer(spec, log) as server:
        server.start()
        health = server.wait_healthy(HEALTH_DEADLINE_S)
        on_its_own = health.exit_code is not None
        code = health.exit_code
        exit_s = health.elapsed_s if on_its_own else None
        if health.healthy and scenario.request:
            try:
                answer = server.complete(PROMPT, max_tokens=4)
                status = 200
                choices = answer.get("choices")
                if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                    text = str(choices[0].get("text"))
            except urllib.error.HTTPError as exc:
                status = exc.code
            if status != 200:
                # The engine died under the request: the server shuts itself down.
                code = server.wait_exit(SELF_EXIT_WAIT_S)
                on_its_own = code is not None
                exit_s = server.elapsed_s() if on_its_own else None
            else:
                time.sleep(1.0)  # let the request's log lines land before the stop
        if code is None:
            code = server.stop()
        else:
            server.stop()  # the main process is gone; make sure nothing else is left
    peak = server.rss_peak
    return Outcome(
        scenario=scenario.name,
        log=str(log),
        log_bytes=log.stat().st_size,
        build_s=round(build_s, 2),
        healthy=health.healthy,
        health_s=round(health.elapsed_s, 1) if health.healthy else None,
        exit_code=code,
        exited_on_its_own=on_its_own,
        exit_s=round(exit_s, 1) if exit_s is not None else None,
        peak_rss_total_bytes=peak.total_bytes if peak else None,
        peak_rss_largest_process_bytes=peak.largest_process_bytes if peak else None,
        completion_status=status,
        completion_text=text,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Re-record the real vLLM log fixtures.")
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=", ".join(SCENARIOS))
    p.add_argument("--root", type=Path, default=Path("/tmp/lw-real"))
    p.add_argument("--out", type=Path, default=FIXTURES)
    p.add_argument("--port", type=int, default=PORT)
    a = p.parse_args(argv)
    names: list[str] = a.scenarios or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    python = vllm_python()
    if not python.is_file():
        print(
            f"capture: no vLLM environment at {python} (run scripts/ensure-vllm.sh)",
            file=sys.stderr,
        )
        return 1
    built: dict[str, tuple[Path, float]] = {}
    failed = False
    for name in names:
        sc = SCENARIOS[name]
        if sc.model not in built:
            built[sc.model] = build(python, a.root, sc.model)
        model_dir, build_s = built[sc.model]
        outcome = run(sc, model_dir, a.root, a.out / sc.log_name, build_s, a.port)
        print(json.dumps(asdict(outcome)), flush=True)
        check: Callable[[Outcome], bool] = (
            (lambda o: o.healthy) if sc.expect == "serve" else (lambda o: o.exited_on_its_own)
        )
        if not check(outcome):
            print(f"capture: {name}: expected to {sc.expect}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
