"""Model-based test of the log source alone: every record's effects come out exactly once.

A hypothesis state machine drives vLLM's log (real files in a temporary directory) and the
daemon's side of it: appends of the simulated Kimi-K2.5 start-ups (daemon/sim/kimilog.py),
rotations by rename, copytruncate and logrotate's dateext names, compression of a rotated file
while the daemon is down, truncation of the log (`> PATH`, at a vLLM restart), clean stops,
kills, and kills in the middle of writing a run's effects (also during the catch-up of a backlog
appended while the daemon was down). The daemon's side is the `LogSource` and what the loop does
with its runs: fold the events into a `LoadState`, write the effects through the `EventFeed`
into a real event log file, between the source's `begin` and `end`.

The model is trivially correct: the lines appended, in order. At the end the daemon catches up,
and its event log, across every daemon that wrote to it, must hold (without a replay mark)
exactly the log events a scan of those lines gives, and exactly the state transitions a fold
of those events gives, each once (k/v warnings, which the event log folds, each record by its
time and their sums by layer). (Anchor: Vector's lib/file-source model tests.)

The same model runs over every input that can resume (daemon/sources/log/inputs.py): a plain
file, and a container runtime's log file (CRI, docker's json-file) whose lines wrap the same
output; resuming and exactly-once are the source's, whatever the input. (The journal's input
follows its spool as a plain file: the pump's own exactly-once is tests/logformats/test_journald.py.)

The rotations stay within what the follower keeps (`DEFAULT_ROTATED_KEEP` names): a file rotated
further away is gone, and what it held unread is lost by design (docs/internals.md says so).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)

from loadwatch.daemon.eventfeed import EventFeed
from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.daemon.sources.log.follower import DEFAULT_ROTATED_KEEP
from loadwatch.daemon.sources.log.inputs import ContainerInput, FileInput, LogInput
from loadwatch.daemon.sources.log.source import LogSource, Notice, Run
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.session import StateConfig
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import ChunkScanner, EventStream, KvScaleWarning
from tests.helpers import append, records
from tests.logformats import runtimes

SHAPE = Shape(model="/models/m", shards=4, workers=2, layers=2, shard_s=(1.0, 3.0))
CONFIG = StateConfig(stall_floor_s=10**9)  # no stalls: the facts follow from the lines alone
T_LOG = time.time() - 86400.0  # vLLM's stamps: a day ago, a load every hour


def _lines(seed: int) -> Iterator[tuple[bool, str]]:
    """(the line opens a load, the line), load after load."""
    rng = random.Random(seed)
    clock = SyntheticClock(T_LOG)
    while True:
        first = True
        for line in startup(rng, clock, SHAPE):
            yield first, line
            first = False
        clock.advance(3600)


def _content(e: dict[str, Any]) -> tuple[Any, ...]:
    """A log event's line without where it was read (offsets restart in each file)."""
    return tuple(sorted((k, json.dumps(v)) for k, v in e.items() if k not in ("offset", "time")))


def _kv_layers(lines: list[dict[str, Any]]) -> Counter[int | None]:
    """The k/v warning records the lines stand for, by layer (None: records without one)."""
    out: Counter[int | None] = Counter()
    for e in lines:
        if e["event"] == "log.kv_scale_warning":
            out[e.get("layer")] += 1
        elif e["event"] == "log.kv_scale_run":
            layered = 0
            for layer, records in e.get("layers", []):
                out[layer] += records
                layered += records
            out[None] += e["count"] - layered
    return +out


def _listed(e: dict[str, Any]) -> dict[str, Any]:
    """A k/v warning's line as much of it as a folded line lists (its offset and time)."""
    if e["event"] != "log.kv_scale_warning":
        return e
    return {k: e[k] for k in ("event", "offset", "ts") if k in e}


def _fact(e: dict[str, Any]) -> tuple[Any, ...]:
    """A transition without its times (a replayed one's come from stamps) and its record."""
    keep = ("event", "phase_from", "phase_to", "reason", "failure_kind", "forecast")
    return tuple(e.get(k) for k in keep)


