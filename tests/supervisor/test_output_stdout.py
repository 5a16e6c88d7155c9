"""`[vllm] output = "file+stdout"`: the supervised vLLM's output, besides its log file, on
loadwatch's own stdout (a container's log: `kubectl logs`), line by line between the event log's
JSON lines, never inside one. The real daemon runs as a subprocess with stdout on a pipe, as a
container runtime gives it, and supervises a real child that prints a real vLLM 0.32 run's output
(tests/fixtures/real-v0.32-client-text.log: tqdm bars, `\\r` inside lines, clients' text) in
pieces of odd sizes, then lines of its own."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from loadwatch.daemon.supervise.logsink import LineCopy
from loadwatch.daemon.tools.analyze_input import WithoutEventLines
from loadwatch.exporters.eventlog import EventLog
from tests.helpers import wait_for
from tests.reliability.proc import DaemonProc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "real-v0.32-client-text.log"
TOKEN = "hf_outputcopytoken0123456789"
# What the child prints after vLLM's output: its own lines, not vLLM's. FORGED is what a
# client's text could make a program print: a line that reads as one of loadwatch's events;
# the next starts as event lines do, and a lenient reader might take it for one too.
FORGED = b'{"event": "vllm.exited", "reason": "forged by a client"}\n'
OWN = (
    b"child: the token is " + TOKEN.encode() + b"\n" + FORGED + b'  {"event" "lenient"}\n'
    b"child: last words, no newline"
)

CHILD = """
import sys
data = open(sys.argv[1], "rb").read() + sys.argv[2].encode("utf-8", "surrogateescape")
out, i, sizes = sys.stdout.buffer, 0, (1, 7, 300, 4096, 33)
while i < len(data):
    n = sizes[i % len(sizes)]
    out.write(data[i : i + n])
    out.flush()
    i += n
"""


def _daemon(tmp_path: Path, output: str | None) -> DaemonProc:
    argv = [sys.executable, "-c", CHILD, str(FIXTURE), OWN.decode()]
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\n[log]\npoll_interval_s = 0.05\n"
        "[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[vllm]\nargv = {json.dumps(argv)}\nrestart = 'never'\npreflight = 'off'\n"
        f"stop_grace_s = 1.0\nenv = {{ HF_TOKEN = '{TOKEN}' }}\n"
        + (f"output = '{output}'\n" if output else "")
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "stdout")
    d.wait_listening()
    return d


def _lines(data: bytes) -> list[bytes]:
    """Lines as a reader of the stream sees them: ended by `\\n` only (not `\\r`)."""
    parts = data.split(b"\n")
    return [p + b"\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _is_event(line: bytes) -> bool:
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and "event" in doc


def test_file_and_stdout_copies_each_line_whole_between_the_events(tmp_path: Path) -> None:
    d = _daemon(tmp_path, "file+stdout")
    try:
        wait_for(lambda: b"child: last words" in d.out.read_bytes(), "the last line on stdout")
        wait_for(lambda: any(e.get("event") == "vllm.exited" and e.get("pid") for e in d.events()),
                 "exit")  # fmt: skip
    finally:
        assert d.stop() == 0, d.stderr()
    written = FIXTURE.read_bytes() + OWN
    assert (tmp_path / "st" / "vllm.log").read_bytes() == written  # the file: all, as written
    stdout = _lines(d.out.read_bytes())
    events = [line for line in stdout if _is_event(line)]
    copied = [line for line in stdout if not _is_event(line)]
    expected = [
        line.replace(TOKEN.encode(), b"***")  # a secret the daemon knows, masked as elsewhere
        for line in _lines(written)
        if not line.lstrip().startswith(b"{")  # could pass for an event: in the file only
    ]
    expected[-1] += b"\n"  # the line vLLM left open ends where its output ended
    assert copied == expected  # each line whole, in order, bytes as vLLM wrote them
    assert all(line.endswith(b"\n") for line in stdout)
    names = [json.loads(e)["event"] for e in events]
    assert "daemon.listening" in names and "vllm.started" in names
    assert [json.loads(e).get("reason") for e in events].count("forged by a client") == 0
    assert "daemon.problem" in names  # the withheld line is said, once


def test_file_alone_is_the_default(tmp_path: Path) -> None:
    d = _daemon(tmp_path, None)
    try:
        wait_for(lambda: any(e.get("event") == "vllm.exited" for e in d.events()), "exit")
    finally:
        assert d.stop() == 0, d.stderr()
    assert (tmp_path / "st" / "vllm.log").read_bytes() == FIXTURE.read_bytes() + OWN
    stdout = _lines(d.out.read_bytes())
    assert stdout and all(_is_event(line) for line in stdout)


def test_line_copy_cuts_only_a_line_longer_than_its_limit() -> None:
    got: list[bytes] = []
    copy = LineCopy(got.append, max_line=8)
    for piece in (b"ab", b"c\rd\nef", b"0123456789", b"\n", b"tail"):
        copy.feed(piece)
    assert got == [b"abc\rd\n", b"ef012345\n", b"6789\n"]
    copy.finish()
    copy.finish()
    assert got[-1] == b"tail\n" and len(got) == 4


def _analysis(stdin: bytes | None, path: str) -> dict[str, object]:
    r = subprocess.run(
        [str(Path(sys.executable).with_name("loadwatch")), "analyze", path, "--json"],
        input=stdin, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    doc = json.loads(r.stdout)
    sessions = doc["sessions"]
    failures = [(f["kind"], f["exc_type"], f["message"]) for s in sessions for f in s["failures"]]
    return {"verdict": doc["verdict"], "sessions": doc["sessions_total"], "failures": failures}


def test_kubectl_logs_of_both_analyzes_as_the_log_alone(tmp_path: Path) -> None:
    """`kubectl logs POD | loadwatch analyze -`: the event lines among vLLM's (one can come in
    the middle of a traceback, as here) are not vLLM's, and are left out of the analysis."""
    log = FIXTURES / "gh-rocm-5680-compose-traceback.log"  # a real traceback (its .source)
    events = io.StringIO()
    eventlog = EventLog(events, console=False)
    eventlog.emit("daemon.listening", url="http://0.0.0.0:9321")
    eventlog.emit("vllm.started", pid=1, argv=["vllm", "serve", "/m"], log="/var/lib/vllm.log")
    for n in range(12):  # a line after every third of vLLM's, through the traceback
        eventlog.emit("transition.phase", phase_to="loading", reason=f"step {n}")
    first, *rest = events.getvalue().encode().splitlines(keepends=True)
    mixed = [first]  # loadwatch's first line comes first, as in `kubectl logs`
    for i, line in enumerate(_lines(log.read_bytes())):
        mixed.append(line if line.endswith(b"\n") else line + b"\n")
        if i % 3 == 1 and rest:
            mixed.append(rest.pop(0))
    mixed += rest
    assert _analysis(b"".join(mixed), "-") == _analysis(None, str(log))


def test_without_event_lines_keeps_every_other_byte() -> None:
    event = b'{"url": "http://127.0.0.1:9321", "event": "daemon.listening", "time": "2026-12-03Z"}'
    kept = b'{"event": "no time: not ours"}\n\r{"event": "x", "time": "y"}\nINFO a\rb\n'
    src = io.BytesIO(event + b"\n" + kept + event + b"\n" + b"last, open")
    reader = WithoutEventLines(src)
    pieces = []
    while piece := reader.read(5):
        pieces.append(piece)
    assert b"".join(pieces) == kept + b"last, open" and reader.dropped == 2
