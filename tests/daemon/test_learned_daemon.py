"""The daemon keeps the start history: a start that gets ready is written to
`<state_dir>/starts.json`, and a daemon started later reads it, so a repeat start has an ETA to
ready from its first line; a corrupt file is set aside with one `daemon.problem` line."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadwatch.daemon.config import Config, LogConfig
from loadwatch.daemon.history import FILE_NAME
from loadwatch.daemon.tools.demo import make_model_dir
from tests.daemon.harness import running
from tests.daemon.test_daemon import SHARDS, config, script
from tests.helpers import append


def learned(cfg: Config, lines: list[str]) -> Any:
    """The start history a daemon wrote after following `lines` to ready."""
    starts = cfg.state_dir / FILE_NAME
    with running(cfg) as d:
        append(cfg.log.path, lines)  # type: ignore[arg-type]
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        d.wait(starts.exists, "the history written")
    return json.loads(starts.read_text())


def test_a_ready_start_is_learned_and_a_later_daemon_uses_it(tmp_path: Path) -> None:
    cfg = config(tmp_path, None)
    lines = script(tmp_path / "model")
    doc = learned(cfg, lines)
    assert len(doc["starts"]) == 1 and doc["starts"][0]["key"]["version"] == "0.15.1"
    # another daemon, another log: the repeat start's first line
    again = replace(cfg, log=LogConfig(path=tmp_path / "again.log", poll_interval_s=0.05))
    with running(again) as d:
        append(again.log.path, lines[:1])  # type: ignore[arg-type]
        d.wait(lambda: d.status()["session"] is not None, "a session")
        eta = d.status()["session"]["startup_eta"]
        assert eta is not None and eta["past_starts"] == 1 and eta["step"] == "config"
        assert "loadwatch_startup_eta_seconds" in "".join(d.metrics())


def test_a_corrupt_history_is_set_aside_and_the_daemon_goes_on(tmp_path: Path) -> None:
    cfg = config(tmp_path, None)
    cfg.state_dir.mkdir()
    (cfg.state_dir / FILE_NAME).write_text('{"format": 1, "starts": "many"}')
    with running(cfg) as d:
        append(cfg.log.path, script(tmp_path / "model")[:1])  # type: ignore[arg-type]
        d.wait(lambda: d.status()["session"] is not None, "a session")
        assert d.status()["session"]["startup_eta"] is None
        problems = [e for e in d.events() if e["event"] == "daemon.problem"]
    assert len(problems) == 1 and "set aside as starts.json.corrupt" in problems[0]["error"]
    assert (cfg.state_dir / (FILE_NAME + ".corrupt")).exists()


def test_starts_are_keyed_by_the_page_cache_the_daemon_finds_them_on(tmp_path: Path) -> None:
    """The daemon looks at the configured model's page cache as a start begins (the real
    kernel's): a start on a cold cache is learned as cold, and a later start of the same model on
    a warm cache does not take its time from it."""
    model = make_model_dir(tmp_path, fp8_kv=False, shards=SHARDS, total_bytes=SHARDS << 20)
    cfg = config(tmp_path, model)  # (sparse shards never read: nothing of them is cached)
    lines = script(model)
    doc = learned(cfg, lines)
    assert [s["key"].get("cache") for s in doc["starts"]] == ["cold"]
    for shard in model.glob("*.safetensors"):
        shard.read_bytes()  # warm now
    again = replace(cfg, log=LogConfig(path=tmp_path / "again.log", poll_interval_s=0.05))
    with running(again) as d:
        append(again.log.path, lines[:1])  # type: ignore[arg-type]
        d.wait(lambda: d.status()["session"] is not None, "a session")
        d.wait(lambda: d.status()["session"]["startup_eta_reason"] is not None, "no ETA")
        assert d.status()["session"]["startup_eta"] is None
        assert "no earlier start" in d.status()["session"]["startup_eta_reason"]
    for shard in model.glob("*.safetensors"):  # cold again: the same start compares
        fd = os.open(shard, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    third = replace(cfg, log=LogConfig(path=tmp_path / "third.log", poll_interval_s=0.05))
    with running(third) as d:
        append(third.log.path, lines[:1])  # type: ignore[arg-type]
        d.wait(lambda: d.status()["session"] is not None, "a session")
        d.wait(lambda: d.status()["session"]["startup_eta"] is not None, "the ETA of a cold start")
        assert d.status()["session"]["startup_eta"]["past_starts"] == 1
