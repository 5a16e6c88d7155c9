"""SIGKILL at random points of a scripted load, fifty times: the state and the event log survive.

A writer thread appends a two-session load (an OOM, then a load to ready, then serving) to a real
log file, a line at a time, sometimes half a line at a time. Meanwhile the real daemon runs as a
subprocess and is killed with SIGKILL after a seeded random time, then started again on the same
state directory, fifty times; some kills land while it re-reads the session, some while it
catches up, a few after it lived long enough to checkpoint. A last daemon then catches up and
its `/status` session is compared with that of one uninterrupted daemon reading the same log.
The event log, shared by all the killed daemons, must hold every parsed event and transition of
the uninterrupted run exactly once, or else marked as a replay.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.sources.log.checkpoint import checkpoint_name
from loadwatch.daemon.tools.demo import make_model_dir
from tests.helpers import records
from tests.reliability.proc import DaemonProc, wait_for
from tests.reliability.script import two_sessions

SEED = 20261130
KILLS = 50
WRITE_S = 25.0  # the writer spreads the script over about this long
LONG_LIVED = {4, 11, 17}

# Fields that depend on the wall clock at the moment of asking, not on the log.
_VOLATILE = {"phase_age_s", "id"}


def _config(tmp: Path) -> Path:
    cfg = tmp / "loadwatch.toml"
    # Stall detection compares the log's time with the wall clock; it is not under test here.
    cfg.write_text(
        "[log]\npoll_interval_s = 0.05\n[forecast]\nstall_floor_s = 86400\n[gpu]\nsource = 'none'\n"
    )
    return cfg


def _args(tmp: Path, log: Path, model: Path | None, name: str) -> list[str]:
    """A daemon's command line: its own state and event log file, named `name`."""
    return [
        "--config",
        str(_config(tmp)),
        "--log",
        str(log),
        "--state-dir",
        str(tmp / f"state-{name}"),
        "--listen",
        "127.0.0.1:0",
        "--events-file",
        str(tmp / f"events-{name}.jsonl"),
        *(["--model-dir", str(model)] if model is not None else []),
    ]


def _session(doc: dict[str, Any]) -> dict[str, Any]:
    s = doc["session"]
    assert s is not None
    out = {k: v for k, v in s.items() if k not in _VOLATILE}
    # the open phase's duration is its age now, and an ETA's finish times are now + remaining
    eta = s["progress"]["eta"]
    if eta is not None:
        out["progress"] = {
            **s["progress"],
            "eta": {k: v for k, v in eta.items() if not k.startswith("finish_")},
        }
    out["history"] = [
        {**h, "duration_s": None} if h["left_at"] is None else h for h in s["history"]
    ]
    return out


# The writer puts the script's ~100 s of stamps into the log in ~25 s. A record read live
# happens at the daemon's clock; one a restarted daemon re-reads is placed at its stamp on the
# daemon's timeline. So with this compressed writer the two disagree on every *when* (times,
# durations, rates) by design, and those are left out here: what is compared is what the log
# says happened (phases in order, bars, counts, layers, failures, milestones). Where re-derived
# times land is tested with a writer at the stamps' own pace: tests/daemon/test_clock_skew.py.
def _clock_derived(path: str) -> bool:
    key = path.rsplit(".", 1)[-1].split("[")[0]
    return (
        key.endswith(("_at", "_since"))
        or key in {"at", "since", "ts", "duration_s", "rate_per_s", "longest_gap_s"}
        or key in {"time_to_ready_s", "weights_load_s", "elapsed_s", "threshold_s", "expected_s"}
        or key in {"remaining_s", "low_s", "high_s", "silent_s"}
    )


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as `path: a != b` lines; clock-derived values are skipped."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            x for i, (p, q) in enumerate(zip(a, b, strict=True)) for x in diff(p, q, f"{path}[{i}]")
        ]
    if _clock_derived(path) and isinstance(a, int | float) and isinstance(b, int | float):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _caught_up(d: DaemonProc) -> bool:
    s = d.status()["session"]
    return bool(s["phase"] == "ready" and s["stall"]["hints"] == 1)


def _identity(e: dict[str, Any]) -> tuple[Any, ...] | None:
    """What makes an event the same event in two runs (not the time it was written)."""
    name = e.get("event", "")
    if name.startswith("log."):
        return (name, e.get("offset"))
    if name.startswith("transition."):
        # One a log record made is that record's: its `at` is the clock of whichever daemon
        # read the record live. Others (a process event, a tick) by their time.
        offset = e.get("offset")
        return (
            name,
            ("offset", offset) if offset is not None else e.get("at"),
            e.get("phase_from"),
            e.get("phase_to"),
            e.get("failure_kind"),
            e.get("reason"),
        )
    return None


