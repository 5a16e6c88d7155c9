"""loadwatch end to end against real vLLM 0.32 on the CPU.

One tiny DeepSeek-V3-style checkpoint (MLA + MoE, the family of Kimi-K2.5) is built once for the
module: 12 safetensors shards of about 100 MB, `k_scale`/`v_scale` in every layer, a locally
trained tokenizer and an `hf_quant_config.json` that declares an FP8 KV cache. Each test works on
its own hard-linked copy of it (patch-model replaces files by rename, so copies stay apart, and a
command line naming one copy is told apart from the others). `loadwatch run` runs as a subprocess
supervising `python -m vllm.entrypoints.openai.api_server --model DIR --enforce-eager ...`:

1. preflight reports the FP8 KV declaration; patch-model drops it; --revert restores the bytes;
2. the patched model loads: shard progress with bytes, the scale warnings judged benign, the
   milestones in order, phase `ready`, `/readyz` 200, a completion answered by vLLM, `/metrics`
   and the event log showing all of it;
3. a start that cannot fit its KV cache: `kv_cache_too_small` from the real traceback, a restart
   after the backoff, `fatal` at the crash-loop limit, no vLLM process left;
4. SIGTERM to loadwatch (the daemon of test 2): vLLM and every process it spawned end within the
   grace period.

vLLM must be installed (`make vllm`, scripts/ensure-vllm.sh): without it these tests fail, they
are never skipped. Each vLLM start takes one to two and a half minutes on this 2-core machine
(three processes import torch in turn).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.realdaemon import DaemonProc, kill_leftovers, leftovers, supervise_config
from tests.helpers import records
from tests.realvllm.vllmproc import ServerSpec, free_port, server_argv, server_env, vllm_python

# Each test may wait on vLLM starts of a minute or more; the module fixtures count towards the
# first test that uses them.
pytestmark = [pytest.mark.realvllm, pytest.mark.slow, pytest.mark.timeout(900)]

TINYMODEL = Path(__file__).resolve().parent.parent / "realvllm" / "tinymodel.py"
SHARDS = 12
LAYERS = 12
QUANT = "hf_quant_config.json"
PROMPT = "The model loads weights from shards"
READY_TIMEOUT_S = 400.0
FATAL_TIMEOUT_S = 500.0
STOP_GRACE_S = 30.0
BACKOFF_S = 1.0
# Where to copy the vLLM logs these runs write (to compare with the recorded fixtures).
KEEP_LOGS = os.environ.get("LOADWATCH_E2E_KEEP_LOGS")


# -- the checkpoint -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    path: Path
    shard_names: tuple[str, ...]  # in the index's order
    shard_sizes: tuple[int, ...]
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256, every file

    @property
    def total_bytes(self) -> int:
        return sum(self.shard_sizes)


def _digests(d: Path) -> dict[str, str]:
    out = {}
    for p in sorted(d.iterdir()):
        h = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        out[p.name] = h.hexdigest()
    return out


def _small_files(d: Path) -> dict[str, bytes]:
    """Every file but the weights, byte for byte."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix != ".safetensors"}


