"""`loadwatch run` end to end: a scripted load written over time, scraped with a real client."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadwatch.daemon.config import (
    Config,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
    ModelConfig,
)
from loadwatch.daemon.sim.kimilog import RealClock, Shape, startup
from loadwatch.daemon.tools.demo import make_model_dir
from tests.client import parse_metrics
from tests.daemon.harness import running
from tests.helpers import append, wait_for

SHARDS = 6


def script(model: Path, seed: int = 3, kv_cache_dtype: str | None = None) -> list[str]:
    shape = Shape(
        model=str(model), shards=SHARDS, workers=2, layers=4, kv_cache_dtype=kv_cache_dtype
    )
    return list(startup(random.Random(seed), RealClock(speed=1e6), shape))


def upto(lines: list[str], marker: str) -> tuple[list[str], list[str]]:
    """Lines up to and including the first holding `marker`, and the rest."""
    for i, line in enumerate(lines):
        if marker in line:
            return lines[: i + 1], lines[i + 1 :]
    raise AssertionError(marker)


def config(tmp_path: Path, model: Path | None, **gpu: object) -> Config:
    return Config(
        log=LogConfig(path=tmp_path / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="simulated", poll_interval_s=0.1, **gpu),  # type: ignore[arg-type]
        model=ModelConfig(dir=model),
        forecast=ForecastConfig(stall_floor_s=60),
        state_dir=tmp_path / "state",
    )


def test_watch_mode_follows_a_scripted_load(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path, fp8_kv=False, shards=SHARDS, total_bytes=6 * 10**9)
    cfg = config(tmp_path, model)
    lines = script(model)
    with running(cfg) as d:
        # nothing to read yet: no session, not ready, the log source says so
        assert d.status()["phase"] is None
        assert d.get("/readyz")[0] == 503
        assert d.get("/healthz") == (200, b"ok\n")
        d.wait(lambda: d.metrics()['loadwatch_source_up{source="log"}'] == 0.0, "log source down")

        first, rest = upto(lines, f"2/{SHARDS} [")
        append(cfg.log.path, first)  # type: ignore[arg-type]
        d.wait(lambda: d.status()["session"]["progress"]["shards_done"] == 2, "2 shards")
        s = d.status()["session"]
        assert s["phase"] == "loading_weights"
        p = s["progress"]
        # the first shard (embeddings) is half as big again as the others
        assert (p["bytes_total"], p["bytes_done"]) == (6 * 10**9, 2_400_000_000)
        # the ratio also counts the part of the third shard read since (never past it)
        assert 0.4 <= p["ratio"] <= 0.55
        assert (
            p["eta"] is not None
            and p["eta"]["low_s"] <= p["eta"]["remaining_s"] <= p["eta"]["high_s"]
        )
        kv = next(w for w in s["warnings"] if w["code"] == "kv_scale_missing")
        assert kv["verdict"] == "benign" and kv["processes"] and kv["layers"]
        m = d.metrics()
        assert m['loadwatch_load_phase{phase="loading_weights"}'] == 1.0
        assert m["loadwatch_load_shards_done"] == 2.0 and m["loadwatch_load_shards"] == SHARDS
        assert "loadwatch_load_eta_seconds" in m
        assert m['loadwatch_source_up{source="log"}'] == 1.0
        assert m['loadwatch_session_warnings{code="kv_scale_missing",verdict="benign"}'] >= 2

        append(cfg.log.path, rest)  # type: ignore[arg-type]
        d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
        m = d.metrics()
        assert m["loadwatch_load_ready"] == 1.0 and m["loadwatch_time_to_ready_seconds"] >= 0
        assert sum(1 for k in m if k.startswith("loadwatch_gpu_up{")) == 8
        assert "loadwatch_load_eta_seconds" not in m  # no ETA once the weights are in
        phases = [e["phase_to"] for e in d.events() if e["event"] == "transition.phase"]
        assert phases[-3:] == ["loading_weights", "post_load", "ready"] or phases[-1] == "ready"
        bars = [e for e in d.events() if e["event"] == "log.shard_progress"]
        assert [b["done"] for b in bars][:3] == [0, 1, 2]
    assert d.code == 0


def test_a_load_read_in_one_burst_is_written_in_record_order(tmp_path: Path) -> None:
    # A whole load arrives in one read: its bars and warnings are folded a part at a time, and
    # the event log still reads as one record at a time would write it: each record's event
    # once, in file order, and every transition a record caused just before that record's event.
    model = make_model_dir(tmp_path, fp8_kv=False, shards=SHARDS, total_bytes=6 * 10**9)
    cfg = config(tmp_path, model)
    lines = script(model)
    with running(cfg) as d:
        append(cfg.log.path, lines)  # type: ignore[arg-type]
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        written = d.events()
    logged = [e for e in written if e["event"].startswith("log.")]
    offsets = [e["offset"] for e in logged]
    assert offsets == sorted(set(offsets))
    bar_lines = sum(line.count("checkpoint shards:") for line in lines)
    assert sum(e["event"] == "log.shard_progress" for e in logged) == bar_lines
    caused = 0
    for i, e in enumerate(written):
        if not e["event"].startswith("transition.") or "offset" not in e:
            continue
        caused += 1
        after = next(x for x in written[i + 1 :] if x["event"].startswith("log."))
        assert after["offset"] == e["offset"], e
    phases = [e["phase_to"] for e in written if e["event"] == "transition.phase"]
    assert phases[0] == "loading_weights" and phases[-1] == "ready", phases
    assert len(phases) == len(set(phases)) and caused >= len(phases) + 1  # + session_started


def test_live_metrics_pass_promtool(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path, fp8_kv=True, shards=SHARDS, total_bytes=6 * 10**9)
    cfg = config(tmp_path, model)
    # vLLM says it stores the cache in FP8, as it does for such a checkpoint
    first, _ = upto(script(model, kv_cache_dtype="fp8"), f"3/{SHARDS} [")
    append(cfg.log.path, first)  # type: ignore[arg-type]
    with running(cfg) as d:
        d.wait(lambda: d.status()["session"]["progress"]["shards_done"] == 3, "3 shards")
        _, body = d.get("/metrics")
        out = subprocess.run(
            ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60
        )
        assert out.returncode == 0 and out.stdout + out.stderr == b"", out.stdout + out.stderr
        # an FP8 KV cache declared in the checkpoint: the scale warnings are an accuracy risk
        kv = next(w for w in d.status()["session"]["warnings"] if w["code"] == "kv_scale_missing")
        assert kv["verdict"] == "flagged"


def _spawn(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        doc = json.loads(line)
        if doc.get("event") == "daemon.listening":
            return proc, doc["url"]
    proc.kill()
    raise AssertionError(f"no listening line; stderr: {proc.stderr.read() if proc.stderr else ''}")


def _status(url: str) -> dict[str, object]:
    import urllib.request

    with urllib.request.urlopen(url + "/status", timeout=5) as r:
        doc: dict[str, object] = json.loads(r.read())
        return doc


def _event_counts(url: str) -> dict[str, float]:
    """`loadwatch_events_total` by type, from a real scrape."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        m = parse_metrics(r.read())
    return {k: v for k, v in m.items() if k.startswith("loadwatch_events_total{")}


