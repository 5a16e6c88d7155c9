"""`analyze` and `events` on bad input: one line and an exit code, or a correct report; bounded
memory on a huge file; the JSON output against docs/analyze.md; `events` against golden files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.cli import main
from loadwatch.daemon.tools.analyze import analyze_log

from .helpers import FIXTURES, REF_TS, synth_load_log, write_log
from .test_analyze import fixture

DOCS = Path(__file__).resolve().parents[2] / "docs" / "analyze.md"
LOADWATCH = Path(sys.executable).with_name("loadwatch")
T0 = 1_785_000_000.0


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *needles: str) -> None:
    assert err.startswith("loadwatch: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err


@pytest.mark.parametrize("command", ["analyze", "events"])
def test_missing_path(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([command, str(tmp_path / "nope.log")], capsys)
    assert (code, out) == (66, "")
    one_line_error(err, "nope.log", "no such file")


@pytest.mark.parametrize("command", ["analyze", "events"])
def test_directory(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([command, str(tmp_path)], capsys)
    assert (code, out) == (65, "")
    one_line_error(err, "is a directory")


def test_fifo_is_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    code, _, err = cli(["analyze", str(fifo)], capsys)  # would block forever if opened
    assert code == 65
    one_line_error(err, "not a regular file")


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["analyze", str(write_log(tmp_path / "e.log", b""))], capsys)
    assert (code, out) == (65, "")
    one_line_error(err, "empty")


@pytest.mark.parametrize("command", ["analyze", "events"])
def test_binary_junk(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = bytes((i * 7919 + 13) % 256 for i in range(200_000))  # NULs and control bytes
    code, out, err = cli([command, str(write_log(tmp_path / "j.bin", junk))], capsys)
    assert (code, out) == (65, "")
    one_line_error(err, "not a vLLM log", "binary")


def test_unreadable_file(tmp_path: Path) -> None:
    log = write_log(tmp_path / "secret.log", synth_load_log(T0, upto=3))
    log.chmod(0)
    prefix: list[str] = []
    if os.geteuid() == 0:  # root reads anything: run without the capabilities that allow it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
    r = subprocess.run(
        [*prefix, str(LOADWATCH), "analyze", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (r.returncode, r.stdout) == (66, "")
    one_line_error(r.stderr, "Permission denied")


def test_bad_record_cap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "a.log", synth_load_log(T0, upto=3))
    code, _, err = cli(["analyze", str(log), "--max-record-bytes", "10"], capsys)
    assert code == 64
    one_line_error(err, "--max-record-bytes")


def test_missing_model_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "a.log", synth_load_log(T0, upto=3))
    code, _, err = cli(["analyze", str(log), "--model-dir", str(tmp_path / "none")], capsys)
    assert code == 66
    one_line_error(err, "--model-dir", "no such directory")


def test_invalid_utf8_and_nul_bytes_keep_the_verdict(tmp_path: Path) -> None:
    clean = analyze_log(fixture(tmp_path, "real-v0.32-kv-too-small.log"))
    data = (FIXTURES / "real-v0.32-kv-too-small.log").read_bytes()
    lines = data.split(b"\n")
    lines[5] = lines[5] + b" \xff\xfe\xc3\x28 broken \xed\xa0\x80 utf-8"
    lines[20] = b"\x00" * 4096  # a block of NULs, as a crash can leave in a log
    lines.append(b"\x00" * 8192)  # and a tail of them, unterminated
    dirty = analyze_log(write_log(tmp_path / "dirty.log", b"\n".join(lines)))
    assert dirty.verdict.text == clean.verdict.text == "failed: kv_cache_too_small"
    assert [f.kind for f in dirty.sessions[0].failures] == [
        f.kind for f in clean.sessions[0].failures
    ]
    assert dirty.log.unterminated_last_record


def test_binary_bytes_around_real_records_still_give_a_report(tmp_path: Path) -> None:
    junk = bytes(range(256)) * 40
    data = junk + b"\n" + synth_load_log(T0, upto=5) + junk
    r = analyze_log(write_log(tmp_path / "mixed.log", data))
    lp = r.verdict.last_progress
    assert lp is not None and (lp.done, lp.total) == (5, 119)


_RSS = """
import resource, sys
from pathlib import Path
from loadwatch.daemon.tools.analyze import analyze_command
code = analyze_command(Path(sys.argv[1]), model_dir=None, as_json=True, max_record_bytes=65536)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, code, file=sys.stderr)
"""


def _peak_rss_kib(log: Path) -> tuple[int, int, dict[str, Any]]:
    r = subprocess.run(
        [sys.executable, "-c", _RSS, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    rss, code = r.stderr.split()
    return int(rss), int(code), json.loads(r.stdout)


def test_100_mb_without_a_newline_keeps_memory_bounded(tmp_path: Path) -> None:
    small = write_log(tmp_path / "small.log", synth_load_log(T0, upto=3))
    big = tmp_path / "big.log"
    block = b"A" * (1 << 20)
    with open(big, "wb") as fh:
        for _ in range(100):
            fh.write(block)
    os.utime(big, (REF_TS, REF_TS))
    base_kib, _, _ = _peak_rss_kib(small)
    peak_kib, code, doc = _peak_rss_kib(big)
    assert code == 2 and doc["verdict"]["text"] == "incomplete: no vLLM start in the log"
    assert doc["log"]["bytes_read"] == 100 << 20
    assert doc["log"]["cut_records"] == 1 and doc["log"]["unterminated_last_record"]
    # the file is 100 MiB; reading it may cost a few MiB of buffers, not the file
    assert peak_kib - base_kib < 32 * 1024, (base_kib, peak_kib)


# -- the JSON output against the documented schema --------------------------------------------


def documented_keys() -> dict[str, set[str]]:
    """`### <object>` headings in docs/analyze.md, each with the keys of its table."""
    out: dict[str, set[str]] = {}
    current: str | None = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("### "):
            title = line[4:].strip()
            current = (
                "top" if title == "Top level" else title.split("`")[1] if "`" in title else None
            )
            if current is not None:
                out[current] = set()
        elif current is not None and line.startswith("| `"):
            out[current].add(line.split("`")[1])
    return out


def actual_keys(doc: dict[str, Any]) -> dict[str, set[str]]:
    s = doc["sessions"][-1]
    return {
        "top": set(doc),
        "log": set(doc["log"]),
        "model": set(doc["model"]),
        "verdict": set(doc["verdict"]),
        "verdict.last_progress": set(doc["verdict"]["last_progress"]),
        "sessions[]": set(s),
        "sessions[].phases[]": set(s["phases"][0]),
        "sessions[].bars[]": set(s["bars"][0]),
        "sessions[].progress": set(s["progress"]),
        "sessions[].kv_cache": set(s["kv_cache"]),
        "sessions[].warnings[]": set(s["warnings"][0]),
        "sessions[].failures[]": set(s["failures"][0]),
        "sessions[].milestones[]": set(s["milestones"][0]),
        "sessions[].timeline[]": set(s["timeline"][0]),
        "crash_loop": set(doc["crash_loop"]),
        "sessions[].processes[]": set(s["processes"][0]),
    }


def test_json_matches_the_documented_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two starts of real vLLM 0.32 that could not fit their KV cache: a crash loop
    log = fixture(tmp_path, "real-v0.32-supervised-kv-too-small.log")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["DeepseekV3ForCausalLM"]}')
    code, out, _ = cli(["analyze", str(log), "--json", "--model-dir", str(model)], capsys)
    assert code == 1
    doc = json.loads(out)
    documented = documented_keys()
    actual = actual_keys(doc)
    assert set(documented) == set(actual)
    for name, keys in actual.items():
        assert documented[name] == keys, name
    # the example in the docs is valid JSON with the same top-level keys
    text = DOCS.read_text()
    example = json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert set(example) == documented["top"]
    assert set(example["sessions"][0]) == documented["sessions[]"]


# -- events --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["v1-2026-sm120.log", "ray.log", "real-v0.32-llama.log"])
def test_events_match_the_golden_files(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = fixture(tmp_path, name)
    code, out, err = cli(["events", str(log)], capsys)
    assert (code, err) == (0, "")
    golden = (FIXTURES / name.replace(".log", ".events.jsonl")).read_text()
    assert [json.loads(x) for x in out.splitlines()] == [json.loads(x) for x in golden.splitlines()]


def test_events_to_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    log = write_log(tmp_path / "big.log", synth_load_log(T0, upto=119) * 50)
    p = subprocess.Popen(
        [str(LOADWATCH), "events", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert p.stdout is not None and p.stderr is not None
    first = p.stdout.readline()
    p.stdout.close()  # the reader goes away, as `| head -n 1` does
    err = p.stderr.read()
    assert p.wait(timeout=60) == 0
    assert json.loads(first)["type"] and err == b""
