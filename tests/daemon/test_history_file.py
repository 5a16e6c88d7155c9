"""The start history file (daemon/history.py): written whole, read back, bounded, a corrupt or
oversized file set aside with one problem line; and the start a ready transition adds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from loadwatch.daemon.history import FILE_NAME, MAX_BYTES, StartHistory, from_json, to_json
from loadwatch.daemon.state.learned import PER_KEY, TOTAL, PastStart, StartKey, remember
from loadwatch.daemon.state.snapshot import Transition
from tests.state.test_learned import first_start


def past(n: int, model: str = "/models/a") -> PastStart:
    return PastStart(
        StartKey(model=model, version="0.15.1"),
        1000.0 + n,
        (("config", 10.0), ("weights", n)),
        10.0 + n,
    )


def history(tmp_path: Path) -> tuple[StartHistory, list[str]]:
    problems: list[str] = []
    return StartHistory(tmp_path / "state", problems.append), problems


def test_a_save_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    h, problems = history(tmp_path)
    h.save((past(1),))
    first = h.path.stat().st_ino
    h.save((past(1), past(2)))
    assert h.path.stat().st_ino != first  # a new file renamed over the old, not written in place
    assert [p.name for p in h.path.parent.iterdir()] == [FILE_NAME]
    assert h.load() == (past(1), past(2)) and problems == []
    assert h.path.stat().st_mode & 0o777 == 0o600


def test_a_corrupt_file_is_set_aside_with_one_line_and_the_daemon_goes_on(tmp_path: Path) -> None:
    h, problems = history(tmp_path)
    h.path.parent.mkdir()
    for bad in (b"{not json", b'{"format": 1, "starts": [{"key": {}, "steps": [["config", -1]]}]}'):
        h.path.write_bytes(bad)
        assert h.load() == ()
        assert not h.path.exists()
        assert h.path.with_name(FILE_NAME + ".corrupt").read_bytes() == bad
    assert len(problems) == 2 and all("set aside as starts.json.corrupt" in p for p in problems)
    h.save((past(1),))  # and the next start is recorded afresh
    assert h.load() == (past(1),)


def test_an_oversized_file_is_set_aside(tmp_path: Path) -> None:
    h, problems = history(tmp_path)
    h.path.parent.mkdir()
    h.path.write_bytes(b" " * (MAX_BYTES + 1))
    assert h.load() == () and len(problems) == 1 and "larger than" in problems[0]


def test_the_history_is_bounded_per_key_and_in_all() -> None:
    h: tuple[PastStart, ...] = ()
    for n in range(PER_KEY + 5):
        h = remember(h, past(n))
    assert len(h) == PER_KEY and h[0] == past(5) and h[-1] == past(PER_KEY + 4)
    for n in range(TOTAL + 10):
        h = remember(h, past(n, model=f"/models/{n}"))
    assert len(h) == TOTAL and h[-1].key.model == f"/models/{TOTAL + 9}"
    doc = json.loads(to_json(h))
    assert len(doc["starts"]) == TOTAL and from_json(to_json(h)) == h


def test_a_ready_transition_adds_the_start_and_saves_it(tmp_path: Path) -> None:
    state, entry = first_start()
    h, problems = history(tmp_path)
    s = state.session
    assert s is not None and s.ready_at is not None
    other = Transition(kind="phase", at=s.ready_at, session=s.id, phase_to="post_load")
    assert h.learn(state, other) is state and not h.path.exists()
    ready = Transition(kind="phase", at=s.ready_at, session=s.id, phase_to="ready")
    learned = h.learn(state, ready)
    assert learned.config.history == (entry,)
    assert h.load() == (entry,) and problems == []
    # the file holds what the next daemon reads: a copy of the state with that history
    assert replace(state, config=replace(state.config, history=h.load())).config == learned.config