def _input(kind: str, path: Path, state_dir: Path) -> LogInput:
    follow: dict[str, Any] = {"state_dir": state_dir, "poll_interval_s": 0.05, "mode": "poll"}
    if kind == "file":
        return FileInput(path, **follow)
    return ContainerInput(path, "cri" if kind == "cri" else "docker", **follow)


def _wrapped(kind: str, text: str) -> bytes:
    """vLLM's output as the input's file holds it (tests/logformats/runtimes.py)."""
    data = text.encode()
    return (
        data if kind == "file" else runtimes.cri(data) if kind == "cri" else runtimes.docker(data)
    )


class Daemon:
    """The loop's side of the log source: fold, and write each run's effects once."""

    def __init__(self, tmp: Path, kind: str) -> None:
        self.eventlog = EventLog(io.StringIO(), tmp / "events.jsonl", console=False)
        self.feed = EventFeed(self.eventlog)
        self.state = LoadState(config=CONFIG)
        self.source = LogSource(
            _input(kind, tmp / "vllm.log", tmp / "state"),
            state_dir=tmp / "state",
            scanner=lambda: ChunkScanner(EventStream()),
            events_file=tmp / "events.jsonl",
        )

    def take(self, items: list[Run | Notice], *, kill_in: int | None = None, kept: int = 0) -> bool:
        """Apply `items`; with `kill_in`, the daemon dies writing that run's effects after
        `kept` of its events (True: it died)."""
        source = self.source
        runs = 0
        for item in items:
            if isinstance(item, Notice):
                self.feed.notice(item)
                continue
            dies = kill_in is not None and bool(item.events) and runs == kill_in
            runs += 1 if item.events else 0
            source.begin(item, self.feed.position())
            out = self.feed.effects(item)
            for n, ev in enumerate(item.events):
                if dies and n == kept:
                    return True
                before = self.state
                self.state = before.apply(
                    ev, time.time(), replay=item.replay, stamp_offset_s=item.stamp_offset_s
                )
                s = self.state.session
                if s is not None and (before.session is None or s.id != before.session.id):
                    source.session_began(item, ev.offset)
                for t in self.state.transitions:
                    out.transition(t, ev.offset)
                out.event(ev)
            if dies:
                return True
            out.close()
            source.end(item, self.feed.position())
        for notice in source.settle():
            self.feed.notice(notice)
        return False

    def close(self, *, kill: bool) -> None:
        if kill:  # what a SIGKILL leaves: no last checkpoint
            self.source.input.close(checkpoint=False)
            self.source.marks.close()
        else:
            self.source.close()
        self.eventlog.close()


