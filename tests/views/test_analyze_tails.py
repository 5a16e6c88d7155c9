"""`loadwatch analyze` on a tail of a log (`kubectl logs --tail=200`): a session begun before the
log, whose failures, steps and bars are reported, with what the log cannot tell said so.

The tails are cut from real vLLM 0.32 CPU runs (tests/fixtures/real-v0.32-*.log, made by
tests/realvllm/) at a line number: every line is vLLM's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loadwatch.daemon.cli import main
from loadwatch.daemon.tools.analyze import analyze_log
from loadwatch.exporters.terminal.report_text import report_text

from .helpers import FIXTURES, REF_TS


def tail(tmp_path: Path, name: str, first_line: int) -> Path:
    """The fixture from its line `first_line` (1-based, as `tail -n +N` counts) on."""
    lines = (FIXTURES / name).read_bytes().split(b"\n")
    out = tmp_path / f"tail-{first_line}-{name}"
    out.write_bytes(b"\n".join(lines[first_line - 1 :]))
    os.utime(out, (REF_TS, REF_TS))
    return out


def test_a_tail_that_begins_mid_load(tmp_path: Path) -> None:
    """From the weights bar's last updates on: the weights step began before the log, the
    KV cache's step is where it failed."""
    r = analyze_log(tail(tmp_path, "real-v0.32-kv-too-small.log", 60))
    (s,) = r.sessions
    assert r.verdict.text == "failed: kv_cache_too_small"
    assert r.verdict.notes == (
        "in kv_cache (post_load), last progress 12/12 at 11-30 06:37:00",
        "the log begins after this vLLM started",
    )
    assert [(x.phase, x.began_before_log) for x in s.timeline] == [
        ("weights", True),
        ("kv_cache", False),
    ]
    assert s.timeline[0].bars == ("Loading safetensors checkpoint shards: 12/12 files",)
    assert s.time_to_ready_s is None and s.reason == "first_event"
    text = report_text(r)
    assert "started   before the log; its first line 11-30 06:36:57 (line 1)" in text
    assert "≤06:36:57" in text and "began before the log: its start is not in it" in text
    assert "failed here: kv_cache_too_small" in text


def test_a_tail_that_holds_only_a_traceback_cut_before_its_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server's EngineDeadError traceback from its second record on (its `Traceback
    (most recent call last):` head cut off), then the shutdown lines. Once, the frames were
    read as nothing and the exception line as an unknown error: `incomplete: no vLLM start in
    the log`, the failure not reported at all."""
    log = tail(tmp_path, "real-v0.32-deepseek-fp8kv.log", 374)
    assert b"Traceback" not in log.read_bytes()
    code = main(["analyze", "--json", str(log)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["verdict"]["text"] == "failed: worker_died"
    assert doc["verdict"]["notes"] == [
        "in a phase the log does not show: it begins after vLLM started (its start, the "
        "phases before and the time to the failure are not in it)"
    ]
    (s,) = doc["sessions"]
    (failure,) = s["failures"]
    assert failure["exc_type"] == "vllm.v1.engine.exceptions.EngineDeadError"
    assert failure["line"] == 1  # where the traceback begins in this log
    assert [(x["phase"], x["began_before_log"]) for x in s["timeline"]] == [("unknown", True)]
    text = report_text(analyze_log(log))
    assert "the log does not say which step this was" in text


def test_a_tail_from_a_traceback_head_does_not_claim_a_phase(tmp_path: Path) -> None:
    """From `EngineCore failed to start.` on: the failure is reported, and not as `in
    starting` (the log says nothing of where the start-up was)."""
    r = analyze_log(tail(tmp_path, "real-v0.32-kv-too-small.log", 95))
    assert r.verdict.text == "failed: kv_cache_too_small"
    assert not any("in starting" in note for note in r.verdict.notes)
    assert "in a phase the log does not show" in r.verdict.notes[0]


def test_frames_alone_report_no_failure(tmp_path: Path) -> None:
    """Frames of a traceback with neither its head nor its exception line say nothing of
    what failed: no failure is made up (gh-vllm-17939 from its rank-0 frames)."""
    r = analyze_log(tail(tmp_path, "gh-vllm-17939-oom-sampler.log", 6))
    assert r.verdict.text == "incomplete: no vLLM start in the log"
    assert all(not s.failures for s in r.sessions)


def test_a_tail_that_gets_ready_says_the_time_to_ready_is_not_known(tmp_path: Path) -> None:
    r = analyze_log(tail(tmp_path, "real-v0.32-llama.log", 46))
    (s,) = r.sessions
    assert s.ready_at is not None and s.time_to_ready_s is None
    assert r.verdict.notes[0].startswith("ready at 11-30 06:38:15; the log begins after vLLM")
    assert s.timeline[0].began_before_log
