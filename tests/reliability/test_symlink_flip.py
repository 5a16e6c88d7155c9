"""A symlinked log flipped back to a target already read (blue/green links).

The daemon follows `vllm.log`, a symlink: to `blue.log` (the first half of
tests/fixtures/real-v0.32-llama.log, a real vLLM 0.32 run), then to `green.log`
(tests/fixtures/real-v0.32-deepseek-kvscales.log, another real run), then back to `blue.log`,
which vLLM has meanwhile written the rest of its run to. Before, the flip back re-read blue.log
from byte 0 and wrote its events twice. Now blue.log, known by its identity and the bytes before
where reading left it, is read on from there: every byte is read once, and the events written
are those of each record once (no event at an offset of blue.log more often than the two files,
read alone by `loadwatch events`, have one there).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from loadwatch.daemon.tools.analyze import LogReader
from tests.helpers import records
from tests.reliability.proc import REPO, DaemonProc, wait_for

FIXTURES = REPO / "tests" / "fixtures"


def _read_bytes(d: DaemonProc) -> float:
    for line in d.get("/metrics")[1].decode().splitlines():
        if line.startswith("loadwatch_log_read_bytes_total "):
            return float(line.split()[1])
    return -1.0


def _point(link: Path, target: Path) -> None:
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target.name)
    os.replace(tmp, link)  # atomically, as a deploy flips it


def _written(events: Path) -> Counter[tuple[str, int]]:
    """(type, offset) of each log event the daemon wrote, a folded line as its records."""
    written = records([json.loads(x) for x in events.read_text().splitlines()])
    return Counter(
        (e["event"].removeprefix("log."), e["offset"])
        for e in written
        if e["event"].startswith("log.")
    )


def _keys(log: Path) -> Counter[tuple[str, int]]:
    """(type, offset) of each event `loadwatch events` finds in the file alone (its reader)."""
    reader = LogReader(log)
    try:
        return Counter((e.type, e.offset) for e in reader.events())
    finally:
        reader.close()


def test_flip_back_resumes_where_it_was(tmp_path: Path) -> None:
    blue_all = (FIXTURES / "real-v0.32-llama.log").read_bytes()
    cut = blue_all.index(b"\n", len(blue_all) // 2) + 1
    green_data = (FIXTURES / "real-v0.32-deepseek-kvscales.log").read_bytes()
    blue, green, link = tmp_path / "blue.log", tmp_path / "green.log", tmp_path / "vllm.log"
    blue.write_bytes(blue_all[:cut])
    green.write_bytes(green_data)
    _point(link, blue)
    events = tmp_path / "events.jsonl"
    d = DaemonProc(
        ["--log", str(link), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0", "--events-file", str(events)],
        tmp_path / "out.jsonl",
    )  # fmt: skip
    d.wait_listening()
    try:
        wait_for(lambda: _read_bytes(d) == cut, "blue.log read")
        _point(link, green)
        wait_for(lambda: _read_bytes(d) == cut + len(green_data), "green.log read")
        with blue.open("ab") as f:
            f.write(blue_all[cut:])
        _point(link, blue)
        total = len(blue_all) + len(green_data)
        # Reading is in order: once the event of blue.log's last record is out, a re-read from
        # 0 would have read (and counted) the bytes before it again.
        last = max(_keys(blue), key=lambda k: k[1])

        def blue_read_to_its_end() -> bool:
            return last in _written(events) and _read_bytes(d) >= total

        wait_for(blue_read_to_its_end, "the rest of blue.log read")
        assert _read_bytes(d) == total  # every byte once
    finally:
        assert d.stop() == 0
    got = _written(events)
    # each record's event once: a (type, offset) twice only where both files have one there
    both = _keys(blue) + _keys(green)
    assert {k: n for k, n in got.items() if n > both[k]} == {}
    assert sum(got.values()) > 100
