"""The emit mark, exactly: which re-read records are replayed, written again marked, or live.

A first daemon reads part of a load and stops cleanly (its checkpoint and mark at R). More lines
are appended, and the mark is set as a daemon killed mid-write would leave it: events written up
to D, a run [D, P) being written. A second daemon must rebuild the session from its start
without writing anything before D, write the events in [D, P) marked as replays, and those
after P as usual; everything it read in one chunk, so the chunk is split where replaying ends.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import (
    Config,
    EventsConfig,
    ForecastConfig,
    GpuConfig,
    HttpConfig,
    LogConfig,
)
from loadwatch.daemon.loop import Daemon
from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.gpu.guard import NullGpuSource
from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.daemon.sources.log.emitmark import EmitMark, Identity, Mark, identity, written
from loadwatch.daemon.sources.log.files import FINGERPRINT_BYTES, FileIdentity, fingerprint
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import ChunkScanner
from tests.daemon.harness import Running, running
from tests.helpers import records


def _lines() -> list[str]:
    shape = Shape(model="/models/m", shards=10, workers=2, layers=4)
    return list(startup(random.Random(4), SyntheticClock(time.time() - 600), shape))


def _offsets(lines: list[str]) -> list[int]:
    out, pos = [], 0
    for line in lines:
        out.append(pos)
        pos += len(line.encode())
    return out


@dataclass
class Cut:
    """A log, its lines, and a mark as a daemon killed mid-write of the run [dd, p) leaves it."""

    cfg: Config
    lines: list[str]
    starts: list[int]
    bars: list[int]  # indexes of the shard-bar lines
    r: int  # where the first daemon stopped cleanly
    dd: int
    p: int
    end: int


def _config(tmp_path: Path, name: str, events_file: Path | None = None) -> Config:
    """These tests follow each record's line, the unit a restart knows as written: a folded
    line of k/v warnings by the records it lists (`records`)."""
    return Config(
        log=LogConfig(path=tmp_path / "vllm.log", poll_interval_s=0.05),
        http=HttpConfig(port=0),
        gpu=GpuConfig(source="none"),
        forecast=ForecastConfig(stall_floor_s=86400),
        events=EventsConfig(stdout="all"),
        state_dir=tmp_path / name,
        events_file=events_file,
    )


def _cut(tmp_path: Path, events_file: Path | None = None) -> Cut:
    cfg = _config(tmp_path, "state", events_file)
    log = tmp_path / "vllm.log"
    lines = _lines()
    starts = _offsets(lines)
    bars = [i for i, line in enumerate(lines) if "checkpoint shards:" in line]
    first, done, pending = bars[3], bars[6], bars[8]  # line indexes: R, D and P fall after these
    log.write_text("".join(lines[: first + 1]))
    with running(cfg) as d:
        d.wait(lambda: d.status()["session"]["progress"]["shards_done"] == 3, "three shards")
    log.write_text("".join(lines))
    end = len(log.read_bytes())
    r, dd, p = (starts[i + 1] for i in (first, done, pending))
    state = tmp_path / "state" / "follower"
    cp = json.loads((state / checkpoint_name(log)).read_text())
    assert cp["offset"] == r
    mark = state / checkpoint_name(log).replace("follower-", "events-")
    doc = {"file_id": cp["file_id"], "done": dd, "pending": p}
    if events_file is not None:  # the run's events begin where the event log ends now
        st = events_file.stat()
        doc |= {"events_file": f"{st.st_dev}:{st.st_ino}", "events_at": st.st_size}
    mark.write_text(json.dumps(doc))
    return Cut(cfg, lines, starts, bars, r, dd, p, end)


def test_replay_again_and_live_split_at_the_mark(tmp_path: Path) -> None:
    """With no event log file to read back, the cut run's events are all written, marked."""
    c = _cut(tmp_path)
    cfg, lines, starts, bars, dd, p, end = c.cfg, c.lines, c.starts, c.bars, c.dd, c.p, c.end
    with running(cfg) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        events = records(d.events())
        status = d.status()
    cut = [(e["done"], e["pending"], e["found"]) for e in events if e["event"] == "daemon.cut_run"]
    assert cut == [(dd, p, None)]  # no event log file to read back
    logged = [e for e in events if e["event"].startswith("log.")]
    assert logged and all(e["offset"] >= dd for e in logged), "nothing before D written again"
    again = {e["offset"] for e in logged if e.get("replay")}
    live = {e["offset"] for e in logged if not e.get("replay")}
    assert again and all(dd <= o < p for o in again)
    assert live and all(p <= o < end for o in live)
    at = [starts[i] + lines[i].index("\r") + 1 for i in bars]  # a bar's record follows its `\r`
    assert {o for o in at if dd <= o < p} <= again and len([o for o in at if dd <= o < p]) == 2
    assert {o for o in at if o >= p} <= live
    # the session was rebuilt from its start: every shard counted once
    assert status["session"]["progress"]["shards_done"] == 10
    assert status["sessions_total"] == 1
    phases = [e for e in events if e["event"] == "transition.phase"]
    assert all(e.get("replay") for e in phases if e["phase_to"] == "loading_weights")


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _unmarked(events: list[dict[str, Any]]) -> Counter[Identity]:
    return Counter(
        k for e in events if not e.get("replay") and (k := identity(e["event"], e)) is not None
    )