def test_subprocess_sigterm_checkpoint_and_restart_rebuild(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path, fp8_kv=False, shards=SHARDS, total_bytes=6 * 10**9)
    log, events = tmp_path / "vllm.log", tmp_path / "events.jsonl"
    first, rest = upto(script(model), f"3/{SHARDS} [")
    append(log, first)
    args = [
        "--log",
        str(log),
        "--state-dir",
        str(tmp_path / "state"),
        "--gpu",
        "none",
        "--listen",
        "127.0.0.1:0",
        "--events-file",
        str(events),
        "--model-dir",
        str(model),
    ]

    def shards(url: str) -> object:
        return _status(url)["session"]["progress"]["shards_done"]  # type: ignore[index]

    proc, url = _spawn(args, tmp_path)
    wait_for(lambda: shards(url) == 3, "three shards")
    before = _status(url)["session"]
    counts = _event_counts(url)
    assert counts['loadwatch_events_total{type="shard_progress"}'] >= 3
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert time.monotonic() - t0 < 2.0, "clean shutdown within 2 s"
    assert (tmp_path / "state" / "follower").is_dir()

    proc, url = _spawn(args, tmp_path)
    try:
        wait_for(lambda: shards(url) == 3, "three shards, read back")
        after = _status(url)["session"]
        assert after["id"] == before["id"] == 1  # type: ignore[index]
        assert _status(url)["sessions_total"] == 1
        assert [(w["code"], w["count"]) for w in after["warnings"]] == [  # type: ignore[index]
            (w["code"], w["count"])
            for w in before["warnings"]  # type: ignore[index]
        ]
        # The counts are the state's, rebuilt from the session's records: the same, exactly.
        assert _event_counts(url) == counts
        append(log, rest)
        wait_for(lambda: _status(url)["phase"] == "ready", "ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    written = [json.loads(x) for x in events.read_text().splitlines()]
    started = [e for e in written if e["event"] == "daemon.started"]
    assert [e["scanner"] for e in started] == ["c", "c"]  # the C candidate search, both runs
    assert all(e["compiled"] > 0 for e in started)  # (the record path by mypyc: test_compiled.py)
    bar_lines = sum(1 for line in first + rest if "checkpoint shards:" in line)
    parsed = [e for e in written if e["event"] == "log.shard_progress"]
    assert len(parsed) == bar_lines, "every parsed event logged once across the restart"
    replayed = [e for e in written if e.get("replay")]
    assert replayed and all(e["event"].startswith("transition.") for e in replayed)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "[log]\npoll_interval_s = 'soon'\n",
            "[log] poll_interval_s: expected a number, got 'soon'",
        ),
        (
            "[vllm]\nuser = 'no-such-user'\n",
            "[vllm] user: no such user on this host: 'no-such-user'",
        ),
    ],
)
def test_bad_config_is_one_line_and_exit_78(tmp_path: Path, text: str, line: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 78
    assert out.stderr.strip().splitlines() == [f"loadwatch: config error: {line}"]


def test_nothing_to_watch_is_a_config_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 78 and "nothing to watch" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_unwritable_state_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadwatch.daemon.cli",
            "run",
            "--log",
            str(tmp_path / "x.log"),
            "--state-dir",
            str(blocker / "state"),
            "--gpu",
            "none",
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 73
    assert out.stderr.strip().splitlines() == [
        f"loadwatch: cannot write the state directory {blocker / 'state'}: Not a directory"
    ]


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "loadwatch.daemon.cli",
                "run",
                "--log",
                str(tmp_path / "x.log"),
                "--state-dir",
                str(tmp_path / "st"),
                "--gpu",
                "none",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert out.returncode == 69
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory unreadable to no one")
def test_no_traceback_on_unreadable_log(tmp_path: Path) -> None:
    log = tmp_path / "dir-not-file"
    log.mkdir()
    cfg = config(tmp_path, None)
    cfg = Config(**{**cfg.__dict__, "log": LogConfig(path=log, poll_interval_s=0.05)})
    with running(cfg) as d:
        d.wait(lambda: any(e["event"] == "daemon.problem" for e in d.events()), "a problem line")
        # The daemon runs on and answers, and /healthz says honestly that its log is unreadable
        # (the board with it goes to the HTTP process at once, but after the event-log line)
        d.wait(lambda: d.get("/healthz")[0] == 503, "/healthz 503", 5)
        code, body = d.get("/healthz")
        assert code == 503 and b"log" in body and b"\n" not in body.rstrip(b"\n"), body
        assert d.get("/metrics")[0] == 200
        problem = next(e for e in d.events() if e["event"] == "daemon.problem")
        assert "\n" not in problem["error"]


def test_a_failing_publish_hook_is_said_once_and_the_daemon_goes_on(tmp_path: Path) -> None:
    """Boards are rendered in the loop after each publish: a rendering bug must not stop it."""
    cfg = config(tmp_path, None)
    log = cfg.log.path
    assert log is not None
    log.write_bytes(b"")
    with running(cfg) as d:
        daemon = d.daemon
        assert daemon is not None

        def broken(pub: object) -> None:
            raise ValueError("cannot render")

        daemon.loop_call(lambda: daemon.on_publish.insert(0, broken))
        for i in range(1, 4):
            append(log, [f"(APIServer pid=1) WARNING 11-30 10:00:0{i} [x.py:1] odd {i}\n"])
            # the hook after the broken one still feeds the HTTP server
            d.wait(lambda i=i: d.metrics()["loadwatch_log_lines_total"] == i, f"line {i} served")
        problems = [e["error"] for e in d.events() if e.get("event") == "daemon.problem"]
        assert problems == ["after publishing: ValueError: cannot render"]
        assert d.get("/healthz") == (200, b"ok\n")
    assert d.code == 0
