"""SIGKILL while the daemon catches up on a long log: the runs a kill cuts short are completed.

Catching up, the daemon writes events almost all the time, so a kill often lands between the
emit mark's `begin` and `end` of a run of records: some of the run's events are in the event log
file, the rest not. Before each restart another load is appended (a thousand-odd lines, most
of them events), so every daemon has a backlog to work through when it is killed. A last daemon
then catches up, and its event log must hold every parsed event and transition of an
uninterrupted daemon's exactly once, and no log event marked as a replay: the restarts read the
cut runs back from the event log file and write only what it lacks.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.sim.kimilog import Shape, SyntheticClock, startup
from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from tests.helpers import records
from tests.reliability.proc import DaemonProc, wait_for
from tests.reliability.script import server_alive_here
from tests.reliability.test_kill_restart import _args, _identity, _read_events

SEED = 20261201
KILLS = 20
PER_KILL = 3  # loads appended before each restart: a backlog the daemon is still reading
# The event log is compared record by record (a folded line by the records it lists): which
# records a fold holds follows the reads, which the kills change


def _loads(n: int) -> list[str]:
    """n Kimi-like loads, one after another, an hour of log time each."""
    rng = random.Random(SEED)
    clock = SyntheticClock(time.time() - 3600 * (n + 2))
    shape = Shape(model="/models/m", shard_s=(2.0, 4.0))
    out = []
    for _ in range(n):
        out.append(server_alive_here("".join(startup(rng, clock, shape))))
        clock.advance(3600)
    return out


def _caught_up(path: Path, last: int) -> bool:
    events, _ = _read_events(path)
    return any(e.get("offset") == last for e in records(events) if e["event"].startswith("log."))


@pytest.mark.slow  # about a minute
def test_kills_while_catching_up_leave_every_event_once_and_none_marked(tmp_path: Path) -> None:
    rng = random.Random(SEED + 1)
    loads = _loads(PER_KILL * KILLS + 1)
    log = tmp_path / "vllm.log"
    log.write_text(loads[0])
    args = _args(tmp_path, log, None, "killed")
    mark = tmp_path / "state-killed" / "follower" / checkpoint_name(log)
    mark = mark.with_name(mark.name.replace("follower-", "events-", 1))
    cut_runs = 0
    for i in range(KILLS):
        d = DaemonProc(args, tmp_path / f"out-{i}.jsonl", prewarm=True)
        d.go()
        d.wait_listening()
        time.sleep(rng.uniform(0.0, 0.2))  # (real) within the backlog's reading, mostly
        d.kill()
        if mark.exists() and (m := json.loads(mark.read_bytes()))["pending"] > m["done"]:
            cut_runs += 1
        with log.open("a") as f:
            f.write("".join(loads[PER_KILL * i + 1 : PER_KILL * (i + 1) + 1]))
    last = log.stat().st_size - len(loads[-1].splitlines(keepends=True)[-1].encode())

    got, ref = {}, {}
    for name, store in (("killed", got), ("ref", ref)):
        d = DaemonProc(
            _args(tmp_path, log, None, name),
            tmp_path / f"out-{name}.jsonl",
            prewarm=True,
        )
        d.go()
        d.wait_listening()
        events_file = tmp_path / f"events-{name}.jsonl"
        try:
            wait_for(
                lambda f=events_file: _caught_up(f, last), f"the {name} daemon to catch up", 120
            )
        finally:
            assert d.stop() == 0
        events, store["torn"] = _read_events(events_file)
        store["events"] = records(events)

    want: Counter[Any] = Counter(
        k for e in ref["events"] if (k := _identity(e)) is not None and not e.get("replay")
    )
    live: Counter[Any] = Counter(
        k for e in got["events"] if (k := _identity(e)) is not None and not e.get("replay")
    )
    marked = [e for e in got["events"] if e["event"].startswith("log.") and e.get("replay")]
    print(
        f"\nkills={KILLS} cut_runs={cut_runs} events={sum(want.values())} "
        f"duplicates={sum((live - want).values())} missing={sum((want - live).values())} "
        f"marked_log_events={len(marked)} torn_lines={got['torn']}"
    )
    assert cut_runs >= 1, "no kill landed while a run's events were being written"
    assert ref["torn"] == 0 and got["torn"] == 0
    assert live == want, (sorted(live - want)[:5], sorted(want - live)[:5])
    assert not marked, marked[:3]
