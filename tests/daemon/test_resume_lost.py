"""A restart that cannot resume where the last daemon stopped reading says so in one line, and
reads what is there now from its start, writing every event of it once.

The checkpoint names a file and an offset; the current vLLM session may have begun in an older
file (the restart re-reads it as a replay to rebuild the state). When the checkpoint's file is
gone (deleted, rotated further, compressed; or its inode now holds other bytes: vLLM restarted
by a script whose `>` cut the log) or was cut back below the offset, that replay has no end to
run to: the files there now are read as new, and the line names the offset not read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import Config
from loadwatch.parsers import ChunkScanner
from tests.daemon.harness import running
from tests.helpers import records
from tests.reliability.test_emit_mark import (
    _config,
    _lines,
    _load,
    _logged,
    _stopped_at_the_end,
)


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """The problem lines; each must come before the first log event (what it explains)."""
    names = [e["event"] for e in events]
    first_log = next((i for i, n in enumerate(names) if n.startswith("log.")), len(names))
    told = [(i, e.get("error")) for i, e in enumerate(events) if e["event"] == "daemon.problem"]
    assert all(i < first_log for i, _ in told), (first_log, told)  # (the lines, to tell why)
    return [str(e["error"]) for e in events if e["event"] == "daemon.problem"]


def _offsets(text: str) -> list[int]:
    return [ev.offset for ev in ChunkScanner().feed(text.encode())]


def _rotated_mid_session(tmp_path: Path) -> tuple[list[str], int, Path, Config]:
    """A load whose first half is in vllm.log.1 (rotated while a daemon read it) and the rest in
    vllm.log, read to the end by that daemon, which then stopped cleanly: the session began in
    vllm.log.1, the checkpoint is at the end of vllm.log."""
    lines = _lines()
    log = tmp_path / "vllm.log"
    half = len(lines) // 2
    log.write_text("".join(lines[:half]))
    cfg = _config(tmp_path, "state")
    with running(cfg) as d:
        d.wait(
            lambda: len(_logged(records(d.events()))) == len(_offsets("".join(lines[:half]))), "A"
        )
        log.rename(tmp_path / "vllm.log.1")  # rotated: the session goes on in a new file
        log.write_text("".join(lines[half:]))
        d.wait(lambda: d.status()["phase"] == "ready", "the rest of the load")
    return lines, half, log, cfg


def test_the_checkpoints_file_cut_by_a_restart_of_vllm_while_the_session_began_in_an_older_one(
    tmp_path: Path,
) -> None:
    _, _, log, cfg = _rotated_mid_session(tmp_path)
    ino = log.stat().st_ino
    new = _load(7)
    with log.open("r+") as f:  # vLLM started again by `vllm serve ... > vllm.log`
        f.truncate(0)
        f.write("".join(new))
    assert log.stat().st_ino == ino
    with running(cfg) as d:
        d.wait(
            lambda: len(_logged(records(d.events()))) >= len(_offsets("".join(new))), "the new load"
        )
        d.wait(lambda: d.status()["sessions_total"] >= 1, "a session")
        events = records(d.events())
    logged = [e for e in events if e["event"].startswith("log.")]
    assert [e["offset"] for e in logged] == _offsets("".join(new)), "the new load, once"
    assert not any(e.get("replay") for e in logged)
    problems = _problems(events)
    assert len(problems) == 1, problems
    assert "the file the checkpoint names" in problems[0] and "is no longer at" in problems[0]
    assert "from its start" in problems[0]


def test_the_checkpoints_file_deleted_and_the_sessions_too(tmp_path: Path) -> None:
    _, log, cfg = _stopped_at_the_end(tmp_path)
    size = log.stat().st_size
    log.unlink()
    new = _load(7)
    log.write_text("".join(new))
    with running(cfg) as d:
        d.wait(
            lambda: len(_logged(records(d.events()))) >= len(_offsets("".join(new))), "the new load"
        )
        events = records(d.events())
    assert [o for o, _ in _logged(events)] == _offsets("".join(new))
    problems = _problems(events)
    assert len(problems) == 1, problems
    assert f"(at byte {size})" in problems[0] and "is no longer at" in problems[0]


def test_the_checkpoints_file_cut_back_below_it(tmp_path: Path) -> None:
    """Cut back to part of itself (the same first bytes, less than the checkpoint's offset) and
    grown again: read from 0, every event of it written again, and said."""
    lines, log, cfg = _stopped_at_the_end(tmp_path)
    size = log.stat().st_size
    keep = "".join(lines[:10])
    os.truncate(log, len(keep.encode()))
    more = "".join(_load(7)[:10])
    with log.open("a") as f:
        f.write(more)
    assert log.stat().st_size < size
    with running(cfg) as d:
        want = _offsets(keep + more)
        d.wait(lambda: len(_logged(records(d.events()))) >= len(want), "the file again")
        events = records(d.events())
    assert [o for o, _ in _logged(events)] == want
    problems = _problems(events)
    assert len(problems) == 1, problems
    assert f"(at byte {size}) was cut back below that byte" in problems[0]


def test_the_sessions_first_file_gone_while_the_checkpoints_is_there(tmp_path: Path) -> None:
    """The file the session began in is deleted while the daemon is down, the checkpoint's is
    still there, and more is appended to it: the restart says the session's state lacks what
    was logged before the checkpoint, and writes only what came after it."""
    lines, half, log, cfg = _rotated_mid_session(tmp_path)
    (tmp_path / "vllm.log.1").unlink()
    end = log.stat().st_size
    more = "".join(_load(7))
    with log.open("a") as f:
        f.write(more)
    want = [end + o for o in _offsets(more)]
    with running(cfg) as d:
        d.wait(
            lambda: len(_logged(records(d.events()))) >= len(want), "what came after the checkpoint"
        )
        events = records(d.events())
    assert [o for o, _ in _logged(events)] == want
    problems = _problems(events)
    assert len(problems) == 1, problems
    assert "the file the current vLLM session began in" in problems[0] and "is gone" in problems[0]
    assert lines[half:]  # (the checkpoint's file held the second half)


def test_the_checkpoints_file_rotated_past_the_kept_names_the_newer_rotated_one_is_read(
    tmp_path: Path,
) -> None:
    """While the daemon was down the log was rotated so often that the checkpoint's file was
    deleted; the rotated file written after the checkpoint holds the next load, vllm.log the
    one after. Both are read from their start, in that order, and their events written once;
    the line names the rotated file read."""
    _, log, cfg = _stopped_at_the_end(tmp_path)
    size = log.stat().st_size
    log.unlink()
    first, second = _load(7), _load(8)
    rotated = tmp_path / "vllm.log.1"
    rotated.write_text("".join(first))
    log.write_text("".join(second))
    want = _offsets("".join(first)) + _offsets("".join(second))
    with running(cfg) as d:
        d.wait(lambda: len(_logged(records(d.events()))) >= len(want), "both loads")
        d.wait(lambda: d.status()["sessions_total"] == 2, "two sessions")
        events = records(d.events())
    assert [o for o, _ in _logged(events)] == want  # each load once, the rotated file first
    problems = _problems(events)
    assert len(problems) == 1, problems
    assert f"(at byte {size})" in problems[0] and "is no longer at" in problems[0]
    assert f"reading {rotated}, {log} from their start" in problems[0]
