"""analyze and the status screen say what each bar counts (../shared/vllm-log-formats.md section 9, loaders table)."""

from __future__ import annotations

import os
from pathlib import Path

from loadwatch.daemon.tools.analyze import analyze_log
from loadwatch.exporters.terminal.report_text import report_text
from loadwatch.exporters.terminal.watch import status_text
from loadwatch.parsers import EventStream, split_records
from tests.state.helpers import T0, fold, started
from tests.views.test_analyze import REF_TS, fixture

# InstantTensor's bar since vLLM PR #46868, the two lines section 9 quotes
INSTANTTENSOR = (
    b"Loading safetensors using InstantTensor loader:   0% Completed | 0.00/155G [00:00<?, ?B/s]\n"
    b"Loading safetensors using InstantTensor loader:   9% Completed | 13.3G/155G "
    b"[00:01<00:10, 14.3GB/s]\n"
)


def test_an_instanttensor_bar_counts_bytes_in_json_and_text(tmp_path: Path) -> None:
    log = tmp_path / "instanttensor.log"
    log.write_bytes(INSTANTTENSOR)
    os.utime(log, (REF_TS, REF_TS))
    report = analyze_log(log)
    (s,) = report.sessions
    (b,) = s.bars
    assert (b.unit, b.done, b.total) == ("bytes", 13_300_000_000, 155 * 10**9)
    assert report.to_dict()["sessions"][0]["bars"][0]["unit"] == "bytes"
    assert "12.4 GiB/144.4 GiB" in report_text(report, width=160)


def test_the_runai_streamers_bar_counts_tensors(tmp_path: Path) -> None:
    """run-ai/runai-model-streamer#67 (tests/fixtures/gh-runai-67-compact-bar.source)."""
    (s,) = analyze_log(fixture(tmp_path, "gh-runai-67-compact-bar.log")).sessions
    assert [b.unit for b in s.bars] == ["tensors"]
    (s,) = analyze_log(fixture(tmp_path, "gh-vllm-19483-bar-prefix-after.log")).sessions
    assert [b.unit for b in s.bars] == ["files"]


def test_the_status_screen_shows_a_bytes_bar_by_its_sizes() -> None:
    evs = EventStream(ref_ts=T0).feed_all(split_records(INSTANTTENSOR))
    st, _ = fold([(T0, started(T0)), (T0 + 1, evs[0]), (T0 + 2, evs[1])])  # type: ignore[list-item]
    text = status_text(st.snapshot(T0 + 2).to_dict())
    assert "12.4 GiB / 144.4 GiB" in text
    assert "13300000000" not in text and "shards" not in text.split("weights", 1)[1].split("\n")[0]
