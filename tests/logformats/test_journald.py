"""`[log] journal_unit`: a real journalctl reads a real journal file; each event once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import ConfigError, parse_config
from loadwatch.daemon.sources.log.journal import JournalPump, JournalSource, render
from tests.e2e.realdaemon import DaemonProc, write_config
from tests.helpers import wait_for
from tests.logformats.journal import append, export, vllm_lines
from tests.logformats.test_container_logs import FIXTURES, _log_events, _status, events_of
from tests.ops.common import require

LOG = "real-v0.32-llama.log"


def _journal(tmp_path: Path, lines: list[bytes]) -> Path:
    journal = tmp_path / "host.journal"
    append(journal, export(lines, "vllm.service") + export([b"INFO other unit"], "other.service"))
    return journal


def _spooled(pump: JournalPump, want: int, timeout_s: float = 30) -> None:
    wait_for(lambda: pump.entries >= want, f"{want} entries spooled", timeout_s)


def _units_docs(journal: Path) -> list[dict[str, Any]]:
    """The journal's vllm.service entries, as journalctl's JSON gives them."""
    out = subprocess.run(
        [require("journalctl"), "--file", str(journal), "-o", "json", "--all"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    docs = [json.loads(x) for x in out.splitlines()]
    return [d for d in docs if d.get("_SYSTEMD_UNIT") == "vllm.service"]


def test_the_spool_holds_each_entry_once_after_a_kill_between_append_and_record(
    tmp_path: Path,
) -> None:
    lines = vllm_lines((FIXTURES / LOG).read_bytes())
    journal = _journal(tmp_path, lines)
    full = b"".join(line + b"\n" for line in lines)
    source = JournalSource("vllm.service", file=journal, journalctl=require("journalctl"))
    pump = JournalPump(source, tmp_path / "state")
    pump.start()
    try:
        _spooled(pump, len(lines))
    finally:
        pump.stop()
    assert pump.spool_path.read_bytes() == full  # the other unit's entry is not there
    # The record as it stood 40 entries before the end: a kill after the append and before
    # the record leaves the spool longer than the record says.
    docs = _units_docs(journal)
    k = len(docs) - 40
    size = sum(len(render(d) or b"") for d in docs[:k])
    state = tmp_path / "state" / "journal" / "journal.json"
    state.write_text(json.dumps({"cursor": docs[k - 1]["__CURSOR"], "size": size}))
    again = JournalPump(source, tmp_path / "state")
    again.start()
    try:
        _spooled(again, 40)
        # One entry more (the run's last line again): journalctl gives entries in order, so a
        # repeat of any of the 40 comes before it.
        append(journal, export(lines[-1:], "vllm.service", first=len(lines) + 1))
        _spooled(again, 41)
    finally:
        again.stop()
    assert again.spool_path.read_bytes() == full + lines[-1] + b"\n"
    assert json.loads(state.read_text())["cursor"] == _units_docs(journal)[-1]["__CURSOR"]


def test_the_daemon_reads_the_units_journal_killed_half_way_each_event_once(
    tmp_path: Path,
) -> None:
    raw = (FIXTURES / LOG).read_bytes()
    lines = vllm_lines(raw)
    half = len(lines) // 2
    journal = _journal(tmp_path, lines[:half])
    cfg = write_config(
        tmp_path / "loadwatch.toml",
        {"state_dir": tmp_path / "state", "events_file": tmp_path / "events.jsonl"},
        log={"journal_unit": "vllm.service", "journal_file": journal, "poll_interval_s": 0.1},
        http={"listen": "127.0.0.1:0"},
        gpu={"source": "none"},
    )
    first = DaemonProc(cfg, tmp_path)
    try:
        first.start()
        first.wait(lambda: len(first.named("log.milestone")) >= 3, "the first half read", 30)
    finally:
        first.kill()  # SIGKILL: the journalctl it ran sees its pipe close and ends
    append(journal, export(lines[half:], "vllm.service", first=half))
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
    got: list[dict[str, Any]] = _log_events(second.events())
    assert got == _log_events(want)


@pytest.mark.parametrize(
    ("log", "problem"),
    [
        ({"journal_unit": "vllm.service", "path": "/x.log"}, "not both"),
        ({"journal_file": "/x.journal"}, "goes with journal_unit"),
        (
            {"journal_unit": "v", "journal_file": "/a", "journal_directory": "/b"},
            "journal_file or journal_directory",
        ),
    ],
)
def test_journal_keys_are_checked(tmp_path: Path, log: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config({"log": log})
    cfg = write_config(tmp_path / "bad.toml", {"state_dir": tmp_path / "state"}, log=log)
    run = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 78 and run.stderr.count("\n") == 1, run.stderr
    assert "[log] journal" in run.stderr and problem in run.stderr


def test_journalctl_is_run_as_an_argv_list_after_the_cursor() -> None:
    src = JournalSource("vllm.service")
    assert src.argv(None)[:8] == [
        "journalctl", "-o", "json", "--all", "--follow", "--no-pager", "-u", "vllm.service",
    ]  # fmt: skip
    assert "-b" in src.argv(None) and "--no-tail" in src.argv(None)
    resumed = src.argv("s=1;i=2")
    assert resumed[resumed.index("--after-cursor") + 1] == "s=1;i=2" and "-b" not in resumed


def test_a_message_holding_a_line_break_is_one_line_and_an_endless_one_is_skipped(
    tmp_path: Path,
) -> None:
    """journald splits a service's output at `\\n`, so an entry whose MESSAGE holds one came
    another way (the native protocol, syslog): written out it would forge a line of vLLM's own.
    It is one line. An entry longer than the pump's bound is skipped with one problem line, and
    the entries after it are spooled as ever."""
    lines = vllm_lines((FIXTURES / LOG).read_bytes())[:5]
    forged = b"(APIServer pid=1) INFO 11-30 06:39:37 [entry.py:140] Starting vLLM server on "
    entry = b"hello\n" + forged + b"http://10.0.0.1:1"
    huge = b"x" * 300_000
    journal = _journal(tmp_path, [*lines, entry, huge, lines[0]])
    source = JournalSource("vllm.service", file=journal, journalctl=require("journalctl"))
    problems: list[str] = []
    pump = JournalPump(
        source, tmp_path / "state", on_problem=problems.append, max_entry_bytes=1 << 18
    )
    pump.start()
    try:
        _spooled(pump, len(lines) + 2)
    finally:
        pump.stop()
    spool = pump.spool_path.read_bytes().split(b"\n")
    assert spool[len(lines)] == b"hello " + forged + b"http://10.0.0.1:1"
    assert spool[len(lines) + 1] == lines[0]  # the endless entry is not there, the next one is
    assert [p for p in problems if "skipped" in p] == [
        f"journal: an entry of over {1 << 18} bytes is skipped"
    ]
