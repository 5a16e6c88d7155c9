"""CRI, docker json-file and stdin: real vLLM output inside the runtimes' real line formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.sources.inputs import Chunk
from loadwatch.daemon.sources.log.container import (
    ContainerLogDecoder,
    decode_bytes,
    guess_format,
)
from tests.logformats import runtimes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Real vLLM 0.32 runs on the CPU here (tests/realvllm/capture.py): tqdm bars with \r, a traceback
LOGS = ["real-v0.32-llama.log", "real-v0.32-kv-too-small.log", "real-v0.32-deepseek-fp8kv.log"]
WRAP = {"cri": runtimes.cri, "docker": runtimes.docker}


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=120,
        check=False,
    )


def events_of(path: str, stdin: bytes | None = None) -> list[dict[str, object]]:
    run = cli("events", path, stdin=stdin)
    assert run.returncode == 0, run.stderr
    return [json.loads(x) for x in run.stdout.splitlines()]


@pytest.mark.parametrize("fmt", ["cri", "docker"])
@pytest.mark.parametrize("max_line", [runtimes.MAX_LINE, 97])
@pytest.mark.parametrize("name", LOGS)
def test_the_decoded_content_is_what_vllm_wrote(name: str, fmt: str, max_line: int) -> None:
    raw = (FIXTURES / name).read_bytes()
    wrapped = WRAP[fmt](raw, max_line=max_line)
    assert wrapped != raw and guess_format(Path("x.log"), wrapped) == fmt
    want = raw if raw.endswith(b"\n") else raw + b"\n"
    assert decode_bytes(wrapped, fmt) == want  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["cri", "docker"])
def test_events_of_a_container_log_equal_the_plain_logs(tmp_path: Path, fmt: str) -> None:
    name = "real-v0.32-llama.log"
    plain = events_of(str(FIXTURES / name))
    wrapped = tmp_path / "0.log"
    wrapped.write_bytes(WRAP[fmt]((FIXTURES / name).read_bytes(), max_line=61))
    assert events_of(str(wrapped)) == plain
    # as the kubelet keeps it: the path alone says CRI
    if fmt == "cri":
        pods = tmp_path / "var/log/pods/ns_vllm-0_0123/vllm"
        pods.mkdir(parents=True)
        (pods / "0.log").write_bytes(wrapped.read_bytes())
        assert guess_format(pods / "0.log") == "cri"


def test_the_cri_prefix_no_longer_hides_startup_complete(tmp_path: Path) -> None:
    """The bug: `... stderr F (APIServer pid=..) INFO ... Application startup complete.` read as
    a plain line left the verdict at post_load."""
    log = tmp_path / "vllm.log"
    log.write_bytes(runtimes.cri((FIXTURES / "real-v0.32-llama.log").read_bytes()))
    run = cli("analyze", str(log), "--json")
    assert run.returncode == 0, run.stderr  # 0: ready
    assert json.loads(run.stdout)["verdict"]["phase"] == "ready"


def test_stdin_is_read_with_a_dash() -> None:
    """`kubectl logs POD | loadwatch analyze -` (kubectl prints the content, no CRI prefix)."""
    raw = (FIXTURES / "real-v0.32-kv-too-small.log").read_bytes()
    assert events_of("-", stdin=raw) == events_of(str(FIXTURES / "real-v0.32-kv-too-small.log"))
    run = cli("analyze", "-", "--json", stdin=raw)
    assert run.returncode == 1, run.stderr  # failed: the KV cache does not fit
    # a CRI file piped in is recognised by its first line
    assert events_of("-", stdin=runtimes.cri(raw)) == events_of("-", stdin=raw)
    empty = cli("analyze", "-", stdin=b"")
    assert empty.returncode == 65 and empty.stderr.count(b"\n") == 1, empty.stderr


def test_partial_lines_are_joined_across_reads_and_bars_come_before_their_line_ends() -> None:
    """A tqdm bar is one runtime line of \\r-separated updates, split into P pieces: each update
    is handed on as soon as its \\r is in, not when the bar's line ends minutes later."""
    bar = b"".join(
        f"\rLoading safetensors checkpoint shards: {i}% Completed | {i}/100".encode()
        for i in range(101)
    )
    wrapped = runtimes.cri(bar + b"\n", max_line=100)
    decoder = ContainerLogDecoder("cri")
    got = bytearray()
    lines = wrapped.split(b"\n")[:-1]
    first_p = lines[0] + b"\n"
    out = decoder.decode([Chunk(first_p, 0, "f", len(first_p))])
    assert out and out[0].data.endswith(b"\r") and b"0/100" in out[0].data
    got += out[0].data
    at = len(first_p)
    for line in lines[1:]:
        data = line + b"\n"
        for c in decoder.decode([Chunk(data, at, "f", at + len(data))]):
            assert c.next_offset == at + len(data) and c.offset <= at + len(data)
            got += c.data
        at += len(data)
    assert bytes(got) == bar + b"\n"


