"""SIGKILLs and log rotations together: the event log matches an uninterrupted daemon's.

vLLM's log is renamed away (PATH -> PATH.1 -> PATH.2 ...) at seeded random moments, sometimes
while the killed daemon is down, sometimes while it reads; every restart appends another load to
the current file first. An uninterrupted daemon follows the same files all along. At the end
both have read everything, and the killed daemons' event log must hold every event and transition
of the uninterrupted one's exactly once without a replay mark. Offsets restart in each file, so a
log event is known by its type, offset and the time of its line (each load is an hour later).

The same with copytruncate rotations (PATH copied to PATH.1, then cut to nothing in place: the
records move to a new inode, the old inode gets the next ones), with kills and with clean stops
(SIGTERM, whose checkpoint is taken where the daemon stands, maybe in a file just cut back).
"""

from __future__ import annotations

import random
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.sources.log.follower import DEFAULT_ROTATED_KEEP
from tests.helpers import records
from tests.reliability.proc import DaemonProc, wait_for
from tests.reliability.test_kill_catchup import _loads
from tests.reliability.test_kill_restart import _args, _identity, _read_events

# 20261202: rotations spread out; 7: four of them in the first three restarts (two back to back,
# so an empty file is rotated too, and the checkpoint's file ends where it was checkpointed);
# 11 (copytruncate): a stop just after a rotation while reading, whose checkpoint then named the
# cut-back, empty file, and a rotation while down after it
SEEDS = (20261202, 7)
RUNS = [
    *((s, "rename", "kill") for s in SEEDS),
    *((s, "copytruncate", "kill") for s in (20261202, 11)),
    (11, "copytruncate", "stop"),
]
KILLS = 16
# The event log record by record: a folded line by the records it lists, each by its offset
# and time (offsets alone repeat from one rotated file to the next)
ROTATIONS = DEFAULT_ROTATED_KEEP - 1  # more, and a daemon down long enough may lose a file


def _key(e: dict[str, Any]) -> tuple[Any, ...] | None:
    k = _identity(e)
    if k is None or e.get("replay"):
        return None
    return (*k, e.get("ts")) if e["event"].startswith("log.") else k


def _rotate(log: Path, how: str) -> None:
    for i in range(DEFAULT_ROTATED_KEEP - 1, 0, -1):
        older = Path(f"{log}.{i}")
        if older.exists():
            older.rename(f"{log}.{i + 1}")
    if how == "rename":
        log.rename(f"{log}.1")
        log.write_bytes(b"")
    else:
        shutil.copyfile(log, f"{log}.1")
        with log.open("r+b") as f:
            f.truncate(0)


@pytest.mark.slow  # about half a minute each
@pytest.mark.parametrize(("seed", "how", "end"), RUNS)
def test_kills_and_rotations_leave_the_event_log_exact(
    tmp_path: Path, seed: int, how: str, end: str
) -> None:
    rng = random.Random(seed)
    loads = _loads(KILLS + 1)
    log = tmp_path / "vllm.log"
    log.write_text(loads[0])
    ref = DaemonProc(_args(tmp_path, log, None, "ref"), tmp_path / "out-ref.jsonl", prewarm=True)
    ref.go()
    ref.wait_listening()
    rotations, when = 0, Counter[str]()
    try:
        for i in range(KILLS):
            d = DaemonProc(
                _args(tmp_path, log, None, "killed"),
                tmp_path / f"out-{i}.jsonl",
                prewarm=True,
            )
            d.go()
            d.wait_listening()
            time.sleep(rng.uniform(0.0, 0.5))  # (real: a kill or rotation amid real reading)
            if rotations < ROTATIONS and rng.random() < 0.25:  # while it reads
                _rotate(log, how)
                rotations, when["reading"] = rotations + 1, when["reading"] + 1
                time.sleep(rng.uniform(0.0, 0.3))  # (real, as above)
            if end == "kill":
                d.kill()
            else:
                assert d.stop() == 0
            if rotations < ROTATIONS and rng.random() < 0.25:  # while it is down
                _rotate(log, how)
                rotations, when["down"] = rotations + 1, when["down"] + 1
            with log.open("a") as f:
                f.write(loads[i + 1])
        last_line = loads[-1].splitlines(keepends=True)[-1]
        last = log.stat().st_size - len(last_line.encode())
        final = DaemonProc(
            _args(tmp_path, log, None, "killed"),
            tmp_path / "out-final.jsonl",
            prewarm=True,
        )
        final.go()
        final.wait_listening()
        try:
            for name in ("ref", "killed"):
                path = tmp_path / f"events-{name}.jsonl"
                wait_for(
                    lambda p=path: any(
                        e.get("offset") == last and e["event"].startswith("log.")
                        for e in records(_read_events(p)[0][-2000:])
                    ),
                    f"the {name} daemon to catch up",
                    120,
                )
        finally:
            assert final.stop() == 0
    finally:
        assert ref.stop() == 0

    want_events, ref_torn = _read_events(tmp_path / "events-ref.jsonl")
    got_events, torn = _read_events(tmp_path / "events-killed.jsonl")
    want = Counter(k for e in records(want_events) if (k := _key(e)) is not None)
    got = Counter(k for e in records(got_events) if (k := _key(e)) is not None)
    print(
        f"\n{how} {end}: restarts={KILLS} rotations={dict(when)} events={sum(want.values())} "
        f"duplicates={sum((got - want).values())} missing={sum((want - got).values())} "
        f"marked_log_events={sum(1 for e in got_events if e['event'].startswith('log.') and e.get('replay'))}"
    )
    assert rotations >= 2 and ref_torn == 0 and torn == 0
    assert got == want, (sorted(got - want)[:5], sorted(want - got)[:5])
