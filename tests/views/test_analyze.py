"""`loadwatch analyze` on every fixture log and on built scenarios: verdicts, key facts, text."""

from __future__ import annotations

import bisect
import json
import os
import shutil
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main
from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.tools import analyze_input
from loadwatch.daemon.tools.analyze import analyze_log, report_json
from loadwatch.daemon.tools.analyze_input import line_numbers
from loadwatch.exporters.report import Report
from loadwatch.exporters.terminal.clean import json_for_terminal
from loadwatch.exporters.terminal.report_text import report_text

from .helpers import (
    FIXTURES,
    REF_TS,
    model_dir_with,
    shutdown_lines,
    synth_crash,
    synth_load_log,
    write_log,
)

# Every fixture log and what analyze must conclude from it: (sessions, final verdict text,
# earlier sessions' verdicts).
EXPECTED: dict[str, tuple[int, str, list[str]]] = {
    "gh-1cat-237-journald-ru.log": (0, "incomplete: no vLLM start in the log", []),
    "gh-akash-543-launcher.log": (0, "incomplete: no vLLM start in the log", []),
    "gh-arcb70-4-terminal-wrapped.log": (1, "failed: kv_cache_too_small", []),
    "gh-amd-strix-5-weights-loaded.log": (
        1,
        "incomplete: post_load, last progress 3/3 at 10-26 21:47:45",
        [],
    ),
    "gh-club3090-60-oom-reraised.log": (1, "failed: cuda_oom", []),
    "gh-club3090-617-autotuner-prefix.log": (
        1,
        "incomplete: post_load, last progress 21/21 at 12-01 00:00:00",
        [],
    ),
    "gh-dynamo-4087-ready.log": (1, "incomplete: post_load, no progress logged", []),
    "gh-glmv-204-two-graph-bars.log": (
        1,
        "incomplete: post_load, last progress 67/67 at 10-21 09:11:57",
        [],
    ),
    "gh-rocm-5680-compose-traceback.log": (
        2,
        "incomplete: starting, last progress 2/2 at 11-20 10:09:51",
        ["failed: other"],
    ),
    "gh-runai-67-compact-bar.log": (
        1,
        "incomplete: post_load, last progress 1/1 at 06-04 13:12:34",
        [],
    ),
    # (the tail begins after the version banner; the arguments vLLM logs at start are there)
    "gh-proxmoxved-2047-journald.log": (1, "incomplete: starting, no progress logged", []),
    "gh-vllm-12474-journald-traceback.log": (0, "incomplete: no vLLM start in the log", []),
    "gh-vllm-18416-ci-stamps.log": (1, "failed: engine_init_failed", []),
    "gh-vllm-19483-bar-prefix-after.log": (
        1,
        "incomplete: loading_weights, last progress 15/37 at 12-01 00:00:00",
        [],
    ),
    "gh-vllm-56180-raw-cuda-error.log": (1, "failed: other", []),
    "gh-vllm-omni-2590-two-loaders.log": (
        1,
        "incomplete: loading_weights, last progress 24/32 at 12-01 00:00:00",
        [],
    ),
    "gh-vllm-pr38476-bar-prefix-only.log": (
        1,
        "incomplete: loading_weights, last progress 7/85 at 12-01 00:00:00",
        [],
    ),
    "gh-vllm-16707-nccl-ray.log": (1, "failed: nccl", []),
    "gh-vllm-17939-oom-sampler.log": (1, "failed: cuda_oom", []),
    "gh-vllm-27508-engine-init-quoted.log": (1, "failed: engine_init_failed", []),
    "gh-vllm-35061-tp8-aot-compile.log": (1, "incomplete: post_load, no progress logged", []),
    "gh-vllm-46367-autotuner.log": (
        1,
        "incomplete: post_load, last progress 2/21 at 12-01 00:00:00",
        [],
    ),
    "gh-vllm-7800-nccl-init-device.log": (1, "failed: nccl", []),
    "gh-vllm-pr35616-startup-timeout.log": (1, "failed: startup_timeout", []),
    "ray.log": (1, "failed: nccl", []),
    # clients' model names, request ids and paths holding vLLM's words: one session, ready
    "real-v0.32-client-text.log": (1, "ready", []),
    "real-v0.32-deepseek-fp8kv.log": (1, "failed: fp8_kv_unsupported", []),
    "real-v0.32-deepseek-kvscales.log": (1, "ready", []),
    "real-v0.32-headless-pp-node1.log": (1, "incomplete: no vLLM start in the log", []),
    "real-v0.32-kv-too-small.log": (1, "failed: kv_cache_too_small", []),
    "real-v0.32-llama.log": (1, "ready", []),
    "real-v0.32-pp2-head.log": (1, "ready", []),
    "real-v0.32-pp2-node1.log": (1, "incomplete: post_load, no progress logged", []),
    "real-v0.32-supervised-kv-too-small.log": (
        2,
        "failed: kv_cache_too_small",
        ["failed: kv_cache_too_small"],
    ),
    "real-v0.32-supervised-patched.log": (1, "ready", []),
    "real-v0.32-zmq-ipc-path-too-long.log": (1, "failed: other", []),
    "tp1-enginecore.log": (1, "ready", []),
    "v0-bracket-header.log": (1, "failed: cuda_oom", []),
    "v0-old-header.log": (1, "ready", []),
    "v1-2025-escless-cut.log": (
        1,
        "incomplete: loading_weights, last progress 2/30 at 06-02 08:00:33",
        [],
    ),
    "v1-2025.log": (1, "ready", []),
    "v1-2026-sm120.log": (2, "ready", ["failed: fp8_kv_unsupported"]),
    # a shutdown's tail on a terminal: prefixes and headers in colour codes (their ESC lost)
    "vllmomni-2026-tty-colours.log": (1, "incomplete: no vLLM start in the log", []),
}


