"""Supervise mode end to end: the real daemon runs the simulated vLLM (a real process tree)."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
    VllmConfig,
)
from loadwatch.daemon.sim.gpus import SimulatedGpuSource
from loadwatch.daemon.sources.gpu.guard import GuardedGpuSource
from loadwatch.daemon.tools.demo import free_port, make_model_dir
from loadwatch.daemon.tools.patch import patch_model_cli
from tests.daemon.harness import Running, running

pytestmark = pytest.mark.waits
GIB = 1 << 30


def sim_config(
    tmp_path: Path,
    scenario: str,
    *,
    fp8_kv: bool = False,
    speed: float = 200,
    shards: int = 6,
    sim_args: tuple[str, ...] = (),
    **vllm: object,
) -> Config:
    model = make_model_dir(tmp_path, fp8_kv=fp8_kv, shards=shards, total_bytes=shards * 10**9)
    port = free_port()
    argv = (
        sys.executable,
        "-m",
        "loadwatch.daemon.sim.vllm_server",
        "--model",
        str(model),
        "--scenario",
        scenario,
        "--speed",
        str(speed),
        "--port",
        str(port),
        "--tensor-parallel-size",
        "3",
        "--layers",
        "4",
        *sim_args,
    )
    settings: dict[str, object] = dict(
        argv=argv,
        backoff_initial_s=0.2,
        backoff_max_s=0.5,
        crash_loop_starts=3,
        crash_loop_window_s=120.0,
        stop_grace_s=3.0,
        preflight="off",
        health_url=f"http://127.0.0.1:{port}/health",
    )
    settings.update(vllm)
    return Config(
        log=LogConfig(path=tmp_path / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.1),
        forecast=ForecastConfig(stall_factor=3.0, stall_floor_s=1.0),
        vllm=VllmConfig(**settings),  # type: ignore[arg-type]
        state_dir=tmp_path / "state",
    )


def alive(pids: set[int]) -> set[int]:
    """Pids of the set still running (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    out.add(pid)
        except OSError:
            pass
    return out


def tree(d: Running) -> set[int]:
    sup = d.daemon.supervisor  # type: ignore[union-attr]
    return set(sup.tree_pids)


def test_success_ready_health_and_a_clean_stop(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path, "success")
    pids: set[int] = set()
    with running(cfg) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready", 30)
        d.wait(lambda: d.metrics()["loadwatch_vllm_health_up"] == 1.0, "a /health probe", 10)
        m = d.metrics()
        assert m['loadwatch_vllm_state{state="running"}'] == 1.0
        assert m["loadwatch_vllm_health_up"] == 1.0 and m["loadwatch_vllm_starts_total"] == 1.0
        kv = next(w for w in d.status()["session"]["warnings"] if w["code"] == "kv_scale_missing")
        assert kv["verdict"] == "benign", kv["reason"]
        # the server and its tensor-parallel workers (the tree is scanned every 2 s)
        d.wait(lambda: len(tree(d)) >= 3, "the workers in the supervisor's tree", 10)
        pids = tree(d)
    assert d.code == 0
    assert alive(pids) == set(), "no process of the vLLM tree outlives the daemon"
    stopped = [e for e in d.events() if e["event"] == "vllm.stopped"]
    assert stopped and stopped[0]["remaining"] == []


def test_crash_loop_ends_fatal_with_the_root_cause(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path, "crash-loop")
    with running(cfg) as d:
        d.wait(lambda: d.metrics()['loadwatch_vllm_state{state="fatal"}'] == 1.0, "fatal", 40)
        m = d.metrics()
        assert m["loadwatch_vllm_starts_total"] == 3.0
        assert m['loadwatch_failures_total{kind="nccl"}'] == 3.0
        assert m["loadwatch_vllm_restarts_total"] == 2.0
        backoffs = [e for e in d.events() if e["event"] == "vllm.backoff"]
        assert len(backoffs) == 2 and backoffs[1]["backoff_s"] >= backoffs[0]["backoff_s"]
        fatal = [e for e in d.events() if e["event"] == "vllm.fatal"]
        assert (fatal and "3 starts" in fatal[0]["reason"]) or "crash" in fatal[0]["reason"]
        s = d.status()
        assert s["phase"] == "failed" and s["session"]["failure_kind"] == "nccl"
        pids = {p for e in d.events() if e["event"] == "vllm.exited" for p in [e["pid"]]}
    assert alive(pids) == set()


def test_oom_is_predicted_before_it_happens(tmp_path: Path) -> None:
    # slow enough for a few GPU polls per shard: the forecast needs memory readings to fit
    cfg = sim_config(tmp_path, "oom", restart="never", speed=15)
    final = int(96 * GIB * 1.15)

    def gpus(progress):  # type: ignore[no-untyped-def]
        return GuardedGpuSource(
            SimulatedGpuSource(4, progress=progress, final_used_bytes=final), deadline_s=1.0
        )

    with running(cfg, gpu_factory=gpus) as d:
        d.wait(lambda: d.status()["phase"] == "failed", "the OOM", 30)
        s = d.status()
        assert s["session"]["failure_kind"] == "cuda_oom"
        kinds = [
            (e["event"], e.get("forecast"))
            for e in d.events()
            if e["event"].startswith("transition.")
        ]
        raised = kinds.index(("transition.forecast_raised", "oom_predicted"))
        failed = next(i for i, k in enumerate(kinds) if k[0] == "transition.failure")
        assert raised < failed, "the forecast came before the failure"
        m = d.metrics()
        assert m['loadwatch_failures_total{kind="cuda_oom"}'] == 1.0
        d.wait(lambda: d.metrics()['loadwatch_vllm_state{state="exited"}'] == 1.0, "no restart", 10)


def test_workers_ended_after_a_crash_are_no_stop_and_the_failure_stands(tmp_path: Path) -> None:
    """vLLM's main process dies of the OOM before its workers (seen on an H200: a worker's
    `OutOfMemoryError`, then the API server exits, a process of its tree still alive). The
    supervisor ends what is left, said in a `vllm.ending_leftovers` line; that is no stop anybody
    asked for, so the session fails with the root cause the log gave, not "stopped on request"."""
    cfg = sim_config(tmp_path, "oom", restart="never", speed=200, sim_args=("--leave-workers",))
    with running(cfg) as d:
        d.wait(lambda: d.metrics()['loadwatch_vllm_state{state="exited"}'] == 1.0, "the exit", 30)
        d.wait(lambda: d.status()["phase"] == "failed", "the failure", 10)
        s = d.status()
        assert s["session"]["failure_kind"] == "cuda_oom"
        names = [e["event"] for e in d.events()]
        assert "vllm.ending_leftovers" in names and "vllm.stopping" not in names
        reasons = [
            e.get("reason") or ""
            for e in d.events()
            if e["event"] == "transition.phase" and e.get("phase_to") in ("failed", "stopped")
        ]
        assert reasons and not any("stopped on request" in r for r in reasons), reasons


def test_an_exit_is_judged_on_the_traceback_it_left_open(tmp_path: Path) -> None:
    """vLLM prints its crash and exits at once: the traceback's last line (the root cause) is
    the log's last word, with no line after it to close it. The exit is judged after the log
    was read to its end and that traceback closed, so the session fails with the root cause,
    not with the echo that opened the crash (`EngineCore failed to start.`). The lines: a real
    vLLM 0.32 CPU start that failed (tests/state/fixtures/vllm-0.32-cpu-kv-too-small.log), up
    to the engine core's exception line."""
    fixture = Path(__file__).parents[1] / "state" / "fixtures" / "vllm-0.32-cpu-kv-too-small.log"
    lines = fixture.read_text().splitlines(keepends=True)
    end = next(i for i, x in enumerate(lines) if "[core.py:1510] ValueError: " in x)
    crash = tmp_path / "crash.log"
    crash.write_text("".join(lines[: end + 1]))
    program = (
        "import sys; sys.stdout.write(open(sys.argv[1]).read()); sys.stdout.flush(); sys.exit(1)"
    )
    cfg = sim_config(tmp_path, "success", restart="never")
    cfg = replace(cfg, vllm=replace(cfg.vllm, argv=(sys.executable, "-c", program, str(crash))))
    with running(cfg) as d:
        d.wait(lambda: d.metrics()['loadwatch_vllm_state{state="exited"}'] == 1.0, "the exit", 30)
        failures = [e for e in d.events() if e["event"] == "transition.failure"]
        assert [e["failure_kind"] for e in failures][:1] == ["kv_cache_too_small"]
        assert d.status()["session"]["failure_kind"] == "kv_cache_too_small"


def test_stall_restart_policy(tmp_path: Path) -> None:
    # enough shards, slow enough, before the stall (at 40%) for the estimator to know a
    # shard's time (it merges segments shorter than half a second)
    cfg = sim_config(
        tmp_path,
        "stall",
        shards=24,
        speed=40,
        stall_policy="restart",
        stall_restart_after_s=1.0,
        crash_loop_starts=5,
    )
    with running(cfg) as d:
        d.wait(lambda: d.metrics()["loadwatch_load_stalls_total"] >= 1.0, "a stall", 30)
        d.wait(
            lambda: d.metrics()["loadwatch_vllm_starts_total"] >= 2.0,
            "a restart after the stall",
            30,
        )
        # The metric comes from the published snapshot; the event log line of the second start
        # may be a moment behind it on a busy machine.
        d.wait(
            lambda: [e["event"] for e in d.events()].count("vllm.started") >= 2,
            "the second start in the event log",
            10,
        )
        ev = [e["event"] for e in d.events()]
        assert "transition.stall_raised" in ev
        first_start = ev.index("vllm.started")
        assert "vllm.started" in ev[first_start + 1 :]


def test_preflight_refuses_fp8_kv_on_sm120_until_patched(tmp_path: Path) -> None:
    cfg = sim_config(tmp_path, "fp8-kv-on-sm120", fp8_kv=True)
    cfg = replace(cfg, vllm=replace(cfg.vllm, preflight="refuse", backoff_initial_s=0.5))  # type: ignore[arg-type]
    model = Path(cfg.vllm.argv[cfg.vllm.argv.index("--model") + 1])  # type: ignore[union-attr]
    with running(cfg) as d:
        d.wait(lambda: any(e["event"] == "preflight" for e in d.events()), "a preflight", 20)
        report = next(e for e in d.events() if e["event"] == "preflight")
        assert report["verdict"] == "will_fail"
        d.wait(
            lambda: d.daemon.supervisor.state in ("backoff", "starting"), "the veto backs off", 10
        )  # type: ignore[union-attr]
        assert not any(e["event"] == "vllm.started" for e in d.events())
        text, code = patch_model_cli(str(model), drop_fp8=True)
        assert code == 0, text
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready once patched", 30)
        kv = next(w for w in d.status()["session"]["warnings"] if w["code"] == "kv_scale_missing")
        assert kv["verdict"] == "benign"
    assert os.path.exists(model / "hf_quant_config.json")


def test_a_stopped_tree_still_listed_for_a_moment_is_no_orphan(tmp_path: Path) -> None:
    # NVML lists a process for a moment after it exits: the check must read the GPUs again
    # after the exit (not reuse the last poll, taken while the tree ran) and wait that out
    cfg = sim_config(tmp_path, "success")
    sims: list[SimulatedGpuSource] = []

    def gpus(progress):  # type: ignore[no-untyped-def]
        sims.append(SimulatedGpuSource(2, progress=progress, exit_linger_s=1.0))
        return GuardedGpuSource(sims[-1], deadline_s=1.0)

    with running(cfg, gpu_factory=gpus) as d:
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready", 30)
        d.wait(lambda: len(tree(d)) >= 3, "the workers in the supervisor's tree", 10)
        pids = sorted(tree(d))
        for i, pid in enumerate(pids):
            sims[0].hold(i % 2, pid, 40 * GIB)
        polls = sims[0].polls
        d.wait(lambda: sims[0].polls >= polls + 2, "GPU polls listing the tree", 10)
    assert alive(set(pids)) == set()
    checks = [e for e in d.events() if e["event"] == "gpu.orphans"]
    assert len(checks) == 1, checks
    assert checks[0]["leaked"] == 0 and checks[0]["unknown"] == 0, checks[0]
    assert checks[0]["waited_s"] >= 0.9, "the exited tree stayed listed for the linger"
    assert checks[0]["summary"] == "no process holds GPU memory"
