"""What reaches the operator's terminal: no control sequence that vLLM's clients or a remote
daemon chose, whichever view draws it (status screen, --watch, analyze report, fleet, demo),
and no rich markup from the log read as markup. The visible text stays."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadwatch.daemon.cli import main
from loadwatch.daemon.tools.analyze import analyze_command, analyze_log
from loadwatch.daemon.tools.demo import Digest
from loadwatch.exporters.terminal.clean import clean_text, one_line
from loadwatch.exporters.terminal.console import make_console, show
from loadwatch.exporters.terminal.fleet import fleet_command
from loadwatch.exporters.terminal.report_text import print_report
from loadwatch.exporters.terminal.watch import render_status, status_command, status_text

from .helpers import model_dir_with, synth_crash, write_log
from .rawhttp import answer_bytes, json_answer, raw_server
from .test_status import T0, mid_load
from .test_status_watch import _read_until

LOADWATCH = Path(sys.executable).with_name("loadwatch")

OSC52 = "\x1b]52;c;SGVsbG8=\x07"  # set the clipboard
CSI = "\x1b[2J\x1b[6n"  # clear the screen; ask the terminal to type its cursor position
DCS = "\x1bP1$qm\x1b\\"  # ask the terminal to answer a query
C1 = "\x9b31m\x9d0;title\x9c\x85\x90q\x9c"  # 8-bit CSI, OSC, ST, NEL, DCS
MARKUP = "[bold red]X[/][link=http://example.invalid]L[/link]"
HOSTILE = OSC52 + CSI + DCS + C1 + MARKUP


def controls_in(text: str) -> list[str]:
    """Every C0 control but \\n and \\t, DEL and every C1 control in `text`."""
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]


SGR = re.compile(r"\x1b\[[0-9;]*m")
CSI_ANY = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


class TtyIO(io.StringIO):
    """A terminal as rich sees one: colour and all."""

    def isatty(self) -> bool:
        return True


def assert_clean(text: str) -> None:
    assert controls_in(text) == [], repr(text)


def assert_clean_colour(text: str) -> None:
    """A coloured frame: rich's own colour codes, and nothing else that is a control."""
    rest = SGR.sub("", text)
    assert controls_in(rest) == [], repr(rest)


# -- the cleaner itself -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\x1b[31mb\x1b[0m", "ab"),
        ("a\x1b[?25l\x1b[38;2;1;2;3mb", "ab"),
        ("x" + OSC52 + "y", "xy"),
        ("x\x1b]0;title\x1b\\y", "xy"),  # OSC ended by ST
        ("x\x1b]0;title\x9cy", "xy"),  # ... by the 8-bit ST
        ("x\x9d52;c;QQ==\x07y", "xy"),  # 8-bit OSC
        ("x\x9b31my", "xy"),  # 8-bit CSI
        ("x" + DCS + "y", "xy"),
        ("x\x1bXsos\x1b\\y\x1b^pm\x1b\\z\x1b_apc\x1b\\w", "xyzw"),
        ("x\x90dcs\x9cy\x98sos\x9cz\x9epm\x9cw\x9fapc\x9cv", "xyzwv"),
        ("\x1b7x\x1b8\x1bc\x1b(B\x1b#8y\x1b=", "xy"),  # other ESC sequences
        ("x\x1b]52;c;AAAA", "x"),  # an OSC never ended hides the rest, as a terminal would
        ("x\x1bPq never ended", "x"),
        ("\x1b[31\x1b]0;t\x07y", "y"),  # a CSI cut by ESC: the ESC starts anew
        ("\x1b]0;t\x18shown", "shown"),  # CAN ends a string
        ("x\x1b", "x"),
        ("x\x9b", "x"),
        ("a\x00b\x07c\x08d\re\x0bf\x0cg\x7fh\x85i\x8dj\x9ck", "abcdefghijk"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("Kimi-K2.5 ✓ 日本語 émoji — 0.15.1", "Kimi-K2.5 ✓ 日本語 émoji — 0.15.1"),
        (HOSTILE, MARKUP),
    ],
)
def test_clean_text(raw: str, shown: str) -> None:
    assert clean_text(raw) == shown


