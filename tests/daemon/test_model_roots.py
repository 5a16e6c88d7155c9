"""The model directory the log's engine config names (`model='/path'`) is untrusted text: the
daemon reads it only under `[model] allowed_roots` (default in watch mode: none), says once
when it will not, and a hostile checkpoint it reads is one `daemon.problem` line while every
task goes on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import ModelConfig
from loadwatch.daemon.tools.analyze import analyze_log
from loadwatch.daemon.tools.demo import make_model_dir
from tests.daemon.harness import running
from tests.daemon.test_daemon import SHARDS, config, script, upto
from tests.helpers import append


def _problems(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["error"]) for e in events if e.get("event") == "daemon.problem"]


@pytest.mark.parametrize("roots", ["unset", "elsewhere"])
def test_a_model_dir_outside_the_allowed_roots_is_not_read(tmp_path: Path, roots: str) -> None:
    model = make_model_dir(
        tmp_path / "downloads", fp8_kv=True, shards=SHARDS, total_bytes=6 * 10**9
    )
    allowed = None if roots == "unset" else (tmp_path / "models",)
    cfg = dataclasses.replace(
        config(tmp_path, None), model=ModelConfig(dir=None, allowed_roots=allowed)
    )
    lines = script(model)
    first, rest = upto(lines, f"3/{SHARDS} [")
    append(cfg.log.path, first)  # type: ignore[arg-type]
    with running(cfg) as d:
        d.wait(lambda: d.status()["session"]["progress"]["shards_done"] == 3, "3 shards")
        append(cfg.log.path, rest)  # type: ignore[arg-type]
        d.wait(lambda: d.status()["phase"] == "ready", "ready")
        status = d.status()
        # not read: no shard sizes (progress by files), no checkpoint KV verdict
        assert status["session"]["progress"]["bytes_total"] is None
        assert status["model"] is None or status["model"]["shards"] == 0
        assert status["kv_cache"]["source"] != "checkpoint"
        events = d.events()
        notes = [e for e in events if e["event"] == "model.not_read"]
        said = [p for p in _problems(events) if "allowed_roots" in p]
        if roots == "unset":  # the default at work: a note, once, no problem
            assert [n["path"] for n in notes] == [str(model)] and said == []
            assert "allowed_roots" in notes[0]["reason"]
        else:  # roots named, and the log names a path elsewhere: a problem, once
            assert len(said) == 1 and notes == [], _problems(events)
            assert str(model) in said[0] and "not read" in said[0]


def test_a_model_dir_inside_the_allowed_roots_is_read(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path / "models", fp8_kv=True, shards=SHARDS, total_bytes=6 * 10**9)
    cfg = dataclasses.replace(
        config(tmp_path, None), model=ModelConfig(dir=None, allowed_roots=(tmp_path / "models",))
    )
    first, _ = upto(script(model), f"3/{SHARDS} [")
    append(cfg.log.path, first)  # type: ignore[arg-type]
    with running(cfg) as d:
        d.wait(lambda: (d.status()["model"] or {}).get("shards") == SHARDS, "the model read")
        d.wait(
            lambda: d.status()["session"]["progress"]["bytes_total"] == 6 * 10**9, "byte progress"
        )
        assert _problems(d.events()) == []


HOSTILE = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    "huge int": (None, "out of range"),
}


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_checkpoint_the_log_names_is_one_problem_and_every_task_goes_on(
    tmp_path: Path, how: str
) -> None:
    """Before: the deep config.json raised RecursionError inside the log task, which stopped;
    a 400-digit kv_lora_rank overflowed a float in the memory plan of every published snapshot,
    which stopped the GPU and tick tasks."""
    model = make_model_dir(tmp_path / "models", fp8_kv=False, shards=SHARDS, total_bytes=6 * 10**9)
    text, words = HOSTILE[how]
    if text is None:  # the MLA latent's width, which the plan multiplies by a float
        doc = {**json.loads((model / "config.json").read_text()), "kv_lora_rank": "HUGE"}
        text = json.dumps(doc).replace('"HUGE"', "1" + "0" * 400)
    (model / "config.json").write_text(text)
    cfg = dataclasses.replace(
        config(tmp_path, None), model=ModelConfig(dir=None, allowed_roots=(tmp_path / "models",))
    )
    first, rest = upto(script(model), f"3/{SHARDS} [")
    append(cfg.log.path, first)  # type: ignore[arg-type]
    with running(cfg) as d:
        d.wait(lambda: any(words in p for p in _problems(d.events())), "the problem")
        gpu_ok = 'loadwatch_source_last_success_timestamp_seconds{source="gpu"}'
        d.wait(lambda: gpu_ok in d.metrics(), "a GPU poll published")
        polled = d.metrics()[gpu_ok]
        d.wait(lambda: d.metrics()[gpu_ok] > polled, "GPUs still polled")
        append(cfg.log.path, rest)  # type: ignore[arg-type]
        d.wait(lambda: d.status()["phase"] == "ready", "the log still followed to ready")
        problems = _problems(d.events())
        assert [p for p in problems if "stopped" in p] == []  # no task died
        (said,) = [p for p in problems if str(model) in p]
        assert "config.json" in said and words in said
        m = d.status()["model"]
        assert m is not None and m["shards"] == 0 and m["errors"]  # the model: unknown
    assert d.code == 0


def test_analyze_reads_a_checkpoint_only_when_given(tmp_path: Path) -> None:
    """`loadwatch analyze` has no allowed roots: the path a log names is not read (the live
    daemon in watch mode by default says the same), `--model-dir` is."""
    model = make_model_dir(tmp_path / "models", fp8_kv=False, shards=SHARDS, total_bytes=6 * 10**9)
    log = tmp_path / "vllm.log"
    log.write_text("".join(script(model)))
    named = analyze_log(log).to_dict()["sessions"][-1]
    assert named["memory_plan"] is None and named["progress"]["bytes_total"] is None
    given = analyze_log(log, model_dir=model).to_dict()["sessions"][-1]
    assert given["memory_plan"] is not None and given["progress"]["bytes_total"] == 6 * 10**9