def _vllm_installed(python: Path) -> bool:
    """The environment exists and holds vllm (found without importing it: that takes 15 s)."""
    if not python.is_file():
        return False
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u, sys; sys.exit(not u.find_spec('vllm'))"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    python = vllm_python()
    if not _vllm_installed(python):
        pytest.fail(
            f"vLLM is not installed at {python.parent.parent}: run `make vllm` "
            "(scripts/ensure-vllm.sh) first; these tests need real vLLM and are never skipped",
            pytrace=False,
        )
    out = tmp_path_factory.mktemp("e2e") / "models" / "original"
    done = subprocess.run(
        [str(python), str(TINYMODEL), str(out), "--kv-scales", "--fp8-kv-decl"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    names = tuple(sorted(set(index["weight_map"].values())))
    assert len(names) == SHARDS
    sizes = tuple((out / n).stat().st_size for n in names)
    # about 100 MB each
    assert all(80_000_000 < s < 130_000_000 for s in sizes), sizes
    return Built(out, names, sizes, _digests(out))


def link_copy(src: Path, dst: Path) -> Path:
    """A copy of a model directory made of hard links (no bytes copied)."""
    dst.mkdir(parents=True)
    for p in src.iterdir():
        os.link(p, dst / p.name)
    return dst


def loadwatch(*args: str) -> subprocess.CompletedProcess[str]:
    """The `loadwatch` command line, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def preflight_json(model: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    run = loadwatch("preflight", str(model), "--json", *extra)
    assert run.stdout.startswith("{"), run.stdout + run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return run.returncode, doc


def patch(model: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return loadwatch("patch-model", str(model), *flags)


# -- 1. preflight and patch -----------------------------------------------------------------------


def check_of(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in doc["checks"] if c["name"] == name)
    return found


def test_preflight_reports_the_fp8_declaration_and_patch_model_drops_and_restores_it(
    built: Built, tmp_path: Path
) -> None:
    model = link_copy(built.path, tmp_path / "model-patch-cycle")
    before = _small_files(model)

    # This machine has no GPU: the attention backend is not judged, the FP8 declaration is.
    code, doc = preflight_json(model)
    assert doc["verdict"] == "warnings" and code == doc["exit_code"]
    assert doc["model"]["checkpoint_kv_dtype"] == "fp8"
    assert doc["model"]["kv_sources"] == ["hf_quant_config.json:quantization.kv_cache_quant_algo"]
    assert doc["attention"] == "mla"
    assert doc["kv_cache_dtype"] == "fp8_e4m3" and doc["kv_cache_quantized"] is True
    assert doc["shard_count"] == SHARDS and doc["total_bytes"] == built.total_bytes
    assert doc["scale_warnings_benign"] is False
    assert check_of(doc, "attention_backend")["status"] == "warn"
    # On an SM120 GPU the same checkpoint cannot start, and the fix names patch-model.
    code_sm120, sm120 = preflight_json(model, "--gpu-cc", "12.0")
    assert sm120["verdict"] == "will_fail" and code_sm120 != 0
    assert "--drop-fp8-kv-cache" in sm120["fix"]
    text = loadwatch("preflight", str(model), "--gpu-cc", "12.0").stdout
    assert "fp8_e4m3, from checkpoint, hf_quant_config.json" in text, text
    assert f"fix: loadwatch patch-model {model} --drop-fp8-kv-cache" in text, text

    dropped = patch(model, "--drop-fp8-kv-cache")
    assert dropped.returncode == 0, dropped.stderr
    assert "removed quantization.kv_cache_quant_algo" in dropped.stdout
    quant = json.loads((model / QUANT).read_text())
    assert "kv_cache_quant_algo" not in quant["quantization"]
    # nothing but the declaration changed; the original is kept beside it
    assert (model / (QUANT + ".loadwatch-orig")).read_bytes() == before[QUANT]
    after = _small_files(model)
    assert {n: b for n, b in after.items() if n not in (QUANT, QUANT + ".loadwatch-orig")} == {
        n: b for n, b in before.items() if n != QUANT
    }

    code, doc = preflight_json(model)
    assert code == doc["exit_code"]
    assert doc["model"]["checkpoint_kv_dtype"] is None
    assert doc["kv_cache_dtype"] == "auto" and doc["kv_cache_quantized"] is False
    assert doc["scale_warnings_benign"] is True
    code_sm120, sm120 = preflight_json(model, "--gpu-cc", "12.0")
    assert sm120["verdict"] == "ok" and code_sm120 == 0

    reverted = patch(model, "--revert")
    assert reverted.returncode == 0, reverted.stderr
    assert _small_files(model) == before
    assert _digests(model) == built.files


# -- a daemon supervising real vLLM ---------------------------------------------------------------


@dataclass
class Sample:
    at: float
    phase: str | None
    shards_done: int | None
    bytes_done: int | None
    bytes_total: int | None


@dataclass
class Serving:
    daemon: DaemonProc
    model: Path
    spec: ServerSpec
    built: Built
    ready_s: float
    samples: list[Sample]
    completion: dict[str, Any]
    completion_s: float


def _keep_views(daemon: DaemonProc, name: str) -> None:
    """With LOADWATCH_E2E_KEEP_LOGS set: the daemon's /status and /metrics as they are now."""
    if KEEP_LOGS and daemon.poll() is None:
        keep = Path(KEEP_LOGS)
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{name}.status.json").write_text(json.dumps(daemon.status(), indent=1))
        (keep / f"{name}.metrics.txt").write_bytes(daemon.get("/metrics")[1])


def _keep_log(daemon: DaemonProc, name: str) -> None:
    """With LOADWATCH_E2E_KEEP_LOGS set: the vLLM log and the event log of a run."""
    if KEEP_LOGS:
        keep = Path(KEEP_LOGS)
        keep.mkdir(parents=True, exist_ok=True)
        for p in daemon.work.glob("vllm.log*"):
            shutil.copyfile(p, keep / f"{name}{p.name.removeprefix('vllm.log')}.log")
        if daemon.events_path.exists():
            shutil.copyfile(daemon.events_path, keep / f"{name}.events.jsonl")


def _at(event: dict[str, Any]) -> float:
    """When the daemon wrote an event-log line (its ISO time, UTC)."""
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def _tree_pids(daemon: DaemonProc) -> list[int]:
    pids: set[int] = set()
    for e in daemon.events():
        if e.get("event") in ("vllm.exited", "vllm.stopped"):
            pids.update(e.get("tree_pids") or ())
    return sorted(pids)


def _sample_status(daemon: DaemonProc, until: threading.Event, out: list[Sample]) -> None:
    """Read /status through the load, as a dashboard would."""
    while not until.is_set():
        try:
            doc = daemon.status()
        except (OSError, AssertionError, ValueError):
            doc = {}
        s = doc.get("session") or {}
        p = s.get("progress") or {}
        if s:
            out.append(
                Sample(
                    time.monotonic(),
                    s.get("phase"),
                    p.get("shards_done"),
                    p.get("bytes_done"),
                    p.get("bytes_total"),
                )
            )
        until.wait(0.1)


def _complete(spec: ServerSpec) -> dict[str, Any]:
    body = json.dumps(
        {"model": str(spec.model), "prompt": PROMPT, "max_tokens": 4, "temperature": 0.0}
    ).encode()
    req = urllib.request.Request(
        spec.base_url + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def _start(work: Path, spec: ServerSpec, **vllm: object) -> DaemonProc:
    work.mkdir(parents=True, exist_ok=True)
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        Path(server_env(spec)[key]).mkdir(parents=True, exist_ok=True)
    config = supervise_config(work, server_argv(spec), server_env(spec), **vllm)
    daemon = DaemonProc(config, work)
    daemon.start()
    return daemon


@pytest.fixture(scope="module")
def patched_model(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy with the FP8 KV declaration dropped by `loadwatch patch-model` (reverted after)."""
    model = link_copy(built.path, tmp_path_factory.mktemp("serve") / "model-serve")
    run = patch(model, "--drop-fp8-kv-cache")
    assert run.returncode == 0, run.stderr
    yield model
    run = patch(model, "--revert")
    assert run.returncode == 0, run.stderr
    assert _digests(model) == built.files  # byte for byte after a real load from it


@dataclass
class FailingRun:
    daemon: DaemonProc
    model: Path
    started: float  # monotonic


FAILING_TEST = "test_kv_cache_too_small_restarts_with_backoff_then_fatal"


@pytest.fixture(scope="module")
def failing_run(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FailingRun]:
    """`loadwatch run` supervising a start that cannot fit its KV cache: two starts, then fatal."""
    model = link_copy(built.path, tmp_path_factory.mktemp("fail") / "model-kv-too-small")
    run = patch(model, "--drop-fp8-kv-cache")
    assert run.returncode == 0, run.stderr
    work = tmp_path_factory.mktemp("run-fail")
    spec = ServerSpec(
        model=model,
        work_dir=work / "vllm",
        port=free_port(),
        kv_cache_space_gib=None,
        extra_args=("--kv-cache-memory-bytes", "1000000"),
    )
    started = time.monotonic()
    daemon = _start(
        work,
        spec,
        restart="on-failure",
        backoff_initial_s=BACKOFF_S,
        crash_loop_starts=2,
        stop_grace_s=STOP_GRACE_S,
    )
    try:
        yield FailingRun(daemon, model, started)
    finally:
        if daemon.poll() is None:
            daemon.terminate(STOP_GRACE_S + 30)
        daemon.kill()
        kill_leftovers(_tree_pids(daemon), str(model))
        _keep_log(daemon, "kv-too-small")


def _selected(request: pytest.FixtureRequest, name: str) -> bool:
    return any(getattr(item, "originalname", item.name) == name for item in request.session.items)


@pytest.fixture(scope="module")
def serving(
    built: Built,
    patched_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Serving]:
    """`loadwatch run` supervising vLLM on the patched model, until vLLM answers a request."""
    if _selected(request, FAILING_TEST):
        # Most of a vLLM start is one process importing torch on one core, and the failing
        # run needs two starts in a row: begin it now, so it overlaps this load on the second
        # core (measured here: 271 s for both overlapped against 327 s one after the other).
        request.getfixturevalue("failing_run")
    work = tmp_path_factory.mktemp("run-serve")
    spec = ServerSpec(model=patched_model, work_dir=work / "vllm", port=free_port())
    daemon = _start(
        work,
        spec,
        restart="on-failure",
        backoff_initial_s=BACKOFF_S,
        crash_loop_starts=2,
        stop_grace_s=STOP_GRACE_S,
        preflight="warn",
    )
    samples: list[Sample] = []
    done = threading.Event()
    sampler = threading.Thread(target=_sample_status, args=(daemon, done, samples), daemon=True)
    sampler.start()
    try:
        try:
            ready_s = daemon.wait(
                lambda: (
                    daemon.get("/readyz")[0] == 200
                    or daemon.status()["phase"] in ("failed", "stopped")
                ),
                "vLLM ready",
                READY_TIMEOUT_S,
            )
        finally:
            done.set()
            sampler.join()
        t0 = time.monotonic()
        # a load that failed is reported by the test, with the log, not as a request error here
        answer = _complete(spec) if daemon.get("/readyz")[0] == 200 else {}
        completion_s = time.monotonic() - t0
        _keep_views(daemon, "serve")
        yield Serving(daemon, patched_model, spec, built, ready_s, samples, answer, completion_s)
    finally:
        done.set()
        if daemon.poll() is None:
            daemon.terminate(STOP_GRACE_S + 30)
        daemon.kill()
        kill_leftovers(_tree_pids(daemon), str(patched_model))
        _keep_log(daemon, "serve")


# -- 2. the load ----------------------------------------------------------------------------------


def _first_positions(seq: list[str], wanted: list[str]) -> list[int]:
    return [seq.index(w) if w in seq else -1 for w in wanted]


def test_load_to_ready_and_a_real_completion(serving: Serving) -> None:
    d, built = serving.daemon, serving.built

    # A /health 200 can make the session ready while uvicorn's `Application startup complete.`
    # is still in the follower's tick (two sources of one fact, either may come first): what
    # the log says is read once that line is.
    def read_whole(doc: dict[str, Any]) -> bool:
        milestones = (doc["session"] or {}).get("milestones", [])
        return doc["phase"] != "ready" or "app_startup_complete" in {m["kind"] for m in milestones}

    d.wait(lambda: read_whole(d.status()), "the last milestone on /status", 10)
    status = d.status()
    s = status["session"]
    assert status["phase"] == "ready" and status["ready"] is True, (
        s and s["failures"],
        d.vllm_log_tail(),
    )
    assert d.get("/readyz") == (200, b"ready\n")
    assert status["restarts"] == 0 and s["version"] == "0.32.0"
    assert status["model"]["shards"] == SHARDS and status["model"]["checkpoint_kv_dtype"] is None
    assert status["kv_cache"]["quantized"] is False
    assert status["supervisor"]["state"] == "started"  # its last event
    assert s["time_to_ready_s"] is not None and s["time_to_ready_s"] > 1

    # progress: N/12 with the bytes of the shards the index names
    p = s["progress"]
    assert (p["shards_done"], p["shards_total"]) == (SHARDS, SHARDS)
    assert p["bytes_done"] == p["bytes_total"] == built.total_bytes
    prefix = [sum(built.shard_sizes[:n]) for n in range(SHARDS + 1)]
    # what /status showed while vLLM was loading: every step's bytes are its shards' sizes
    seen = [(x.shards_done, x) for x in serving.samples if x.shards_done is not None]
    assert seen, "no /status sample showed shard progress"
    for n, x in seen:
        assert x.bytes_total == built.total_bytes
        assert x.bytes_done == prefix[n], x
    steps = [n for n, _ in seen]
    assert steps == sorted(steps)  # never back
    assert any(0 < n < SHARDS for n in steps), "no step between 0 and 12 seen live"
    # every update of the weights bar that vLLM's log shows, in order (tqdm leaves out an update
    # that comes within 0.1 s of the last one it printed: then a step is not in the log at all)
    bars = [e for e in d.named("log.shard_progress") if e.get("bar") == "weights"]
    shown = [
        int(m.group(1))
        for m in re.finditer(
            rb"Loading safetensors checkpoint shards: +[0-9]+% Completed \| ([0-9]+)/",
            d.vllm_log.read_bytes(),
        )
    ]
    assert [b["done"] for b in bars] == shown, d.vllm_log_tail()
    assert shown[0] == 0 and shown[-1] == SHARDS and shown == sorted(shown)
    assert len(set(shown)) > SHARDS // 2  # most steps (tqdm prints the last again at its close)
    assert {b["total"] for b in bars} == {SHARDS}

    # the k/v scale warnings: one pair per layer, benign because the KV cache is not FP8
    kv = [w for w in s["warnings"] if w["code"] == "kv_scale_missing"]
    assert len(kv) == 1, s["warnings"]
    w = kv[0]
    assert w["verdict"] == "benign", w
    assert w["count"] == 2 * LAYERS and w["layers"] == list(range(LAYERS))
    assert sorted(w["scales"]) == ["k", "v"] and w["processes"]
    assert "fp8" in w["reason"].lower() or "not" in w["reason"].lower(), w["reason"]
    # the event log: each warning's record once (a folded line by the records it lists), two
    # records for every layer, of the scales k and v
    lines = d.events()
    per_layer: Counter[int] = Counter()
    scales: set[str] = set()
    for e in lines:
        if e["event"] == "log.kv_scale_run":
            per_layer.update({layer: n for layer, n in e["layers"]})
            scales.update(e["scales"])
        elif e["event"] == "log.kv_scale_warning":
            per_layer[e["layer"]] += 1
            scales.add(e["scale"])
    assert per_layer == {layer: 2 for layer in range(LAYERS)} and scales == {"k", "v"}
    offsets = [e["offset"] for e in records(lines) if e["event"] == "log.kv_scale_warning"]
    assert len(set(offsets)) == len(offsets) == 2 * LAYERS

    # milestones, in the order vLLM reached them
    kinds = [e["kind"] for e in d.named("log.milestone")]
    order = [
        "version",
        "model_load_start",
        "weights_loaded",
        "kv_cache",
        "engine_init",
        "api_server_start",
        "app_startup_complete",
    ]
    at = _first_positions(kinds, order)
    assert -1 not in at and at == sorted(at), list(zip(order, at, strict=True))

    ms = {m["kind"] for m in s["milestones"]}
    assert set(order) <= ms

    # the event log's transitions: one session, through the phases to ready
    trans = [e for e in d.events() if e["event"].startswith("transition.")]
    assert [e["event"] for e in trans if e["event"] == "transition.session_started"] == [
        "transition.session_started"
    ]
    phases = [e["phase_to"] for e in trans if e["event"] == "transition.phase"]
    assert phases == ["loading_weights", "post_load", "ready"], phases
    assert not [e for e in trans if e["event"] == "transition.failure" and e.get("fatal")]
    started = d.named("vllm.started")
    assert len(started) == 1 and started[0]["pid"] > 0
    pre = d.named("preflight")
    assert len(pre) == 1 and pre[0]["report"]["kv_cache_dtype"] == "auto"

    # a real request, answered by vLLM
    choices = serving.completion["choices"]
    assert isinstance(choices, list) and len(choices) == 1
    assert isinstance(choices[0]["text"], str) and serving.completion["usage"]["completion_tokens"]

    # /metrics shows the same
    m = d.metrics()
    assert m['loadwatch_load_phase{phase="ready"}'] == 1.0 and m["loadwatch_load_ready"] == 1.0
    assert m["loadwatch_load_shards_done"] == m["loadwatch_load_shards"] == SHARDS
    assert m["loadwatch_load_done_bytes"] == m["loadwatch_load_total_bytes"] == built.total_bytes
    assert m["loadwatch_load_progress_ratio"] == 1.0
    assert m['loadwatch_session_warnings{code="kv_scale_missing",verdict="benign"}'] == 2 * LAYERS
    assert m["loadwatch_time_to_ready_seconds"] == pytest.approx(s["time_to_ready_s"], abs=1e-6)
    assert m['loadwatch_vllm_state{state="running"}'] == 1.0
    assert m["loadwatch_vllm_starts_total"] == 1.0
    assert m['loadwatch_source_up{source="vllm"}'] == 1.0
    assert m['loadwatch_source_up{source="log"}'] == 1.0
    # tqdm redraws at most every 0.1 s, so how many of the 12 shards got a record of their own
    # depends on the machine's speed; its first (0/12) and last (12/12) records are always there
    assert m['loadwatch_events_total{type="shard_progress"}'] >= 2
    assert "loadwatch_load_eta_seconds" not in m
    print(
        f"\nready after {serving.ready_s:.1f} s (vLLM's own count {s['time_to_ready_s']:.1f} s, "
        f"weights {s['weights_load_s']}); completion {serving.completion_s:.2f} s; "
        f"{len(seen)} /status samples with shard progress",
        file=sys.stderr,
    )


# -- 4. stop ----------------------------------------------------------------------------------------


def test_sigterm_stops_vllm_and_every_process_it_spawned(serving: Serving) -> None:
    d = serving.daemon
    code, took = d.terminate(STOP_GRACE_S + 30)
    ended = time.time()
    assert code == 0, d.stderr_tail()
    assert took < STOP_GRACE_S, f"stopping took {took:.1f} s, more than the {STOP_GRACE_S} s grace"

    exited = d.named("vllm.exited")
    stopped = d.named("vllm.stopped")
    assert len(exited) == 1 and len(stopped) == 1
    assert exited[0]["reason"] == "stopped: loadwatch is stopping"
    assert "survived" not in exited[0]["reason"] and stopped[0]["remaining"] == []
    tree = _tree_pids(d)
    # the API server, its engine core and the engine's worker at least
    assert len(tree) >= 3 and exited[0]["pid"] in tree
    assert leftovers(tree, str(serving.model), ended) == []
    assert d.named("daemon.stopped")
    phases = [e["phase_to"] for e in d.named("transition.phase")]
    assert phases[-1] == "stopped", phases
    # a stop on request is no failure: the shutdown's EngineDeadError is not one
    assert d.named("transition.failure") == [], d.named("transition.failure")
    print(f"\nSIGTERM to exit: {took:.1f} s; {len(tree)} processes in vLLM's tree", file=sys.stderr)


# -- 3. a failing start ---------------------------------------------------------------------------


def test_kv_cache_too_small_restarts_with_backoff_then_fatal(failing_run: FailingRun) -> None:
    d, model = failing_run.daemon, failing_run.model
    d.wait(lambda: bool(d.named("vllm.fatal")), "the crash-loop verdict", FATAL_TIMEOUT_S, 0.5)
    fatal_s = time.monotonic() - failing_run.started
    ended = time.time()
    _keep_views(d, "kv-too-small")
    # the supervisor's record: a start, its exit, the backoff, a start, its exit, fatal
    sup = [e for e in d.events() if e["event"].startswith("vllm.")]
    # when the server exits before its worker, the supervisor ends the worker itself (no stop
    # was asked for: `ending_leftovers`, never `stopping`)
    leftover = [e for e in sup if e["event"] == "vllm.ending_leftovers"]
    assert all(e["reason"].startswith("vLLM exited; ending ") for e in leftover), leftover
    assert [e["event"] for e in sup if e["event"] != "vllm.ending_leftovers"] == [
        "vllm.started",
        "vllm.exited",
        "vllm.backoff",
        "vllm.started",
        "vllm.exited",
        "vllm.fatal",
        "vllm.supervisor_done",
    ]
    exits = d.named("vllm.exited")
    for e in exits:
        assert e["exit_code"] != 0 or e["signal"] is not None, e
        # named by the traceback's cause, not by the "EngineCore failed to start." before it
        assert e["reason"].endswith("after a fatal error in the log (kv_cache_too_small)"), e
    backoff = d.named("vllm.backoff")[0]
    assert backoff["backoff_s"] == BACKOFF_S and backoff["reason"] == exits[0]["reason"]
    waited = _at(d.named("vllm.started")[1]) - _at(exits[0])
    assert BACKOFF_S <= waited < BACKOFF_S + 10, waited
    assert len(d.named("preflight")) == 2  # checked again before the restart
    fatal = d.named("vllm.fatal")[0]
    assert fatal["reason"].startswith("crash loop: 2 starts within 900 s"), fatal
    assert fatal["reason"].endswith("(kv_cache_too_small)"), fatal
    assert d.named("vllm.supervisor_done")[0]["state"] == "fatal"

    # the failure, found in the real traceback, in each session
    status = d.status()
    s = status["session"]
    assert status["phase"] == "failed" and s["failure_kind"] == "kv_cache_too_small", s
    too_small = next(f for f in s["failures"] if f["kind"] == "kv_cache_too_small")
    assert too_small["fatal"] is True and too_small["exc_type"] == "ValueError"
    # (vLLM words it by how much memory the machine left it: either is this root cause)
    assert any(
        words in too_small["message"]
        for words in ("max seq len (512)", "No available memory for the cache blocks")
    ), too_small["message"]
    assert status["restarts"] == 1 and status["sessions_total"] == 2
    (first,) = status["sessions"]
    assert first["failure_kind"] == "kv_cache_too_small" and first["exit_code"] == 1, first
    assert first["shards_done"] == SHARDS  # the weights were in before the KV cache failed
    assert status["supervisor"]["state"] == "fatal"
    failures = [
        e for e in d.named("transition.failure") if e["failure_kind"] == "kv_cache_too_small"
    ]
    assert len({e["session"] for e in failures}) == 2
    assert d.get("/readyz")[0] == 503

    m = d.metrics()
    assert m['loadwatch_vllm_state{state="fatal"}'] == 1.0
    assert m["loadwatch_vllm_starts_total"] == 2.0
    assert m['loadwatch_failures_total{kind="kv_cache_too_small"}'] == 2.0
    assert m['loadwatch_session_failure{kind="kv_cache_too_small"}'] == 1.0
    assert m['loadwatch_load_phase{phase="failed"}'] == 1.0
    assert m['loadwatch_source_up{source="vllm"}'] == 0.0

    # nothing of either run is left
    tree = _tree_pids(d)
    assert len(tree) >= 6, tree
    assert leftovers(tree, str(model), ended) == []
    code, took = d.terminate(30)
    assert code == 0
    print(
        f"\nfatal after {fatal_s:.1f} s (two starts, {BACKOFF_S} s backoff); "
        f"daemon stop {took:.2f} s",
        file=sys.stderr,
    )