def test_one_line() -> None:
    assert one_line("a\nb\tc \x1b[1m d\r\n") == "a b c d"


@given(st.text(alphabet=st.characters(max_codepoint=0x2FF)))
def test_clean_text_leaves_no_control(text: str) -> None:
    out = clean_text(text)
    assert_clean(out)
    assert clean_text(out) == out
    if not controls_in(text):
        assert out == text


# -- the status screen --------------------------------------------------------------------------


def poisoned(value: Any) -> Any:
    """Every string in a /status document, keys aside, with HOSTILE appended."""
    if isinstance(value, str):
        return value + HOSTILE
    if isinstance(value, list):
        return [poisoned(v) for v in value]
    if isinstance(value, dict):
        return {k: poisoned(v) for k, v in value.items()}
    return value


def hostile_doc() -> dict[str, Any]:
    state, now, _ = mid_load()
    doc: dict[str, Any] = state.snapshot(now + 3).to_dict()
    doc["model"] = {"path": "/models/Kimi", "shards": 119, "errors": ["bad shard"]}
    doc["session"]["failures"] = [
        {"kind": "cuda_oom", "fatal": True, "exc_type": "torch.OutOfMemoryError",
         "message": "CUDA out of memory", "processes": ["Worker_TP0"], "count": 1},
    ]  # fmt: skip
    doc["supervisor"] = {"state": "started", "reason": "a reason"}
    doc["health"] = {"ok": False, "status": 500, "error": "an error"}
    doc["gpus"][0]["name"] = "NVIDIA H200"
    doc["gpus"][1].update(health="lost", error="gone")
    return poisoned(doc)  # type: ignore[no-any-return]


def test_status_screen_as_text() -> None:
    text = status_text(hostile_doc(), width=200)
    assert_clean(text)
    for shown in ("vLLM 0.15.1" + MARKUP, "/models/Kimi" + MARKUP, "CUDA out of memory"):
        assert shown in text, text
    assert "NVIDIA H200" + MARKUP in text and "a reason" in text and "an error" in text


def test_status_screen_in_colour() -> None:
    term = TtyIO()
    show(render_status(hostile_doc(), width=200), term)
    out = term.getvalue()
    assert SGR.search(out), "a terminal gets colour"
    assert_clean_colour(out)
    assert "0.15.1" + MARKUP in SGR.sub("", out)  # markup shown as text, not obeyed


def test_status_command_from_a_hostile_server(capsys: pytest.CaptureFixture[str]) -> None:
    with raw_server(json_answer(json.dumps(hostile_doc()).encode())) as srv:
        code = status_command(srv.url, watch=False, as_json=False, interval_s=1.0)
        out, err = capsys.readouterr()
        assert (code, err) == (0, "")
        assert_clean(out)
        assert "0.15.1[bold red]X[/]" in out
        # --json: the document, with every control escaped as JSON writes it
        code = status_command(srv.url, watch=False, as_json=True, interval_s=1.0)
        out, _ = capsys.readouterr()
        assert code == 0 and controls_in(out) == []
        assert json.loads(out)["session"]["version"] == "0.15.1" + HOSTILE


def test_an_error_line_from_a_hostile_server(capsys: pytest.CaptureFixture[str]) -> None:
    reason = ("Oops" + OSC52 + "\x9b6n").encode("latin-1")
    with raw_server(answer_bytes(b"HTTP/1.1 500 " + reason + b"\r\nContent-Length: 0\r\n\r\n")) as srv:  # fmt: skip
        code = status_command(srv.url, watch=False, as_json=False, interval_s=1.0)
    out, err = capsys.readouterr()
    assert (code, out) == (69, "") and "HTTP 500 Oops" in err
    assert_clean(err)


def test_watch_screen_on_a_terminal() -> None:
    with raw_server(json_answer(json.dumps(hostile_doc()).encode())) as srv:
        pid, fd = pty.fork()
        if pid == 0:  # the child: loadwatch on the pseudo-terminal
            os.environ["COLUMNS"] = "200"
            os.execv(
                str(LOADWATCH),
                [str(LOADWATCH), "status", "--watch", "--interval", "5", "--url", srv.url],
            )
        try:
            seen = _read_until(fd, b"Worker_TP0", 20)
            os.write(fd, b"q")
            seen += _read_until(fd, b"\x00", 1)
        finally:
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(fd)
    screen = seen.decode("utf-8", "replace")
    assert "LOADING" in screen, screen[-500:]
    for bad in ("\x1b]", "\x1bP", "\x1b[6n", "\x1b[2J", "\x07"):
        assert bad not in screen
    rest = CSI_ANY.sub("", screen)  # rich's own: colour, cursor moves, erase line
    assert controls_in(rest.replace("\r", "")) == [], repr(rest)


