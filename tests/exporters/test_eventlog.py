from __future__ import annotations

import io
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers.vllm.argv_secrets import Redactor


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in text.splitlines() if x]


def test_one_json_object_per_event_to_stdout_and_file(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "sub" / "events.jsonl"
    log = EventLog(out, path, console=False)
    log.emit("phase_changed", session=1, old="starting", new="loading_weights")
    log.emit("shard_progress", done=3, total=119)
    log.close()
    got = lines(out.getvalue())
    assert [g["event"] for g in got] == ["phase_changed", "shard_progress"]
    assert got[0]["new"] == "loading_weights" and "time" in got[0]
    assert lines(path.read_text()) == got
    assert oct(path.stat().st_mode & 0o777) == "0o640"


@pytest.mark.parametrize(
    "message",
    ["caf\u00e9 \u2014 \x00 \u009b", "plain \x00 \x7f"],
    ids=["not-ascii", "ascii"],
)
def test_each_line_is_what_structlogs_json_chain_renders(message: str) -> None:
    # The same object, key for key and byte for byte but the time: the fields in order, then
    # `event`, then `time`; every value redacted; a value JSON has no type for by its repr;
    # compact, and ASCII only (text beyond it as `\uXXXX`, a C1 control's too). Both of the
    # encoders a line can take: orjson (ASCII text) and the standard one (text beyond it).
    from datetime import datetime

    import structlog

    redactor = Redactor()
    fields = {
        "offset": 4447,
        "layers": ((0, 4), (1, 4)),
        "argv": ["vllm", "serve", "--api-key=s3cret"],
        "message": message,
        "path": Path("/models/m"),
        "ratio": 0.5,
        "none": None,
    }

    def redact(_l: object, _m: str, d: dict[str, object]) -> dict[str, object]:
        return {k: redactor.value(v) for k, v in d.items()}

    chain = structlog.wrap_logger(
        structlog.ReturnLogger(),
        processors=[
            redact,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
            structlog.processors.JSONRenderer(sort_keys=False, separators=(",", ":")),
        ],
    )
    want = chain.info("log.kv_scale_run", **fields)
    assert want.isascii()
    out = io.StringIO()
    log = EventLog(out, console=False, redactor=redactor)
    log.emit("log.kv_scale_run", **fields)
    got = out.getvalue().rstrip("\n")
    cut = got.rindex('"time":"')
    assert got[:cut] == want[: want.rindex('"time":"')]
    stamp = json.loads(got)["time"]
    assert stamp.endswith("Z") and datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_a_value_orjson_refuses_is_still_written() -> None:
    # An int past 64 bits, a key that is not a string, a lone surrogate: the standard encoder's
    out = io.StringIO()
    log = EventLog(out, console=False)
    log.emit("daemon.problem", big=2**70, keys={1: "one"}, text="a\udcff")
    doc = json.loads(out.getvalue())
    assert (doc["big"], doc["keys"], doc["text"]) == (2**70, {"1": "one"}, "a\udcff")
    assert out.getvalue().isascii()


def test_reopen_follows_logrotate(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(io.StringIO(), path, console=False)
    log.emit("a")
    os.rename(path, tmp_path / "events.jsonl.1")
    log.emit("b")  # still goes to the renamed file until reopened
    log.reopen()
    log.emit("c")
    log.close()
    assert [x["event"] for x in lines((tmp_path / "events.jsonl.1").read_text())] == ["a", "b"]
    assert [x["event"] for x in lines(path.read_text())] == ["c"]


def test_secrets_never_reach_the_log(tmp_path: Path) -> None:
    red = Redactor()
    red.learn(
        ["vllm", "serve", "/m", "--api-key", "sk-planted-123"], {"HF_TOKEN": "hf_planted_456"}
    )
    out = io.StringIO()
    path = tmp_path / "e.jsonl"
    log = EventLog(out, path, console=False, redactor=red)
    log.emit(
        "started", argv=["vllm", "--api-key", "sk-planted-123"], note="token hf_planted_456 used"
    )
    log.close()
    for text in (out.getvalue(), path.read_text()):
        assert "sk-planted-123" not in text and "hf_planted_456" not in text
        assert "***" in text


def test_console_rendering_is_not_json() -> None:
    out = io.StringIO()
    log = EventLog(out, console=True)
    log.emit("stall_raised", seconds=300)
    text = out.getvalue()
    assert "stall_raised" in text and "seconds=300" in text
    assert not text.startswith("{")


def test_unwritable_file_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = io.StringIO()
    log = EventLog(out, blocker / "events.jsonl", console=False)  # parent is a file
    log.emit("still_works")
    assert (
        log.write_errors >= 1 and log.last_error and "cannot open the event log" in log.last_error
    )
    assert lines(out.getvalue())[0]["event"] == "still_works"


def test_redactor_forms() -> None:
    red = Redactor()
    red.learn(
        ["--api-key=abcd1234", "--model", "/m", "--hf-token", "tok-xyz"],
        {"MY_SECRET": "zzzz9", "PATH": "/bin"},
    )
    assert red.argv(["--api-key=abcd1234", "tok-xyz"]) == ["--api-key=***", "***"]
    assert red.env({"MY_SECRET": "zzzz9", "PATH": "/bin"}) == {"MY_SECRET": "***", "PATH": "/bin"}
    assert red.value({"a": ["x zzzz9 y", 3]}) == {"a": ["x *** y", 3]}


def test_a_torn_last_line_stays_apart_from_the_next(tmp_path: Path) -> None:
    """A writer killed mid-line leaves a fragment; the next daemon's lines start on a line of
    their own, so only the fragment is unreadable."""
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "a"}\n{"event": "log.prog')
    log = EventLog(io.StringIO(), path, console=False)
    log.emit("b")
    log.close()
    text = path.read_text().splitlines()
    assert text[:2] == ['{"event": "a"}', '{"event": "log.prog']
    assert [json.loads(x)["event"] for x in text[2:]] == ["b"]
    log = EventLog(io.StringIO(), path, console=False)  # a whole last line: nothing added
    log.emit("c")
    log.close()
    assert [json.loads(x)["event"] for x in path.read_text().splitlines()[2:]] == ["b", "c"]


def test_lines_held_for_a_run_come_out_together_in_order(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(io.StringIO(), path, console=False, stdout="none")
    log.emit("before")
    with log.held():
        log.emit("log.shard_progress", done=1)
        other = threading.Thread(target=log.emit, args=("daemon.problem",), kwargs={"error": "x"})
        other.start()
        other.join()  # (a line of another thread meanwhile keeps its place)
        with log.held():  # (within: one hold)
            log.emit("transition.phase", phase="loading_weights")
        log.emit("log.shard_progress", done=2)
        assert path.read_bytes().count(b"\n") == 1  # held: not written yet
    events = [json.loads(line)["event"] for line in path.read_bytes().splitlines()]
    assert events == [
        "before",
        "log.shard_progress",
        "daemon.problem",
        "transition.phase",
        "log.shard_progress",
    ]
    with log.held():
        log.emit("after")
        _file, size = log.position() or ("", 0)  # where the next line goes: after "after"
        assert size == path.stat().st_size
        assert json.loads(path.read_bytes().splitlines()[-1])["event"] == "after"
    log.close()


def test_stdout_lines_held_for_a_run_come_out_together_in_order(tmp_path: Path) -> None:
    """stdout's lines are held with the file's (a write a run, not a line), vLLM's lines passed
    through meanwhile keep their place among them, and the pipe gets whole lines."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    with os.fdopen(write_fd, "w") as out:
        log = EventLog(out, None, console=False, stdout="all")
        with log.held():
            log.emit("log.shard_progress", done=1)
            log.passthrough(b"INFO vllm says\n")
            log.emit("transition.phase", phase="loading_weights")
            with pytest.raises(BlockingIOError):
                os.read(read_fd, 1 << 16)  # held: nothing written yet
        log.emit("after")
        log.close()
    with os.fdopen(read_fd, "rb") as pipe:
        lines = pipe.read().splitlines()
    assert lines[1] == b"INFO vllm says"
    assert [json.loads(x)["event"] for i, x in enumerate(lines) if i != 1] == [
        "log.shard_progress",
        "transition.phase",
        "after",
    ]


def test_position_names_a_regular_file_only(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(io.StringIO(), path, console=False)
    log.emit("a")
    st = path.stat()
    assert log.position() == (f"{st.st_dev}:{st.st_ino}", st.st_size)
    log.close()
    assert EventLog(io.StringIO(), None, console=False).position() is None
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    log = EventLog(io.StringIO(), fifo, console=False)
    assert log.position() is None  # a pipe: its lines cannot be read back
    log.close()


def test_stdout_level_keeps_the_journal_to_what_matters(tmp_path: Path) -> None:
    names = [
        "daemon.started",
        "log.kv_scale_warning",
        "log.shard_progress",
        "transition.phase",
        "log.failure",
        "vllm.started",
        "daemon.problem",
    ]
    seen: dict[str, list[str]] = {}
    for level in ("transitions", "all", "none"):
        out = io.StringIO()
        path = tmp_path / f"{level}.jsonl"
        log = EventLog(out, path, console=False, stdout=level)  # type: ignore[arg-type]
        for n in names:
            log.emit(n)
        log.close()
        assert [x["event"] for x in lines(path.read_text())] == names  # the file keeps all
        seen[level] = [str(x["event"]) for x in lines(out.getvalue())]
    assert seen["all"] == names and seen["none"] == []
    assert seen["transitions"] == [
        "daemon.started",
        "transition.phase",
        "log.failure",
        "vllm.started",
        "daemon.problem",
    ]


def test_events_stdout_is_a_checked_config_key() -> None:
    import pytest

    from loadwatch.daemon.config import ConfigError, parse_config

    assert parse_config({}).events.stdout == "transitions"
    assert parse_config({"events": {"stdout": "all"}}).events.stdout == "all"
    with pytest.raises(ConfigError, match=r"\[events\] stdout: must be one of transitions"):
        parse_config({"events": {"stdout": "some"}})


# A child that writes the event log under a file-size limit: to its file, or to stdout when that
# is a regular file (`loadwatch run >> events.jsonl`); then, with "lift", past the limit again.
LIMITED_WRITER = """
import contextlib, io, json, resource, sys
from pathlib import Path
from loadwatch.exporters.eventlog import EventLog

path, where, then = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
if where.startswith("file"):
    log = EventLog(io.StringIO(), path, console=False)
else:
    log = EventLog(sys.stdout, None, console=False)
with log.held() if where == "file-held" else contextlib.nullcontext():  # (one write of 40)
    for i in range(40):
        log.emit("log.shard_progress", done=i, total=40, note="x" * (i % 7) * 9)
errors, said = log.write_errors, log.last_error
if then == "lift":
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    log.emit("after", ok=True)
log.close()
sys.stderr.write(json.dumps({"errors": errors, "said": said}) + "\\n")
"""


def _limited(limit: int) -> Callable[[], None]:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, no kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return apply


@pytest.mark.parametrize("where", ["file", "file-held", "stdout"])
@pytest.mark.parametrize("then", ["lift", "exit"])
def test_a_write_cut_by_a_file_size_limit_leaves_no_torn_line(
    tmp_path: Path, where: str, then: str
) -> None:
    path = tmp_path / "events.jsonl"
    limit = 1000  # inside a line: the kernel takes its first bytes, then refuses with EFBIG
    with open(path if where == "stdout" else os.devnull, "ab") as out:
        child = subprocess.run(
            [sys.executable, "-c", LIMITED_WRITER, str(path), where, then],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_limited(limit),
            timeout=60,
        )
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stderr.splitlines()[-1])
    assert report["errors"] >= 1  # counted
    if where != "stdout":  # and said, for the daemon's problem line
        assert "cannot write the event log" in report["said"] and "too large" in report["said"]
    data = path.read_bytes()
    assert data.endswith(b"\n")
    events = [json.loads(line)["event"] for line in data.splitlines()]  # every line is whole
    assert events.count("log.shard_progress") >= 5
    if then == "lift":
        assert events[-1] == "after" and len(data) > limit
    else:
        assert len(data) <= limit


def test_a_line_is_stamped_in_utc_to_the_microsecond(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(
        [
            1_795_002_693_000_042_999,  # the microseconds padded to six digits
            1_795_002_693_999_999_000,
            1_795_002_694_000_000_000,  # the next second: its own head
        ]
    )
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    out = io.StringIO()
    log = EventLog(out, console=False)
    for _ in range(3):
        log.emit("daemon.test")
    assert [line["time"] for line in lines(out.getvalue())] == [
        "2026-11-18T11:51:33.000042Z",
        "2026-11-18T11:51:33.999999Z",
        "2026-11-18T11:51:34.000000Z",
    ]


def test_a_runs_lines_share_the_time_their_hold_began(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Lines held for a run are written together, stamped with when the hold began; a line
    outside a hold has its own time."""
    clock = iter(range(1_795_002_693_000_001_000, 1_795_002_694_000_000_000, 1_000))  # +1 µs
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    path = tmp_path / "events.jsonl"
    log = EventLog(io.StringIO(), path, console=False, stdout="none")
    with log.held():
        log.emit("log.shard_progress", done=1)
        log.emit("log.shard_progress", done=2)
    log.emit("after")
    assert [line["time"] for line in lines(path.read_text())] == [
        "2026-11-18T11:51:33.000001Z",
        "2026-11-18T11:51:33.000001Z",
        "2026-11-18T11:51:33.000002Z",
    ]