def test_the_cut_run_is_completed_from_the_event_log(tmp_path: Path) -> None:
    """The killed daemon wrote the cut run's events up to its first shard bar and the folded
    line of the k/v warnings after it; a restart writes the rest of them as usual and none of
    the first again (the event log file is read back: the records a folded line lists count as
    written), folding what is left as the killed daemon would have; compared record by
    record."""
    events = tmp_path / "events.jsonl"
    c = _cut(tmp_path, events)
    first_daemon = _read(events)
    # What an uninterrupted daemon writes for the whole log; its lines from the start of the
    # cut run through the first bar's line and the folded line after it are what the killed
    # daemon wrote before the kill.
    ref_file = tmp_path / "events-ref.jsonl"
    with running(_config(tmp_path, "state-ref", ref_file)) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready (reference)")
    ref = _read(ref_file)
    logged = [i for i, e in enumerate(ref) if e["event"].startswith("log.")]
    begin = 1 + max(i for i in logged if ref[i]["offset"] < c.dd)
    stop = 1 + next(
        i for i in logged if ref[i]["event"] == "log.kv_scale_run" and c.dd < ref[i]["offset"]
    )
    bar = next(b for b in c.bars if c.dd <= c.starts[b] < c.p)
    bar_at = c.starts[bar] + c.lines[bar].index("\r") + 1
    assert any(ref[i]["offset"] == bar_at for i in logged if begin <= i < stop)
    assert ref[stop - 1]["last_offset"] < c.p
    assert any(ref[i]["offset"] >= c.p for i in logged), "the log goes on after the cut run"
    with events.open("a") as f:
        f.writelines(json.dumps(e) + "\n" for e in ref[begin:stop])

    with running(c.cfg) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
    got = _read(events)
    restart = got[len(first_daemon) + stop - begin :]
    cut = [e for e in restart if e["event"] == "daemon.cut_run"]
    assert [(e["done"], e["pending"], e["found"]) for e in cut] == [
        (c.dd, c.p, len(_unmarked(ref[begin:stop])))
    ]
    assert not [e for e in restart if e["event"].startswith("log.") and e.get("replay")]
    # every event from the cut run on once, unmarked, across the kill: those before the bar from
    # the killed daemon, the rest from the restart
    want = _unmarked(records(ref[begin:]))
    have = _unmarked(records(got[len(first_daemon) :]))
    assert have == want, (sorted(have - want)[:5], sorted(want - have)[:5])
    assert _unmarked(records(restart)) == _unmarked(records(ref[stop:]))
    # and folded as the uninterrupted daemon folded them: the same lines
    folds = [e for e in restart if e["event"] == "log.kv_scale_run"]
    assert folds and [e["offsets"] for e in folds] == [
        e["offsets"] for e in ref[stop:] if e["event"] == "log.kv_scale_run"
    ]