class LogSourceModel(RuleBasedStateMachine):
    kind = "file"  # the input (`[log] input`): its file holds the lines as `_wrapped` writes them

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="lw-model-"))
        self.log = self.tmp / "vllm.log"
        self.log.write_bytes(b"")  # vLLM's stdout, redirected: there before its first line
        self.lines = _lines(0)
        self.next_line = next(self.lines)
        self.appended: list[str] = []
        self.rotated = 0  # rotations so far (each keeps a file under a rotated name)
        self.dated = 0
        self.scheme: str | None = None  # "numbered" or "dated": a host uses one
        self.caught_up = True
        self.daemon: Daemon | None = None
        self.start()
        self.kills = 0
        self.cut_runs = 0

    @initialize(seed=st.integers(0, 10**6))
    def pick_the_loads(self, seed: int) -> None:
        self.lines = _lines(seed)
        self.next_line = next(self.lines)

    # -- vLLM and logrotate -------------------------------------------------------------------

    @rule(n=st.integers(1, 40))
    def append_lines(self, n: int) -> None:
        out = []
        for _ in range(n):
            out.append(self.next_line[1])
            self.next_line = next(self.lines)
        append(self.log, _wrapped(self.kind, "".join(out)))
        self.appended.extend(out)
        self.caught_up = False

    def _can_rotate(self, scheme: str) -> bool:
        return self.rotated < DEFAULT_ROTATED_KEEP - 1 and self.scheme in (None, scheme)

    def _can_copy(self, copy: bool) -> bool:
        """A copytruncate of lines no daemon read yet cannot be followed: the follower knows a
        file by the bytes it delivered of it, and saw none of these (they are at the copy only,
        which nothing ties to our file). With inotify a line is read within milliseconds of its
        write, long before logrotate's next run, so only copies of lines read are tried."""
        return not copy or self.caught_up

    def _shift(self) -> None:
        for i in range(DEFAULT_ROTATED_KEEP - 1, 0, -1):
            for suffix in ("", ".gz"):
                older = Path(f"{self.log}.{i}{suffix}")
                if older.exists():
                    older.rename(f"{self.log}.{i + 1}{suffix}")

    @precondition(lambda self: self._can_rotate("numbered"))
    @rule(copy=st.booleans())
    def rotate_numbered(self, copy: bool) -> None:
        assume(self._can_copy(copy))
        self.scheme, self.rotated = "numbered", self.rotated + 1
        self._shift()
        if copy:  # copytruncate
            shutil.copyfile(self.log, f"{self.log}.1")
            with self.log.open("r+b") as f:
                f.truncate(0)
        else:
            self.log.rename(f"{self.log}.1")
            self.log.write_bytes(b"")

    @precondition(lambda self: self._can_rotate("dated"))
    @rule(copy=st.booleans())
    def rotate_dated(self, copy: bool) -> None:
        assume(self._can_copy(copy))
        self.scheme, self.rotated = "dated", self.rotated + 1
        self.dated += 1
        name = f"{self.log}-{20261100 + self.dated}"
        if copy:
            shutil.copyfile(self.log, name)
            with self.log.open("r+b") as f:
                f.truncate(0)
        else:
            self.log.rename(name)
            self.log.write_bytes(b"")

    @precondition(lambda self: self.daemon is None and self.rotated > 0)
    @rule(data=st.data())
    def compress_a_rotated_file(self, data: st.DataObject) -> None:
        """logrotate's `compress`, while the daemon is down."""
        names = sorted(
            p
            for p in self.tmp.iterdir()
            if p.name.startswith("vllm.log") and p != self.log and p.suffix != ".gz"
        )
        if not names:
            return
        plain = data.draw(st.sampled_from(names))
        st_plain = plain.stat()
        with plain.open("rb") as src, gzip.open(f"{plain}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.utime(f"{plain}.gz", ns=(st_plain.st_atime_ns, st_plain.st_mtime_ns))  # as gzip does
        plain.unlink()

    @precondition(lambda self: self.daemon is not None and self.caught_up and self.next_line[0])
    @rule()
    def truncate_at_a_vllm_restart(self) -> None:
        """`> PATH` as a new vLLM starts: what was there was all read."""
        with self.log.open("r+b") as f:
            f.truncate(0)

    # -- the daemon ---------------------------------------------------------------------------

    @precondition(lambda self: self.daemon is not None)
    @rule()
    def read(self) -> None:
        d = self.daemon
        assert d is not None
        d.take(d.source.read())
        if not d.source.backlog and self.log.exists():
            d.take(d.source.read())  # nothing new: caught up
            self.caught_up = True

    def _checkpointed(self) -> bool:
        """The daemon saved a checkpoint that names a file by bytes it read of it. Killed
        before that, a restart does not know the file the killed daemon read (it starts at the
        path from 0): not covered (see docs/internals.md, "The event log across restarts")."""
        try:
            cp = json.loads((self.tmp / "state" / checkpoint_name(self.log)).read_text())
        except (OSError, ValueError):
            return False
        return int(str(cp["file_id"]).split(":")[2]) > 0

    @precondition(lambda self: self.daemon is not None and self._checkpointed())
    @rule(kill_in=st.integers(0, 8), kept=st.integers(0, 30))
    def killed_writing_a_run(self, kill_in: int, kept: int) -> None:
        """SIGKILL while the effects of a read's runs are being written (a catch-up's, when
        lines were appended while the daemon was down)."""
        d = self.daemon
        assert d is not None
        d.take(d.source.read(), kill_in=kill_in, kept=kept)
        d.close(kill=True)
        self.daemon = None
        self.kills += 1

    @precondition(lambda self: self.daemon is not None)
    @rule(kill=st.booleans())
    def stop(self, kill: bool) -> None:
        assert self.daemon is not None
        assume(not kill or self._checkpointed())
        self.daemon.close(kill=kill)
        self.daemon = None
        self.kills += kill

    @precondition(lambda self: self.daemon is None)
    @rule()
    def start(self) -> None:
        """As the daemon starts: the log source opened, and read at once."""
        self.daemon = Daemon(self.tmp, self.kind)
        self.daemon.take(self.daemon.source.read())
        self.caught_up = False

    # -- the check ----------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            # vLLM goes on writing (a new file at the path is followed once it has data)
            self.append_lines(5)
            if self.daemon is None:
                self.start()
            d = self.daemon
            assert d is not None
            for _ in range(4):
                d.take(d.source.read())
            d.close(kill=False)
            self._check()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _check(self) -> None:
        lines = [json.loads(x) for x in (self.tmp / "events.jsonl").read_text().splitlines() if x]
        logged = [e for e in lines if e["event"].startswith("log.") and not e.get("replay")]
        got_kv = _kv_layers(logged)  # a folded line's records by layer, from its sums
        # and each record once by its time (a folded line by the records it lists): k/v
        # warnings' own fields are summed in folded lines, other events' compared whole
        got_events = Counter(_content(_listed(e)) for e in records(logged))
        got_transitions = Counter(
            _fact(e) for e in lines if e["event"].startswith("transition.") and not e.get("replay")
        )
        # the model: every line appended, scanned in one go, folded in order
        events = ChunkScanner(EventStream()).feed("".join(self.appended).encode(), 0, "model")
        want_events: Counter[tuple[Any, ...]] = Counter()
        want_transitions: Counter[tuple[Any, ...]] = Counter()
        state = LoadState(config=CONFIG)
        feed_lines: list[dict[str, Any]] = []
        want_kv = _kv_layers(
            [
                {"event": "log.kv_scale_warning", "layer": e.layer}
                for e in events
                if type(e) is KvScaleWarning
            ]
        )
        for ev in events:
            fields = {k: v for k, v in ev.to_dict().items() if v is not None and k != "type"}
            if type(ev) is KvScaleWarning:  # what a folded line lists of each record
                fields = {"offset": ev.offset, "ts": ev.ts}
            want_events[
                _content({"event": f"log.{ev.type}", **json.loads(json.dumps(fields))})
            ] += 1
            state = state.apply(ev, time.time())
            for t in state.transitions:
                doc = t.to_dict()
                kind = doc.pop("transition")
                feed_lines.append({"event": f"transition.{kind}", **doc})
        for doc in feed_lines:
            want_transitions[_fact(doc)] += 1
        stats = os.environ.get("LOADWATCH_MODEL_STATS")  # a file: one line of figures a run
        if stats:
            cut = sum(1 for e in lines if e["event"] == "daemon.cut_run")
            n = sum(got_events.values()) + sum(got_transitions.values())
            with open(stats, "a") as f:
                f.write(f"kills={self.kills} cut_runs={cut} effects={n} rotations={self.rotated}\n")
        assert got_kv == want_kv
        assert got_events == want_events, (
            sorted(got_events - want_events)[:3],
            sorted(want_events - got_events)[:3],
        )
        assert got_transitions == want_transitions, (
            sorted(got_transitions - want_transitions)[:3],
            sorted(want_transitions - got_transitions)[:3],
        )


_SHRINK = bool(os.environ.get("LOADWATCH_MODEL_SHRINK"))  # a minimal failing sequence
SETTINGS = settings(
    max_examples=int(os.environ.get("LOADWATCH_MODEL_EXAMPLES", "150")),
    stateful_step_count=30,
    derandomize=True,  # the same examples in every `make test`; LOADWATCH_MODEL_EXAMPLES for more
    deadline=None,
    phases=list(Phase) if _SHRINK else [Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _over(kind: str) -> type[LogSourceModel]:
    """The model over the input `kind`. Named as the model itself: hypothesis derives the
    derandomized examples from the machine's name and source, so every input is put through
    the same sequences of appends, rotations and kills, and a difference is the input's."""
    return type("LogSourceModel", (LogSourceModel,), {"kind": kind})


@pytest.mark.parametrize("kind", ["file", "cri", "docker"])
def test_log_source_against_its_model(kind: str) -> None:
    run_state_machine_as_test(_over(kind), settings=SETTINGS)