def fixture(tmp_path: Path, name: str) -> Path:
    """A copy of the fixture whose mtime is the fixed reference (yearless times resolve to it)."""
    dst = tmp_path / name
    shutil.copyfile(FIXTURES / name, dst)
    os.utime(dst, (REF_TS, REF_TS))
    return dst


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


# Root causes per real excerpt: (kind, records, echoes) of each failure of the last session.
ROOTS: dict[str, list[tuple[str, int, int]]] = {
    # the logged OOM and its bare re-raise (cut): one root
    "gh-club3090-60-oom-reraised.log": [("cuda_oom", 2, 1)],
    # rank 1's OOM; rank 0's "WorkerProc hit an exception." and its traceback (cut) echo it
    "gh-vllm-17939-oom-sampler.log": [("cuda_oom", 3, 2)],
    # the quoted `raise RuntimeError("Engine core initialization failed. "` is no failure
    "gh-vllm-27508-engine-init-quoted.log": [("engine_init_failed", 1, 0)],
    # the error is named on the line that opens the cut traceback
    "gh-vllm-7800-nccl-init-device.log": [("nccl", 1, 0)],
    # torch.distributed's `[rank0]: ` taken off: the NCCL RuntimeError is the root, the Ray
    # workers' "Error executing method" and their traceback (cut) its echoes
    "gh-vllm-16707-nccl-ray.log": [("nccl", 3, 2)],
    # the raw CUDA check on stderr is the root; the worker's death its echo
    "gh-vllm-56180-raw-cuda-error.log": [("other", 2, 1)],
    # a CI log's stamps and pytest's markers taken off: the quoted `raise` is no failure
    "gh-vllm-18416-ci-stamps.log": [("engine_init_failed", 1, 0)],
    # real vLLM 0.32 runs stopped on request: the EngineDeadError of the SIGTERM is no failure
    "real-v0.32-deepseek-kvscales.log": [],
    "real-v0.32-llama.log": [],
    "real-v0.32-supervised-patched.log": [],
}


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_failures_are_root_causes_with_their_echoes(name: str, tmp_path: Path) -> None:
    (s,) = _report(tmp_path, name).sessions
    assert [(f.kind, f.count, f.echoes) for f in s.failures] == ROOTS[name]
    for f in s.failures:
        assert f.line is not None and f.line in [e.line for e in f.evidence]  # the anchor
        assert len(f.evidence) == f.count