def test_a_cri_records_offset_is_its_place_in_the_file() -> None:
    line = b"2026-12-01T10:00:00.000000001Z stderr F INFO 12-01 10:00:00 [api_server.py:1] x\n"
    out = ContainerLogDecoder("cri").decode([Chunk(line * 2, 100, "f", 100 + 2 * len(line))])
    assert [c.data for c in out] == [b"INFO 12-01 10:00:00 [api_server.py:1] x\n"] * 2
    for i, c in enumerate(out):
        start = 100 + i * len(line)
        assert line[c.offset - start :].startswith(b"INFO")
        assert c.next_offset == start + len(line)


def test_a_line_that_is_not_the_runtimes_is_passed_on() -> None:
    data = b"not a cri line\n2026-12-01T10:00:00.1Z stdout F ok\n"
    out = ContainerLogDecoder("cri").decode([Chunk(data, 0, "f", len(data))])
    assert [c.data for c in out] == [b"not a cri line\n", b"ok\n"]


def _log_events(events: list[dict[str, object]]) -> list[dict[str, object]]:
    """The parsed events as the event log writes them, without their offsets (the daemon's are
    the container log's, `loadwatch events` numbers the content)."""
    out = []
    for e in events:
        name = str(e.get("event", ""))
        if name.startswith("log.") and not e.get("replay"):
            out.append({k: v for k, v in e.items() if k not in ("offset", "time")})
    return out


def _status(d: Any) -> dict[str, Any]:
    code, body = d.get("/status")
    return json.loads(body) if code == 200 else {}  # type: ignore[no-any-return]


@pytest.mark.parametrize("fmt", ["cri", "docker"])
def test_the_daemon_follows_a_container_log_killed_half_way_each_event_once(
    tmp_path: Path, fmt: str
) -> None:
    from tests.e2e.realdaemon import DaemonProc, write_config

    raw = (FIXTURES / "real-v0.32-llama.log").read_bytes()
    wrapped = WRAP[fmt](raw, max_line=61)
    log = tmp_path / "vllm.log"
    cut = wrapped.index(b"\n", len(wrapped) // 2) + 1
    log.write_bytes(wrapped[:cut])
    cfg = write_config(
        tmp_path / "loadwatch.toml",
        {"state_dir": tmp_path / "state", "events_file": tmp_path / "events.jsonl"},
        log={"path": log, "poll_interval_s": 0.1, "format": fmt},
        http={"listen": "127.0.0.1:0"},
        gpu={"source": "none"},
    )
    first = DaemonProc(cfg, tmp_path)
    try:
        first.start()
        first.wait(lambda: len(first.named("log.milestone")) >= 3, "the first half read", 30)
    finally:
        first.kill()  # SIGKILL: no last checkpoint
    with log.open("ab") as fh:
        fh.write(wrapped[cut:])
    second = DaemonProc(cfg, tmp_path)
    try:
        second.start()
        second.wait(lambda: _status(second)["session"]["stop_requested"], "the shutdown", 30)
    finally:
        second.kill()
    plain = tmp_path / "plain.log"
    plain.write_bytes(raw)
    want = [
        {"event": f"log.{e.pop('type')}", **{k: v for k, v in e.items() if v is not None}}
        for e in events_of(str(plain))
    ]
    assert _log_events(second.events()) == _log_events(want)


@pytest.mark.parametrize("fmt", ["cri", "docker"])
def test_a_record_split_into_thousands_of_pieces_is_cut_at_the_cap(fmt: str) -> None:
    """A 48 MB line the runtime split into 3,072 pieces of 16 KiB: joined up to the cap (the
    follower's cap on a plain record), the rest dropped as it comes and the record marked cut,
    and the line after it read as ever. (Joined whole, each piece copied all that came before
    it: 48 s of CPU before the next line was seen.)"""
    after = b"INFO 12-01 10:00:01 [api_server.py:1] vLLM API server version 0.32.0\n"
    record = b"x" * (3072 * runtimes.MAX_LINE) + b"\n"
    wrap = runtimes.cri if fmt == "cri" else runtimes.docker
    data = wrap(record) + wrap(after)
    decoder = ContainerLogDecoder(fmt, cap_bytes=1 << 16)  # type: ignore[arg-type]
    out: list[Chunk] = []
    at = 0
    for line in data.splitlines(keepends=True):
        out += decoder.decode([Chunk(line, at, "f", at + len(line))])
        at += len(line)
    assert [c.cut for c in out] == [True, False]
    assert out[0].data == b"x" * (1 << 16) + b"\n" and out[1].data == after
    assert out[0].next_offset <= out[1].offset and decoder.cuts == 1