def test_read_back_takes_the_lines_from_where_the_run_began(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    # a transition is known by the record that caused it (its offset), not by its `at`
    t_old = {"event": "transition.phase", "at": 1.0, "phase_to": "b", "offset": 150}
    t_new = {"event": "transition.phase", "at": 2.0, "phase_to": "c", "offset": 110}
    t_next = {"event": "transition.phase", "at": 2.0, "phase_to": "d", "offset": 110}
    before = [{"event": "log.progress", "offset": 150}, t_old]  # earlier: another file's record
    run = [
        t_new,
        t_next,  # a second one of that record: the next of its name
        {"event": "log.progress", "offset": 100},
        {"event": "daemon.started"},  # a restarted daemon's own lines follow
        {"event": "log.progress", "offset": 120, "replay": True},  # a marked copy: not written
        {"event": "log.progress", "offset": 250},  # past the run: not the run's
        {"event": "log.milestone", "offset": 130},
        # a folded line: the k/v warnings from 140 to 180, each then known as written
        {"event": "log.kv_scale_run", "offset": 140, "last_offset": 180, "count": 5},
    ]
    head = "".join(json.dumps(x) + "\n" for x in before)
    path.write_text(head + "".join(json.dumps(x) + "\n" for x in run) + "garbage\n" + '{"ev')
    st = path.stat()
    ident = f"{st.st_dev}:{st.st_ino}"
    mark = Mark("1:2:3:0123456789abcdef", 100, 200, ident, len(head))
    found = written(path, mark)
    assert found is not None and found.keys == {
        ("log.progress", 100, 0),
        ("log.milestone", 130, 0),
        ("transition.phase", 110, 0),
        ("transition.phase", 110, 1),
        ("log.kv_scale_run", 140, 0),
    }
    assert found.spans == {"log.kv_scale_warning": [(140, 180)]}
    assert ("log.kv_scale_warning", 140, 0) in found and ("log.kv_scale_warning", 180, 0) in found
    assert ("log.kv_scale_warning", 181, 0) not in found and ("log.progress", 150, 0) not in found
    assert identity("transition.phase", t_new) == ("transition.phase", 110)
    assert identity("transition.stall_raised", {"at": 3.0}) is None  # a tick's: no record
    # not known: no position in the mark, another file there now, or a shorter one
    assert written(path, Mark(mark.file_id, 100, 200)) is None
    assert written(path, Mark(mark.file_id, 100, 200, "0:0", len(head))) is None
    assert written(path, Mark(mark.file_id, 100, 200, ident, st.st_size + 1)) is None
    assert written(tmp_path / "absent.jsonl", mark) is None
    assert written(path, mark, limit=10) is None
    fifo = tmp_path / "events.fifo"  # a FIFO there (no writer): not read, and no hang
    os.mkfifo(fifo)
    assert written(fifo, mark) is None


def test_the_mark_names_the_event_log_file_and_survives_a_reload(tmp_path: Path) -> None:
    marks = EmitMark(tmp_path / "mark")
    marks.begin("1:2:3:0123456789abcdef", 10, 20, ("5:6", 777))
    assert marks.load() == Mark("1:2:3:0123456789abcdef", 10, 20, "5:6", 777)
    marks.end("1:2:3:0123456789abcdef", 20)
    assert marks.load() == Mark("1:2:3:0123456789abcdef", 20, 20)  # no event log file
    marks.close()


def test_the_daemon_notes_the_event_log_position_with_each_run(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    cfg = _config(tmp_path, "state", events)
    (tmp_path / "vllm.log").write_text("".join(_lines()))
    eventlog = EventLog(io.StringIO(), events, console=False)
    daemon = Daemon(cfg, eventlog=eventlog, gpu=NullGpuSource())
    source = daemon.open_log()
    assert source is not None
    daemon.take_log(source.read())
    st = events.stat()
    assert st.st_size > 0
    name = checkpoint_name(tmp_path / "vllm.log").replace("follower-", "events-")
    doc = json.loads((tmp_path / "state" / "follower" / name).read_text())
    assert (doc["events_file"], doc["events_at"]) == (f"{st.st_dev}:{st.st_ino}", st.st_size)
    source.input.close(checkpoint=False)
    eventlog.close()


def test_the_mark_holds_when_the_log_was_rotated_while_the_daemon_was_down(tmp_path: Path) -> None:
    """The killed daemon's file is now vllm.log.1 and a new load is in vllm.log: the restart
    resumes in vllm.log.1 from its checkpoint, and the mark still says what was written there."""
    c = _cut(tmp_path)
    log = tmp_path / "vllm.log"
    log.rename(tmp_path / "vllm.log.1")
    log.write_text("".join(_lines()))  # the next start of vLLM, in a new file
    old, _new = _restart_split(c)
    assert old and all(o >= c.dd for o, _ in old), "nothing before D of the old file again"
    assert {o for o, marked in old if marked} == {o for o, _ in old if o < c.p}


def _restart_split(c: Cut) -> tuple[list[tuple[int, bool]], list[tuple[int, bool]]]:
    """Restart on the cut log with a new start of vLLM in the new file; the log events written
    as (offset, marked), split where the offsets start again: the old file's, the new one's."""
    with running(c.cfg) as d:
        d.wait(lambda: d.status()["sessions_total"] == 2, "the new file's session")
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        events = records(d.events())
    offsets = [
        (e["offset"], bool(e.get("replay"))) for e in events if e["event"].startswith("log.")
    ]
    split = next(i for i in range(1, len(offsets)) if offsets[i][0] < offsets[i - 1][0])
    return offsets[:split], offsets[split:]


def _load(seed: int) -> list[str]:
    """The lines of another start of vLLM (its first line differs from `_lines()`'s)."""
    shape = Shape(model="/models/m", shards=10, workers=2, layers=4)
    return list(startup(random.Random(seed), SyntheticClock(time.time() - 300 / seed), shape))


def _copytruncate(log: Path, seed: int = 5) -> list[str]:
    """Rotate `log` as logrotate's copytruncate does (vllm.log.1 renamed to vllm.log.2, the log
    copied to vllm.log.1, a new inode; then cut to nothing in place) and write the next start
    of vLLM into it (other first bytes)."""
    older = log.with_name("vllm.log.1")
    if older.exists():
        older.rename(log.with_name("vllm.log.2"))
    shutil.copyfile(log, older)
    new = _load(seed)
    ino = log.stat().st_ino
    with log.open("r+") as f:
        f.truncate(0)
        f.write("".join(new))
    assert log.stat().st_ino == ino
    return new


def test_the_mark_holds_when_the_log_was_copied_and_truncated_while_the_daemon_was_down(
    tmp_path: Path,
) -> None:
    """As above with a copytruncate rotation: the killed daemon's records are in the copy
    vllm.log.1 (a new inode), where the restart resumes from its checkpoint, and the mark still
    says what was written there; the cut-back vllm.log (the old inode) is all new."""
    c = _cut(tmp_path)
    new = _copytruncate(tmp_path / "vllm.log")
    old, fresh = _restart_split(c)
    assert old and all(o >= c.dd for o, _ in old), "nothing before D of the old file again"
    assert {o for o, marked in old if marked} == {o for o, _ in old if o < c.p}
    want = [ev.offset for ev in ChunkScanner().feed("".join(new).encode())]
    assert fresh == [(o, False) for o in want], "the new file's events, once, live"


def _ident(path: Path) -> str:
    """The follower's identity of a file (inode, first bytes)."""
    st = path.stat()
    head = path.read_bytes()[:FINGERPRINT_BYTES]
    return str(FileIdentity(st.st_dev, st.st_ino, len(head), fingerprint(head)))


def _logged(events: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(e["offset"], e["ts"]) for e in events if e["event"].startswith("log.")]


def test_no_checkpoint_reading_starts_at_the_marks_file_even_rotated(tmp_path: Path) -> None:
    """Killed before its first checkpoint, after writing the events of the first D bytes of
    vllm.log, which was then rotated to vllm.log.1: the restart reads vllm.log.1 from 0 (the
    state rebuilt), writes its events from D on, then those of the new vllm.log."""
    lines = _lines()
    log, old = tmp_path / "vllm.log", tmp_path / "vllm.log.1"
    log.write_text("".join(lines))
    starts = _offsets(lines)
    dd = starts[len(lines) // 2]
    state = tmp_path / "state" / "follower"
    state.mkdir(parents=True)
    mark = state / checkpoint_name(log).replace("follower-", "events-")
    mark.write_text(json.dumps({"file_id": _ident(log), "done": dd, "pending": dd}))
    log.rename(old)
    log.write_text("".join(lines[:20]))  # the next start of vLLM, in a new file
    with running(_config(tmp_path, "state")) as d:
        d.wait(lambda: d.status()["sessions_total"] == 2, "the new file's session")
        events = records(d.events())
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "vllm.log").write_text("".join(lines))
    with running(_config(tmp_path / "ref", "state")) as ref:
        ref.wait(lambda: ref.status()["phase"] == "ready", "ready (reference)")
        want = [o for o, _ in _logged(records(ref.events()))]
    got = [o for o, _ in _logged(events)]
    first_new = next(i for i in range(1, len(got)) if got[i] < got[i - 1])
    new_size = len("".join(lines[:20]).encode())
    assert got[:first_new] == [o for o in want if o >= dd], "the old file's rest, once"
    assert got[first_new:] == [o for o in want if o < new_size], "then the new file from 0"


def test_a_mark_in_a_newer_file_replays_the_files_before_it(tmp_path: Path) -> None:
    """The killed daemon followed a rotation after its last checkpoint and wrote events in the
    new file up to D: the restart resumes in the old file (now vllm.log.1), re-reads the rest of
    it as a replay, and writes the new file's events from D on."""
    c = _cut(tmp_path)  # checkpoint at R in vllm.log, which has the whole load
    log = tmp_path / "vllm.log"
    log.rename(tmp_path / "vllm.log.1")
    log.write_text("".join(c.lines))  # the next start of vLLM, in a new file
    dd = c.starts[len(c.lines) // 2]
    state = tmp_path / "state" / "follower"
    mark = state / checkpoint_name(log).replace("follower-", "events-")
    mark.write_text(json.dumps({"file_id": _ident(log), "done": dd, "pending": dd}))
    with running(c.cfg) as d:
        d.wait(lambda: d.status()["sessions_total"] == 2, "the new file's session")
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        events = records(d.events())
    got = _logged(events)
    assert got and all(o >= dd for o, _ in got), "nothing of the old file, nor the new before D"
    assert len(got) == len(set(got))


@contextmanager
def _ready(tmp_path: Path) -> Iterator[tuple[list[str], Path, Config, Running]]:
    """A load in vllm.log, read to `ready` by a running daemon (stopped cleanly on leaving)."""
    lines = _lines()
    log = tmp_path / "vllm.log"
    log.write_text("".join(lines))
    cfg = _config(tmp_path, "state")
    with running(cfg) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        yield lines, log, cfg, d


def _stopped_at_the_end(tmp_path: Path) -> tuple[list[str], Path, Config]:
    """A load in vllm.log, read to the end by a daemon that then stopped cleanly (checkpoint at
    the end, the session began at 0)."""
    with _ready(tmp_path) as (lines, log, cfg, _d):
        pass
    return lines, log, cfg


@pytest.mark.parametrize("rotated", ["vllm.log.1", "vllm.log-20261130", "vllm.log.1.gz"])
def test_replay_ends_when_the_checkpoints_file_ends_and_was_rotated(
    tmp_path: Path, rotated: str
) -> None:
    """A clean stop at the end of vllm.log (checkpoint there, the session began at 0), which is
    then rotated (to a numbered name, a dated one as logrotate's `dateext` does, or compressed
    as its `compress` does), with the next load in a new vllm.log: the restart re-reads the old
    file as a replay up to the checkpoint, which no record of that file lies after, and the new
    file is live."""
    lines, log, cfg = _stopped_at_the_end(tmp_path)
    if rotated.endswith(".gz"):
        with gzip.open(tmp_path / rotated, "wb") as gz:
            gz.write(log.read_bytes())
        log.unlink()  # its inode is free: the new file may well get it
    else:
        log.rename(tmp_path / rotated)
    # the next start of vLLM: its own first line (another start's first bytes differ, as its
    # time and pid do), then the same load
    new = "".join(["(APIServer pid=2) INFO 11-30 12:00:00 [cli.py:1] restarted\n", *lines[:20]])
    log.write_text(new)
    with running(cfg) as d:
        d.wait(lambda: d.status()["sessions_total"] == 2, "the new file's session")
        d.wait(
            lambda: any(e["event"] == "daemon.replay_done" for e in records(d.events())),
            "replay done",
        )
        events = records(d.events())
    got = [o for o, _ in _logged(events)]
    new_size = len(new.encode())
    assert got and all(o < new_size for o in got), "the new file's events, live"
    assert len(got) == len(set(got))
    assert not [e for e in events if e["event"] == "daemon.problem"], "the old file was found"


def test_replay_ends_when_the_checkpoints_file_was_copied_and_truncated(tmp_path: Path) -> None:
    """As above, with a copytruncate rotation while no daemon ran: vllm.log copied to vllm.log.1
    (a new inode), cut to nothing and the next start of vLLM written into it (the old inode,
    other first bytes). The restart replays the copy up to the checkpoint. The cut-back file's
    records are new though its inode is the checkpoint's: they are written, live."""
    _, log, cfg = _stopped_at_the_end(tmp_path)
    new = _copytruncate(log)
    with running(cfg) as d:
        d.wait(lambda: d.status()["sessions_total"] == 2, "the new file's session")
        d.wait(
            lambda: any(e["event"] == "daemon.replay_done" for e in records(d.events())),
            "replay done",
        )
        want = [ev.offset for ev in ChunkScanner().feed("".join(new).encode())]
        d.wait(lambda: len(_logged(records(d.events()))) >= len(want), "the new file's events")
        events = records(d.events())
    logged = [e for e in events if e["event"].startswith("log.")]
    assert [e["offset"] for e in logged] == want
    assert not any(e.get("replay") for e in logged)
    started = [e for e in events if e["event"] == "transition.session_started"]
    assert [bool(e.get("replay")) for e in started] == [True, False]


def test_a_mark_in_a_newer_file_holds_in_its_copy(tmp_path: Path) -> None:
    """As above, and the newer file, in which the killed daemon wrote events up to D, was then
    rotated by copytruncate before the restart: the restart finds the mark's file in the copy
    (vllm.log.1, another inode), re-reads the old file (vllm.log.2) and the copy up to D as a
    replay, and writes the rest of the copy's events and all of the cut-back vllm.log's."""
    c = _cut(tmp_path)  # checkpoint at R in vllm.log, which has the whole load
    log = tmp_path / "vllm.log"
    log.rename(tmp_path / "vllm.log.1")
    second = _load(6)  # the next start of vLLM, in a new file
    log.write_text("".join(second))
    starts = _offsets(second)
    dd = starts[len(second) // 2]
    state = tmp_path / "state" / "follower"
    mark = state / checkpoint_name(log).replace("follower-", "events-")
    mark.write_text(json.dumps({"file_id": _ident(log), "done": dd, "pending": dd}))
    third = _copytruncate(log, seed=7)  # while the daemon is down
    with running(c.cfg) as d:
        d.wait(lambda: d.status()["sessions_total"] == 3, "the third file's session")
        want = [ev.offset for ev in ChunkScanner().feed("".join(third).encode())]
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        events = records(d.events())
    got = [o for o, _ in _logged(events)]
    rest = [ev.offset for ev in ChunkScanner().feed("".join(second).encode()) if ev.offset >= dd]
    assert got == rest + want, "the copy's events from D on, then the cut-back file's, once"


def test_a_checkpoint_of_the_empty_file_and_a_mark_of_its_first_bytes_name_one_file(
    tmp_path: Path,
) -> None:
    """The first daemon found vllm.log empty and checkpointed it so (an identity of no bytes,
    which names whatever the inode holds), then read the first D bytes, wrote their events
    under the file's identity of its first bytes, and was killed before its next checkpoint.
    Both notes name the same file: the restart writes nothing before D again. (Seen in the
    50-kill run: the restart took the file by the checkpoint's name, the mark by the other, and
    wrote the session's first events twice.)"""
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    cfg = _config(tmp_path, "state")
    with running(cfg) as d:
        d.wait(lambda: "phase" in d.status(), "the daemon to follow the empty log")
    state = tmp_path / "state" / "follower"
    cp = json.loads((state / checkpoint_name(log)).read_text())
    assert cp["offset"] == 0 and cp["file_id"].split(":")[2] == "0", cp  # the empty file's
    lines = _lines()
    log.write_text("".join(lines))
    dd = _offsets(lines)[len(lines) // 2]
    mark = state / checkpoint_name(log).replace("follower-", "events-")
    mark.write_text(json.dumps({"file_id": _ident(log), "done": dd, "pending": dd}))
    with running(cfg) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        events = records(d.events())
    got = _logged(events)
    assert got and all(o >= dd for o, _ in got), "nothing before D written again"
    assert not [
        e for e in events if e["event"] == "transition.session_started" and not e.get("replay")
    ]


def test_a_copytruncate_then_a_rename_rotation_then_a_clean_restart_starts_no_session(
    tmp_path: Path,
) -> None:
    """The log is cut to nothing in place (its copy at vllm.log.1) while the daemon follows it,
    vLLM starts again into it, then the log is renamed away (vllm.log.1) for a new one, and the
    daemon stops cleanly: its checkpoint names the file it last read. A restart finds that file
    at its rotated name and rebuilds the current session from its start, as a replay: no new
    session (the first daemon read an empty file between the two rotations, as in the 50-kill
    run's case above)."""
    with _ready(tmp_path) as (_, log, cfg, d):
        shutil.copyfile(log, tmp_path / "vllm.log.1")
        with log.open("r+") as f:
            f.truncate(0)
        d.wait(lambda: _truncations(d) == 1, "the empty file read")
        with log.open("a") as f:
            f.write("".join(_load(9)))
        d.wait(lambda: d.status()["sessions_total"] == 2, "the second start")
        d.wait(lambda: d.status()["phase"] == "ready", "ready again")
        (tmp_path / "vllm.log.1").rename(tmp_path / "vllm.log.2")
        log.rename(tmp_path / "vllm.log.1")
        log.write_text("")
        time.sleep(0.3)  # (real: the rename is seen before the stop, or not)
    with running(cfg) as d:
        d.wait(lambda: d.status()["phase"] == "ready", "ready after the restart")
        d.wait(
            lambda: any(e["event"] == "daemon.replay_done" for e in records(d.events())),
            "the replay's end",
        )
        events = records(d.events())
        status = d.status()
    started = [e for e in events if e["event"] == "transition.session_started"]
    assert started and all(e.get("replay") for e in started), started
    assert status["sessions_total"] == 1  # the current session, rebuilt once


def _truncations(d: Any) -> float | None:
    """The daemon's count of truncations followed, from /metrics (None: not there yet)."""
    for line in d.get("/metrics")[1].decode().splitlines():
        if line.startswith("loadwatch_log_truncations_total"):
            return float(line.split()[-1])
    return None