# The processes a log shows, behind whatever wrapper (journald in any locale, a launcher's tag).
PROCESSES: dict[str, list[str]] = {
    "gh-1cat-237-journald-ru.log": ["EngineCore", "APIServer"],
    "gh-proxmoxved-2047-journald.log": ["APIServer"],
    "gh-akash-543-launcher.log": ["VllmWorkerProcess"],
    "gh-rocm-5680-compose-traceback.log": ["APIServer", "EngineCore_DP0"],
    "gh-vllm-17939-oom-sampler.log": ["VllmWorker_rank1", "VllmWorker_rank0"],
    "ray.log": ["RayWorkerWrapper"],
}


@pytest.mark.parametrize("name", sorted(PROCESSES))
def test_processes_in_order_of_first_appearance(name: str, tmp_path: Path) -> None:
    assert list(_report(tmp_path, name).log.processes) == PROCESSES[name]


# Bars as analyze reports them: (process, desc, done, total, updates).
BARS: dict[str, list[tuple[str | None, str, int, int, int]]] = {
    # one bar: its first update had no prefix, the later ones follow a prefix-only record
    "gh-vllm-19483-bar-prefix-after.log": [
        ("VllmWorker_rank0", "Loading safetensors checkpoint shards", 15, 37, 10)
    ],
    "gh-vllm-pr38476-bar-prefix-only.log": [
        ("Worker_PP0_TP0_EP0", "Loading safetensors checkpoint shards", 7, 85, 6)
    ],
    # two weights bars at once, interleaved: two bars, neither restarted by the other
    "gh-vllm-omni-2590-two-loaders.log": [
        (None, "Multi-thread loading shards", 24, 32, 10),
        (None, "Loading safetensors checkpoint shards", 13, 32, 6),
    ],
    "gh-glmv-204-two-graph-bars.log": [
        (None, "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 67, 67, 1),
        (None, "Capturing CUDA graphs (decode, FULL)", 35, 35, 1),
    ],
    # tqdm's compact form (`0% 0/1 [...]`, no bar), a message on the bar's own line
    "gh-runai-67-compact-bar.log": [
        (None, "Loading safetensors using Runai Model Streamer", 1, 1, 2)
    ],
}


@pytest.mark.parametrize("name", sorted(BARS))
def test_bars_by_process_and_desc(name: str, tmp_path: Path) -> None:
    (s,) = _report(tmp_path, name).sessions
    assert [(b.process, b.desc, b.done, b.total, b.updates) for b in s.bars] == BARS[name]


def test_a_chained_traceback_behind_docker_compose_is_one_failure(tmp_path: Path) -> None:
    """`During handling of the above exception, another exception occurred:` chains three
    exceptions into one traceback: one failure, the exception raised last, behind the compose
    prefix of every line."""
    first, _second = _report(tmp_path, "gh-rocm-5680-compose-traceback.log").sessions
    (f,) = first.failures
    assert (f.kind, f.exc_type, f.count) == ("other", "RuntimeError", 1)
    assert f.message.startswith("Get GPU arch from rocminfo failed")
    assert f.processes == ("APIServer",) and f.line == 8


def test_a_terminal_wrapped_exception_line_is_joined(tmp_path: Path) -> None:
    """The KV-cache ValueError cut at the terminal's width ("KV cach" / "e is needed"): the
    pieces are joined, and the kind comes from the whole message."""
    (s,) = _report(tmp_path, "gh-arcb70-4-terminal-wrapped.log").sessions
    (f,) = s.failures
    assert f.kind == "kv_cache_too_small" and f.processes == ("EngineCore",)
    assert "KV cache is needed, which is larger than" in f.message


def test_a_finished_bar_and_loading_weights_took_end_loading_weights(tmp_path: Path) -> None:
    (s,) = _report(tmp_path, "gh-amd-strix-5-weights-loaded.log").sessions
    assert s.reached == "post_load" and s.phase == "post_load"
    assert s.weights_load_s == pytest.approx(1.27)


def test_routes_listed_is_not_ready_yet(tmp_path: Path) -> None:
    """vLLM lists its routes before uvicorn listens: a request then is refused (real vLLM 0.32
    in tests/e2e/test_real_vllm.py), so the API server's start is post_load, not ready."""
    (s,) = _report(tmp_path, "gh-dynamo-4087-ready.log").sessions
    assert s.verdict.status == "incomplete" and s.phase == "post_load"
    assert any(m.kind == "api_server_start" for m in s.milestones)


def test_every_fixture_has_a_source() -> None:
    """Excerpts of public issues name their source beside them (repo#N and its address)."""
    for log in FIXTURES.glob("gh-*.log"):
        text = log.with_suffix(".source").read_text(encoding="utf-8")
        assert "#" in text and "https://github.com/" in text, log.name


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_text_and_json(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sessions, verdict, earlier = EXPECTED[name]
    log = fixture(tmp_path, name)
    want_code = {"ready": 0, "failed": 1, "incomplete": 2}[verdict.split(":")[0]]

    code, out, err = run_cli(["analyze", str(log)], capsys)
    assert (code, err) == (want_code, "")
    assert f"Verdict: {verdict}" in out
    for i, v in enumerate(earlier, start=1):
        assert f"Session {i}: {v}" in out
    assert "\x1b[" not in out  # no escape codes in a pipe
    assert all(line == line.rstrip() for line in out.splitlines())

    code, out, err = run_cli(["analyze", str(log), "--json"], capsys)
    doc = json.loads(out)
    assert (code, err) == (want_code, "")
    # the standard encoder's text, to the byte (orjson writes it)
    assert out == json_for_terminal(json.dumps(doc, indent=2, ensure_ascii=False)) + "\n"
    assert doc["verdict"]["text"] == verdict and doc["verdict"]["exit_code"] == want_code
    assert doc["sessions_total"] == sessions == len(doc["sessions"])
    assert [s["verdict"]["text"] for s in doc["sessions"]][:-1] == earlier
    assert doc["log"]["bytes_read"] == doc["log"]["size_bytes"] == log.stat().st_size
    assert doc["log"]["cut_records"] == 0 and doc["log"]["read_errors"] == 0


def test_a_report_orjson_refuses_is_written_by_the_standard_encoder() -> None:
    doc = {"big": 2**70, "keys": {1: "caf\u00e9"}, "ratio": 0.1}
    assert report_json(doc) == json.dumps(doc, indent=2, ensure_ascii=False)
    assert report_json({"ratio": 0.1, "s": "caf\u00e9"}) == json.dumps(
        {"ratio": 0.1, "s": "caf\u00e9"}, indent=2, ensure_ascii=False
    )


def _report(tmp_path: Path, name: str) -> Report:
    return analyze_log(fixture(tmp_path, name))


def test_sm120_two_sessions_in_full(tmp_path: Path) -> None:
    r = _report(tmp_path, "v1-2026-sm120.log")
    first, second = r.sessions
    assert first.verdict.status == "failed" and first.failure_kind == "fp8_kv_unsupported"
    root = first.failures[0]
    assert (root.kind, root.exc_type, root.fatal) == ("fp8_kv_unsupported", "ValueError", True)
    assert "TRITON_MLA: [kv_cache_dtype not supported]" in root.message
    lines = (FIXTURES / "v1-2026-sm120.log").read_bytes().splitlines()
    assert root.line is not None and b"Traceback" in lines[root.line - 1]
    assert root.offset is not None
    assert first.kv_cache.quantized is True and first.kv_cache.source == "engine_config"
    # the FP8 KV-cache line comes before the model loads: the failure is in loading_weights
    assert [p.phase for p in first.phases] == ["starting", "loading_weights", "failed"]

    assert second.verdict.status == "ready"
    assert second.time_to_ready_s == pytest.approx(1025.0)
    assert [p.phase for p in second.phases] == ["starting", "loading_weights", "post_load", "ready"]
    # `Loading weights took` after the finished bar ends loading_weights
    assert [p.duration_s for p in second.phases[:3]] == [40.0, 932.0, 53.0]
    weights = next(b for b in second.bars if b.kind == "weights")
    assert (weights.done, weights.total) == (119, 119)
    assert weights.longest_gap_s == pytest.approx(914.0)
    assert weights.rate_per_s == pytest.approx(119 / 931.0, rel=0.01)
    (w,) = second.warnings
    assert (w.code, w.count, w.layers, w.verdict) == ("kv_scale_missing", 4, (1, 2), "benign")
    assert second.stall_hints == 1
    # vLLM 0.15 prints its arguments before its version line: the start is the arguments' line
    assert second.line is not None and b"non-default args" in lines[second.line - 1]
    assert b"version 0.15.1" in lines[second.line]

    text = report_text(r)
    assert "1  01-27 23:59:50  0.15.1  loading_weights" in text
    # one root cause with its four echoes (the worker's and the engine's "failed to start", the
    # engine's wrapper, the API server's RuntimeError)
    assert "✗ fp8_kv_unsupported ×5  line 12" in text
    assert "4 echoes folded in" in text
    assert "Loading safetensors checkpoint shards" in text and "119/119" in text
    assert "15m14s" in text  # the longest gap
    assert "kv_scale_missing: benign" in text


def test_kv_too_small(tmp_path: Path) -> None:
    r = _report(tmp_path, "real-v0.32-kv-too-small.log")
    (s,) = r.sessions
    assert r.verdict.text == "failed: kv_cache_too_small"
    assert s.failures[0].kind == "kv_cache_too_small"
    assert "max seq len (512)" in s.failures[0].message
    assert s.reached == "post_load" and s.progress.shards_done == s.progress.shards_total == 12
    # the start-up step it failed in (the timeline), then the load phase it reached
    assert r.verdict.notes == ("in kv_cache (post_load), last progress 12/12 at 11-30 06:36:59",)
    kv = next(w for w in s.warnings if w.code == "kv_scale_missing")
    assert (kv.count, kv.layer_count, kv.verdict) == (24, 12, "benign")


def test_escless_cut_mid_load(tmp_path: Path) -> None:
    r = _report(tmp_path, "v1-2025-escless-cut.log")
    lp = r.verdict.last_progress
    assert lp is not None and (lp.done, lp.total) == (2, 30)
    assert r.verdict.phase == "loading_weights"
    (s,) = r.sessions
    assert s.bars[0].process == "VllmWorker_rank0"


def test_ready_then_stopped_is_ready_with_a_note(tmp_path: Path) -> None:
    r = _report(tmp_path, "real-v0.32-llama.log")
    assert r.verdict.status == "ready" and r.sessions[0].phase == "stopped"
    assert any("shut down on request" in n for n in r.verdict.notes)


def test_a_log_that_ends_while_ready_says_there_is_no_shutdown_line(tmp_path: Path) -> None:
    """The log of a real vLLM 0.32 killed with SIGKILL while it served: it ends with
    `Application startup complete.` (SIGKILL and the OOM killer leave no line)."""
    lines = (FIXTURES / "real-v0.32-llama.log").read_bytes().splitlines(keepends=True)
    end = next(i for i, x in enumerate(lines) if b"Application startup complete" in x)
    r = analyze_log(write_log(tmp_path / "killed.log", b"".join(lines[: end + 1])))
    assert r.verdict.status == "ready" and r.sessions[0].phase == "ready"
    assert r.verdict.notes[-1] == (
        "the log ends while it was ready, with no shutdown line: still serving, or killed "
        "(SIGKILL and the OOM killer leave no line)"
    )
    # and a vLLM started again in the same log after it: the first was killed
    again = b"".join(lines[: end + 1]) * 2
    r = analyze_log(write_log(tmp_path / "again.log", again))
    first, second = r.sessions
    assert first.verdict.notes[-1] == (
        "vLLM started again while it was ready, with no shutdown line: killed (SIGKILL and the "
        "OOM killer leave no line)"
    )
    assert second.verdict.notes[-1].startswith("the log ends while it was ready")


# -- scenarios built as files ---------------------------------------------------------------

T0 = 1_785_000_000.0


def test_stopped_at_100_percent_never_ready(tmp_path: Path) -> None:
    data = synth_load_log(T0, upto=119, after=["model_memory"])
    r = analyze_log(write_log(tmp_path / "a.log", data))
    assert r.verdict.text.startswith("incomplete: post_load, last progress 119/119 at ")
    assert r.verdict.exit_code == 2
    # and the same with vLLM's shutdown lines at the end: stopped, still not ready
    data += shutdown_lines(T0 + 40 + 119 * 8 + 30)
    r = analyze_log(write_log(tmp_path / "b.log", data))
    (s,) = r.sessions
    assert s.phase == "stopped" and r.verdict.status == "incomplete"
    assert r.verdict.text.startswith("incomplete: post_load, last progress 119/119")
    assert any("shut down" in n and "before it was ready" in n for n in r.verdict.notes)


def test_cut_mid_record_without_a_final_newline(tmp_path: Path) -> None:
    data = synth_load_log(T0, upto=61)
    data = data[: data.rindex(b"\n")]  # the last bar update has no terminator
    r = analyze_log(write_log(tmp_path / "cut.log", data))
    assert r.log.unterminated_last_record and r.log.bytes_read == len(data)
    lp = r.verdict.last_progress
    assert lp is not None and (lp.done, lp.total) == (61, 119)


def test_crash_loop_of_five_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = b"".join(synth_crash(T0 + 300 * i, upto=3 + i) for i in range(5))
    log = write_log(tmp_path / "loop.log", data)
    r = analyze_log(log)
    assert r.sessions_total == 5 and len(r.sessions) == 5
    assert [s.verdict.text for s in r.sessions] == ["failed: cuda_oom"] * 5
    assert [s.verdict.last_progress.done for s in r.sessions if s.verdict.last_progress] == [
        3,
        4,
        5,
        6,
        7,
    ]
    code, out, _ = run_cli(["analyze", str(log)], capsys)
    assert code == 1
    assert out.count("failed: cuda_oom") >= 10  # the table row and the session title, each
    assert "Verdict: failed: cuda_oom  (session 5)" in out


def test_only_serving_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    api = "(APIServer pid=51001) "
    lines = []
    for i in range(50):
        lines.append(
            f'{api}INFO:     127.0.0.1:{40000 + i} - "POST /v1/completions HTTP/1.1" 200 OK\n'
        )
        lines.append(
            f"{api}INFO 01-28 01:{i:02d}:00 [loggers.py:123] Engine 000: Avg prompt throughput: "
            "120.5 tokens/s, Avg generation throughput: 35.1 tokens/s, Running: 2 reqs\n"
        )
    log = write_log(tmp_path / "serving.log", "".join(lines).encode())
    code, out, err = run_cli(["analyze", str(log)], capsys)
    assert (code, err) == (2, "")
    assert "Verdict: incomplete: no vLLM start in the log" in out
    # a validation warning echoing the request's own keys is the client's text: still nothing
    lines.insert(
        10,
        f"{api}WARNING 01-28 01:05:00 [protocol.py:70] The following fields were present in the request but ignored: {{'foo'}}\n",
    )
    r = analyze_log(write_log(tmp_path / "serving1.log", "".join(lines).encode()))
    assert r.sessions_total == 0
    # a warning of vLLM's own among them opens a session, but still no start-up to judge
    # (the line from real-v0.32-pp2-head.log)
    lines.insert(
        10,
        f"{api}WARNING 01-28 01:05:00 [system_utils.py:255] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit.\n",
    )
    r = analyze_log(write_log(tmp_path / "serving2.log", "".join(lines).encode()))
    assert r.sessions_total == 1
    assert r.verdict.text == "incomplete: no vLLM start in the log"
    assert r.sessions[0].warnings[0].code.startswith("log.")


def test_model_dir_weighs_progress_by_bytes(tmp_path: Path) -> None:
    model = model_dir_with(tmp_path / "model", [3 << 30] * 60 + [1 << 30] * 59)
    data = synth_load_log(T0, upto=60)
    r = analyze_log(write_log(tmp_path / "m.log", data), model_dir=model)
    assert r.model is not None and r.model.shards == 119
    assert r.model.total_bytes == 60 * (3 << 30) + 59 * (1 << 30)
    lp = r.verdict.last_progress
    assert lp is not None and lp.bytes_done == 60 * (3 << 30)
    assert lp.bytes_total == r.model.total_bytes
    s = r.sessions[0]
    assert s.progress.ratio == pytest.approx(180 / 239, rel=0.01)


def test_model_dir_kv_dtype_used_when_the_log_lacks_the_start(tmp_path: Path) -> None:
    model = model_dir_with(tmp_path / "model", [1 << 30] * 119, kv_fp8=True)
    data = synth_load_log(T0, upto=30, scale_layers=2)
    body = data[data.index(b"(Worker_TP0") :]  # no version line: the start is not in the log
    r = analyze_log(write_log(tmp_path / "x.log", body))
    assert r.sessions[0].warnings[0].verdict == "unknown"
    r = analyze_log(write_log(tmp_path / "y.log", body), model_dir=model)
    w = r.sessions[0].warnings[0]
    assert w.code == "kv_scale_missing" and w.verdict == "flagged"
    assert "assuming no --kv-cache-dtype" in w.reason
    # with the start-up in the log and no FP8 line, the log settles it: benign
    r = analyze_log(write_log(tmp_path / "z.log", data), model_dir=model)
    assert r.sessions[0].warnings[0].verdict == "benign"


def test_a_long_record_is_cut_and_counted(tmp_path: Path) -> None:
    data = synth_load_log(T0, upto=10)
    i = data.index(b"\r")  # before the bar: a 300 KiB line of junk
    data = data[:i] + b"x" * (300 * 1024) + b"\n" + data[i:]
    log = write_log(tmp_path / "long.log", data)
    r = analyze_log(log, max_record_bytes=64 * 1024)
    assert r.log.cut_records == 1 and r.log.bytes_read == len(data)
    assert r.verdict.last_progress is not None and r.verdict.last_progress.done == 10
    assert "1 record(s) longer than 64.0 KiB" in report_text(r)


def test_text_never_takes_log_text_as_markup(tmp_path: Path) -> None:
    api = "(APIServer pid=1) "
    data = (
        synth_load_log(T0, upto=2)
        + (
            f"{api}WARNING 01-28 01:05:00 [x.py:1] [bold red]not markup[/] [link=file:///etc]x\n"
        ).encode()
    )
    text = report_text(analyze_log(write_log(tmp_path / "m.log", data)))
    assert "[bold red]not markup[/]" in text


def test_the_fp8_kv_line_does_not_skip_loading_weights(tmp_path: Path) -> None:
    """vLLM names an FP8 KV cache while it builds its configuration, before the model loads;
    the session still goes through loading_weights, and its KV cache is known to be FP8."""
    r = _report(tmp_path, "real-v0.32-deepseek-fp8kv.log")
    (s,) = r.sessions
    assert [p.phase for p in s.phases][:4] == ["starting", "loading_weights", "post_load", "ready"]
    assert s.kv_cache.quantized is True
    kv = next(w for w in s.warnings if w.code == "kv_scale_missing")
    assert kv.verdict == "flagged"
    assert r.verdict.text == "failed: fp8_kv_unsupported"
    assert any("after it was ready" in n for n in r.verdict.notes)


def test_lines_without_a_time_before_the_first_one(tmp_path: Path) -> None:
    """A log that begins mid-bar: the bar lines carry no time until a headed line comes; they
    are folded at that first time, in order, not at the file's mtime."""
    w = "(Worker_TP0 pid=51300) "
    desc = "Loading safetensors checkpoint shards"
    bars = "".join(
        f"{w}\r{desc}: {n}% Completed | {n}/119 [01:{n:02d}<10:00, 8.00s/it]\n"
        for n in (10, 11, 12)
    )
    headed = (
        f"{w}WARNING 07-25 17:30:00 [weight_utils.py:1398] Found k_scale in the checkpoint "
        "(e.g. model.layers.7.self_attn.k_scale), but not found the expected name in the model "
        "(e.g. model.layers.7.self_attn.attn.k_scale). k_scale is not loaded.\n"
    )
    r = analyze_log(write_log(tmp_path / "mid.log", (bars + headed).encode()))
    (s,) = r.sessions
    first_time = s.warnings[0].first_at
    assert s.started_at == first_time != REF_TS
    lp = r.verdict.last_progress
    assert lp is not None and lp.done == 12 and s.reason == "first_event"
    assert r.verdict.text.startswith("incomplete: loading_weights, last progress 12/119")
    # with no time at all, the file's mtime stands in
    r = analyze_log(write_log(tmp_path / "bars.log", bars.encode()))
    assert r.sessions[0].started_at == REF_TS


def test_a_crash_loop_is_reported_by_its_first_failure(tmp_path: Path) -> None:
    """Two supervised starts of real vLLM that could not fit the KV cache: the report names the
    loop and its first failure, with the phase it failed in and the line of its root cause."""
    report = analyze_log(fixture(tmp_path, "real-v0.32-supervised-kv-too-small.log"))
    loop = report.crash_loop
    assert loop is not None and loop.failed_starts == 2 and loop.session == 1
    assert loop.kind == "kv_cache_too_small" and loop.phase == "kv_cache"
    assert loop.exc_type == "ValueError" and loop.message is not None
    assert "max seq len (512)" in loop.message
    # the line the report gives the root cause's first record (the traceback's head)
    root = next(f for f in report.sessions[0].failures if f.kind == "kv_cache_too_small")
    assert loop.line is not None and loop.line == root.line
    assert report.to_dict()["crash_loop"]["phase"] == "kv_cache"
    text = report_text(report)
    assert "crash loop of 2 failed starts; the first (session 1, line " in text
    # one failed start is no loop
    assert analyze_log(fixture(tmp_path, "real-v0.32-kv-too-small.log")).crash_loop is None


def test_line_numbers_of_many_offsets_across_blocks(tmp_path: Path) -> None:
    """Offsets many to a block and spread over several: each one's line is the count of line
    breaks before it, plus one (each byte is counted once, so the pass stays linear)."""
    data = b"".join(b"x" * (i % 97) + b"\n" for i in range(60_000))
    log = tmp_path / "vllm.log"
    log.write_bytes(data)
    offsets = set(range(0, len(data), 331)) | {len(data) - 1, 1, 2}
    got = line_numbers(log, offsets)
    breaks = [i for i, c in enumerate(data) if c == 10]
    assert got == {o: bisect.bisect_left(breaks, o) + 1 for o in offsets}
    assert len(data) > 2 * analyze_input._LINE_BLOCK  # (the offsets span several blocks)


def test_line_numbers_from_the_marks_of_the_read_equal_those_counted_from_the_start(
    tmp_path: Path,
) -> None:
    """The marks a read leaves (lines counted chunk by chunk, back to back from the file's
    start) give each offset the line a count from the start gives; a cut record's chunk (not the
    file's bytes) ends them, and the offsets after it are counted from the last mark."""
    data = b"".join(b"y" * (i % 89) + (b"\r\n" if i % 7 else b"\n") for i in range(40_000))
    log = tmp_path / "vllm.log"
    log.write_bytes(data)
    offsets = set(range(3, len(data), 1013)) | {0, len(data) - 1}
    marks = analyze_input.LineMarks()
    step = 65_536
    for start in range(0, len(data), step):
        end = min(start + step, len(data))
        cut = start >= 8 * step  # from here on, as if a record had been cut
        marks.add(Chunk(data[start:end], start, "f", end, cut))
    assert 1 < len(marks.at) <= 9 and marks.at[-1] == 8 * step
    assert line_numbers(log, offsets, marks) == line_numbers(log, offsets)
    breaks = [i for i, c in enumerate(data) if c == 10]
    assert line_numbers(log, offsets, marks) == {
        o: bisect.bisect_left(breaks, o) + 1 for o in offsets
    }