# -- the analyze report -------------------------------------------------------------------------


def hostile_log(tmp_path: Path) -> Path:
    """A real start-up and OOM (helpers.synth_crash) whose version, model path and error text
    carry what a client could make vLLM print."""
    data = (
        synth_crash(T0, upto=3)
        .replace(b"version 0.15.1", b"version 0.15.1" + HOSTILE.encode())
        .replace(b"/models/Kimi-K2.5-NVFP4", b"/models/Kimi" + HOSTILE.encode())
        .replace(b"GiB is free.", b"GiB is free." + HOSTILE.encode())
    )
    return write_log(tmp_path / "vllm.log", data)


def test_analyze_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = hostile_log(tmp_path)
    code = analyze_command(log, model_dir=None, as_json=False, max_record_bytes=65536)
    out, err = capsys.readouterr()
    assert (code, err) == (1, "")
    assert_clean(out)
    assert "vLLM 0.15.1\n" in out and "GiB is free.[bold" in out  # the version is one word
    assert "red]X[/][link=http://example.invalid]L[/link]" in out
    term = TtyIO()
    print_report(analyze_log(log), term)
    assert_clean_colour(term.getvalue())
    # --json: controls escaped, the text kept
    analyze_command(log, model_dir=None, as_json=True, max_record_bytes=65536)
    out, _ = capsys.readouterr()
    assert controls_in(out.replace("\n", "")) == []
    assert json.loads(out)["sessions"][0]["version"].startswith("0.15.1\x1b]52")


# -- the fleet view and the demo ----------------------------------------------------------------


def test_fleet_view(capsys: pytest.CaptureFixture[str]) -> None:
    doc = {
        "schema": 1,
        "phase": "loading_weights" + HOSTILE,
        "node": {
            "role": {"role": "head" + HOSTILE, "node_rank": 0, "ranks": "0-7" + HOSTILE},
            "progress": {"ratio": 0.5},
        },
    }
    reason = ("Oops" + OSC52).encode("latin-1")
    with (
        raw_server(json_answer(json.dumps(doc).encode())) as good,
        raw_server(
            answer_bytes(b"HTTP/1.1 500 " + reason + b"\r\nContent-Length: 0\r\n\r\n")
        ) as bad,  # fmt: skip
    ):
        code = fleet_command([good.url, bad.url], watch=False, as_json=False, interval_s=1.0)
    out, err = capsys.readouterr()
    assert code == 69 and err == ""
    assert_clean(out)
    assert "head[bold red]X[/]" in out and "HTTP 500 Oops" in out


def test_demo_digest_on_a_terminal() -> None:
    term = TtyIO()
    digest = Digest(make_console(term))
    event = {"event": "vllm.failure", "message": "boom" + HOSTILE, "time": time.time()}
    digest.write(json.dumps(event) + "\n")
    out = term.getvalue()
    assert_clean_colour(out)
    assert "boom[bold red]X[/][link=http://example.invalid]L[/link]" in SGR.sub("", out)


def test_patch_model_diff_quotes_a_hostile_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A downloaded checkpoint's own text: JSON allows raw C1 controls inside strings."""
    model = model_dir_with(tmp_path / "m", [1000, 1000], kv_fp8=True)
    quant = json.loads((model / "hf_quant_config.json").read_text())
    quant["producer"]["name"] = "modelopt" + C1 + MARKUP
    (model / "hf_quant_config.json").write_text(json.dumps(quant, ensure_ascii=False))
    code = main(["patch-model", str(model), "--drop-fp8-kv-cache", "--dry-run"])
    out, _ = capsys.readouterr()
    assert code == 0 and "modelopt" in out and MARKUP in out
    assert_clean(out)