def _read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The event log's lines, and how many are not JSON although no kill explains them.

    A kill explains one: the line just before a restarted daemon's first (`daemon.listening`).
    A write that a SIGKILL interrupts may end between two pages of the file (the kernel checks
    for a fatal signal between them); the restarted daemon starts on a fresh line and, the emit
    mark saying that event was not written whole, writes it again.
    """
    good: list[dict[str, Any]] = []
    torn = 0
    bad_last = False
    for line in path.read_bytes().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            torn += 1
            bad_last = True
            continue
        if bad_last and isinstance(doc, dict) and doc.get("event") == "daemon.listening":
            torn -= 1  # cut short by the kill before this restart
        bad_last = False
        good.append(doc)
    return good, torn


class Writer(threading.Thread):
    def __init__(self, path: Path, lines: list[str], rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.path, self.lines, self.rng = path, lines, rng
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            pace = WRITE_S / len(self.lines)
            with self.path.open("ab", buffering=0) as f:
                for line in self.lines:
                    data = line.encode()
                    if len(data) > 8 and self.rng.random() < 0.1:  # half a line, then the rest
                        cut = self.rng.randrange(1, len(data) - 1)
                        f.write(data[:cut])
                        time.sleep(self.rng.uniform(0, pace))  # (real: as vLLM writes)
                        data = data[cut:]
                    f.write(data)
                    # (real: vLLM's pace while the daemon is killed and started again)
                    time.sleep(self.rng.expovariate(1 / pace))
        except BaseException as exc:
            self.error = exc


def _kill_delay(i: int, rng: random.Random) -> float:
    """Seconds after the daemon said it listens: mostly soon (during the re-read or the first
    reads), sometimes later, and three times past the 5 s checkpoint cadence while the writer
    still writes, so later daemons resume from a checkpoint they did not write themselves."""
    if i in LONG_LIVED:
        return rng.uniform(5.1, 5.8)
    return rng.uniform(0.0, 0.3) if rng.random() < 0.6 else rng.uniform(0.3, 1.2)


@pytest.mark.slow  # bounded: see the module docstring
def test_fifty_sigkills_leave_the_state_and_the_event_log_exact(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    model = make_model_dir(tmp_path, fp8_kv=False, shards=8, total_bytes=8 * 10**9)
    lines = two_sessions(model, SEED)
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    args = _args(tmp_path, log, model, "killed")
    writer = Writer(log, lines, random.Random(SEED + 1))

    landed: Counter[str] = Counter()
    startup_s: list[float] = []
    checkpoints: set[bytes] = set()
    cp = tmp_path / "state-killed" / "follower" / checkpoint_name(log)
    mark = cp.with_name(cp.name.replace("follower-", "events-", 1))
    cut_runs = 0
    spawned = 0

    def spawn() -> DaemonProc:
        nonlocal spawned
        spawned += 1
        return DaemonProc(args, tmp_path / f"out-{spawned}.jsonl", prewarm=True)

    # The uninterrupted daemon reads the log as it is written, beside the killed ones: a record
    # read live happens at the daemon's clock, so the times to compare are those of a daemon
    # that read it live too.
    ref = DaemonProc(_args(tmp_path, log, model, "ref"), tmp_path / "out-ref.jsonl", prewarm=True)
    ref.go()
    ref.wait_listening()
    nxt = spawn()
    for i in range(KILLS):
        cur = nxt
        t0 = time.monotonic()
        cur.go()
        cur.wait_listening()
        startup_s.append(time.monotonic() - t0)
        if i == 0:
            writer.start()
        nxt = spawn()
        time.sleep(_kill_delay(i, rng))  # (real: the kill lands amid the daemon's real work)
        cur.kill()
        if cp.exists():
            checkpoints.add(cp.read_bytes())
        if mark.exists() and (m := json.loads(mark.read_bytes()))["pending"] > m["done"]:
            cut_runs += 1  # killed while writing a run's events: the restart completes it
        seen = {e.get("event") for e in cur.events()}
        if "daemon.replay" in seen and "daemon.replay_done" not in seen:
            landed["during the session re-read"] += 1
        elif "daemon.started" not in seen:
            landed["before the loop started"] += 1
        else:
            landed["while following"] += 1
        if writer.is_alive():
            landed["while the writer wrote"] += 1
    writer.join(WRITE_S * 4)
    assert writer.error is None and not writer.is_alive()

    last = nxt
    last.go()
    last.wait_listening()
    try:
        wait_for(lambda: _caught_up(last), "the last daemon to catch up", 60)
        killed = last.status()
    finally:
        assert last.stop() == 0

    try:
        wait_for(lambda: _caught_up(ref), "the uninterrupted daemon", 60)
        reference = ref.status()
    finally:
        assert ref.stop() == 0

    # The state: the current session, field for field, but for the clock-derived ones.
    assert diff(_session(killed), _session(reference)) == []
    s = reference["session"]
    assert s["phase"] == "ready" and s["time_to_ready_s"] is not None
    assert (
        reference["sessions_total"] == 2 and reference["sessions"][0]["failure_kind"] == "cuda_oom"
    )

    # The event log: every event of the uninterrupted run once; repeats only as marked replays.
    # (a folded line by the records it lists: which records a fold holds follows the reads)
    ref_events, ref_torn = _read_events(tmp_path / "events-ref.jsonl")
    got_events, torn = _read_events(tmp_path / "events-killed.jsonl")
    ref_events = records(ref_events)
    got_events = records(got_events)
    want = Counter(k for e in ref_events if (k := _identity(e)) is not None)
    live = Counter(k for e in got_events if not e.get("replay") and (k := _identity(e)) is not None)
    dupes = live - want
    missing = want - live
    print(
        f"\nkills={KILLS} landed={dict(landed)} events={sum(want.values())} "
        f"duplicates={sum(dupes.values())} missing={sum(missing.values())} "
        f"torn_lines={torn} checkpoints_seen={len(checkpoints)} cut_runs={cut_runs} startup_max_s={max(startup_s):.2f} startup_mean_s={sum(startup_s) / len(startup_s):.2f}  replayed={sum(1 for e in got_events if e.get('replay'))}"
    )
    assert ref_torn == 0 and torn == 0
    assert not dupes, f"emitted twice without a replay mark: {sorted(dupes)[:5]}"
    assert not missing, f"lost: {sorted(missing)[:5]}"
