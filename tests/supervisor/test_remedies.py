"""The ladder of remedies and the crash loop's first failure, driven by the supervisor on a virtual
clock (test_supervisor_logic.py's `VirtualOps`): what each failed start is, is scripted; the
ladder's file is a real one in a temporary state directory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.config import ConfigError, load_config
from loadwatch.daemon.crashloop_file import FILE_NAME, CrashLoopFile
from loadwatch.daemon.sources.inputs import ProcessEvent
from loadwatch.daemon.state.crashloop import CrashLoop, RemedyCounts
from loadwatch.daemon.supervise.ladder import Ladder, Seen
from loadwatch.daemon.supervise.remedies import Failed, Settings, propose
from loadwatch.daemon.supervise.supervisor import Supervisor
from loadwatch.parsers.vllm.argv_secrets import Redactor
from loadwatch.parsers.vllm.catalog import fitting_model_len
from tests.supervisor.harness import Recorder
from tests.supervisor.test_supervisor_logic import VirtualOps, _cfg

ARGV = ("vllm", "serve", "/m", "--max-model-len", "4096", "--api-key", "sk-secret")


def kv_too_small(max_len: int, fits: int) -> Failed:
    # vLLM 0.32's message, vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`
    return Failed(
        "kv_cache_too_small",
        "kv_cache",
        f"To serve at least one request with the model's max seq len ({max_len}), (0.50 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (0.20 GiB). Based "
        f"on the available memory, the estimated maximum model length is {fits}. Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
        "decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
    )


class Script:
    """The failures the starts end with, in order, and everything the ladder says and shows."""

    def __init__(self, *failures: Failed) -> None:
        self.failures = list(failures)
        self.lines: list[dict[str, Any]] = []
        self.shown: list[tuple[CrashLoop, RemedyCounts]] = []
        self.problems: list[str] = []

    def seen(self) -> Seen | None:
        f = self.failures.pop(0)
        return f, (f"ERROR [core.py:700] ValueError: {f.message[:60]}",)

    def say(self, name: str, **fields: Any) -> None:
        self.lines.append({"event": name, **fields})

    def changed(self, loop: CrashLoop, counts: RemedyCounts) -> None:
        self.shown.append((loop, counts))

    def remedy_lines(self) -> list[tuple[Any, ...]]:
        return [(d["remedy"], d["outcome"]) for d in self.lines if d["event"] == "vllm.remedy"]


def ladder(
    tmp_path: Path,
    script: Script,
    remedies: tuple[str, ...] = ("max_model_len",),
    *,
    argv: Sequence[str] = ARGV,
    settings: Settings | None = None,
) -> Ladder:
    """The ladder of `remedies` for `argv`, told of failures by `script`."""
    red = Redactor()
    red.learn(argv)
    return Ladder(
        argv,
        remedies,
        settings or Settings(min_model_len=1024),
        CrashLoopFile(tmp_path / "state", script.problems.append),
        seen=script.seen,
        redact=red.argv,
        say=script.say,
        changed=script.changed,
        clock=lambda: 1234.0,
    )


def supervise(
    tmp_path: Path, lad: Ladder, codes: list[int], ready_on: int | None = None, **kw: object
) -> tuple[Supervisor, Recorder, VirtualOps]:
    rec = Recorder()
    ops = VirtualOps(codes)
    holder: list[Supervisor] = []

    def on_event(e: ProcessEvent) -> None:
        rec(e)
        if e.kind == "started" and len(rec.of("started")) == ready_on:
            holder[0].note_ready()

    sup = Supervisor(_cfg(tmp_path, argv=ARGV, **kw), on_event=on_event, ops=ops, planner=lad)
    holder.append(sup)
    asyncio.run(sup.run())
    return sup, rec, ops


def mml(argv: Any) -> str:
    args = list(argv)
    return args[args.index("--max-model-len") + 1]


def test_the_estimate_is_read_from_vllms_message() -> None:
    assert fitting_model_len(kv_too_small(4096, 1568).message) == 1568
    # vLLM < 0.6, vllm/worker/worker.py `raise_if_cache_size_invalid`
    old = (
        "The model's max seq len (4096) is larger than the maximum number of tokens that can be "
        "stored in KV cache (2048). Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine."
    )
    assert fitting_model_len(old) == 2048
    assert fitting_model_len("CUDA out of memory. Tried to allocate 2.00 GiB") is None


def test_a_remedy_is_applied_once_announced_before_the_restart_and_helps(tmp_path: Path) -> None:
    script = Script(kv_too_small(4096, 1568))
    lad = ladder(tmp_path, script)
    # The first start fails; the second (with the remedy) gets ready, then exits cleanly.
    sup, rec, ops = supervise(tmp_path, lad, [1, 0], ready_on=2)
    assert [mml(a) for a, _, _ in ops.spawned] == ["4096", "1568"]
    assert [mml(e.argv) for e in rec.of("started")] == ["4096", "1568"]
    applied, helped = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert applied["outcome"] == "applied" and applied["remedy"] == "max_model_len"
    assert applied["diff"] == ["- --max-model-len 4096", "+ --max-model-len 1568"]
    assert "estimated that a maximum model length of 1568 fits" in applied["reason"]
    assert applied["kind"] == "kv_cache_too_small" and applied["phase"] == "kv_cache"
    assert helped["outcome"] == "helped"
    # The loop kept the first failure until the ready start, then ended: the file is gone.
    during = script.shown[1][0]
    assert during.first_failure is not None and during.first_failure.kind == "kv_cache_too_small"
    assert during.first_failure.phase == "kv_cache"
    assert "sk-secret" not in json.dumps(list(during.first_failure.argv))
    assert not (tmp_path / "state" / FILE_NAME).exists()
    loop, counts = script.shown[-1]
    assert loop.first_failure is None and [s.outcome for s in loop.remedies] == ["helped"]
    assert counts.counts == {("max_model_len", "applied"): 1, ("max_model_len", "helped"): 1}
    assert sup.state == "exited"


def test_a_remedy_that_did_not_help_is_reverted_and_the_ladder_never_loops(
    tmp_path: Path,
) -> None:
    script = Script(*(kv_too_small(4096, 1568) for _ in range(5)))
    lad = ladder(tmp_path, script)
    sup, _rec, ops = supervise(tmp_path, lad, [1] * 5, crash_loop_starts=5)
    assert sup.state == "fatal"
    # Applied once; the start with it failed: reverted, back to the configured command.
    assert [mml(a) for a, _, _ in ops.spawned] == ["4096", "1568", "4096", "4096", "4096"]
    assert script.remedy_lines() == [
        ("max_model_len", "applied"),
        ("max_model_len", "reverted"),
        (None, "none"),
        (None, "none"),
        (None, "none"),
        (None, "none"),  # (after the last start too: no restart, the ladder still exhausted)
    ]
    reverted = next(d for d in script.lines if d.get("outcome") == "reverted")
    assert reverted["diff"] == ["- --max-model-len 1568", "+ --max-model-len 4096"]
    exhausted = next(d for d in script.lines if d.get("outcome") == "none")
    assert exhausted["reason"].startswith("ladder exhausted")
    loop, counts = script.shown[-1]
    assert loop.exhausted and loop.first_failure is not None
    assert counts.counts == {("max_model_len", "applied"): 1, ("max_model_len", "reverted"): 1}


def test_a_crash_loop_that_ends_with_the_remedy_tried_leaves_the_ladder_exhausted(
    tmp_path: Path,
) -> None:
    script = Script(kv_too_small(4096, 1568), kv_too_small(1568, 1000))
    sup, _rec, ops = supervise(tmp_path, ladder(tmp_path, script), [1, 1], crash_loop_starts=2)
    assert sup.state == "fatal" and [mml(a) for a, _, _ in ops.spawned] == ["4096", "1568"]
    assert script.remedy_lines() == [
        ("max_model_len", "applied"),
        ("max_model_len", "reverted"),
        (None, "none"),
    ]
    loop = script.shown[-1][0]
    assert loop.exhausted and [s.outcome for s in loop.remedies] == ["reverted"]
    saved = json.loads((tmp_path / "state" / FILE_NAME).read_text())
    assert saved["exhausted"] is True and saved["remedies"][0]["outcome"] == "reverted"


def test_a_crash_loop_that_ends_before_a_remedy_keeps_it_for_the_next_daemon(
    tmp_path: Path,
) -> None:
    script = Script(kv_too_small(4096, 1568), kv_too_small(4096, 1568))
    supervise(tmp_path, ladder(tmp_path, script), [1], crash_loop_starts=1)
    assert script.lines == []  # no restart: nothing applied, nothing said
    again = ladder(tmp_path, script)
    assert again.loop.first_failure is not None and not again.loop.exhausted
    assert mml(again.argv()) == "4096"
    again.failed(restarting=True)  # the next daemon's first start failed: now the remedy
    assert mml(again.argv()) == "1568"


class Broken:
    def argv(self) -> tuple[str, ...]:
        raise RuntimeError("bug")

    def failed(self, restarting: bool) -> None:
        raise RuntimeError("bug")

    def ready(self) -> None:
        raise RuntimeError("bug")


def test_a_broken_planner_neither_stops_the_restarts_nor_changes_the_command(
    tmp_path: Path,
) -> None:
    ops = VirtualOps([1, 1])
    sup = Supervisor(_cfg(tmp_path, argv=ARGV, crash_loop_starts=2), ops=ops, planner=Broken())
    assert asyncio.run(sup.run()) == "fatal"
    assert [tuple(a) for a, _, _ in ops.spawned] == [ARGV, ARGV]
    assert sup.callback_errors_total == 4  # argv twice, failed twice


def test_the_ladders_place_and_the_first_failure_survive_a_daemon_restart(tmp_path: Path) -> None:
    script = Script(kv_too_small(4096, 1568), kv_too_small(1568, 1000))
    first = ladder(tmp_path, script)
    first.failed(restarting=True)  # the daemon stops here, the remedy applied
    saved = json.loads((tmp_path / "state" / FILE_NAME).read_text())
    assert saved["first_failure"]["kind"] == "kv_cache_too_small"
    assert "sk-secret" not in json.dumps(saved)
    again = ladder(tmp_path, script)  # the daemon started again
    assert mml(again.argv()) == "1568"  # where the ladder was
    assert again.loop.first_failure == first.loop.first_failure
    again.failed(restarting=True)  # that start failed too: reverted, not tried again
    assert mml(again.argv()) == "4096"
    assert [s.outcome for s in again.loop.remedies] == ["reverted"] and again.loop.exhausted
    assert again.loop.first_failure == first.loop.first_failure  # still the first one
    assert script.problems == []


def test_cuda_oom_while_loading_weights_gets_no_remedy_and_says_so(tmp_path: Path) -> None:
    oom = Failed("cuda_oom", "weights", "CUDA out of memory. Tried to allocate 2.00 GiB")
    script = Script(oom, oom, oom)
    sup, _rec, ops = supervise(tmp_path, ladder(tmp_path, script), [1] * 3, crash_loop_starts=3)
    assert sup.state == "fatal" and len(ops.spawned) == 3  # the crash-loop rule, as ever
    assert all(mml(a) == "4096" for a, _, _ in ops.spawned)
    # Said before each restart; the last start is not followed by one.
    nones = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert [d["outcome"] for d in nones] == ["none", "none"]
    assert "while loading weights" in nones[0]["reason"] and "no remedy" in nones[0]["reason"]
    assert not script.shown[-1][0].exhausted  # nothing was tried
    assert script.shown[-1][1].counts == {}


def test_an_estimate_below_the_floor_is_not_applied(tmp_path: Path) -> None:
    script = Script(kv_too_small(4096, 512), kv_too_small(4096, 512))
    _sup, _rec, ops = supervise(tmp_path, ladder(tmp_path, script), [1, 1], crash_loop_starts=2)
    assert [mml(a) for a, _, _ in ops.spawned] == ["4096", "4096"]
    (none,) = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert "below the floor" in none["reason"] and "1024" in none["reason"]


def test_remedies_off_keep_the_first_failure_and_change_nothing(tmp_path: Path) -> None:
    script = Script(kv_too_small(4096, 1568), kv_too_small(4096, 1568))
    lad = ladder(tmp_path, script, remedies=())
    sup, _rec, ops = supervise(tmp_path, lad, [1, 1], crash_loop_starts=2)
    assert sup.state == "fatal"
    assert [mml(a) for a, _, _ in ops.spawned] == ["4096", "4096"]
    assert script.lines == []
    first = lad.loop.first_failure
    assert first is not None and first.kind == "kv_cache_too_small" and first.excerpt
    assert (tmp_path / "state" / FILE_NAME).exists()


def test_a_corrupt_file_is_set_aside_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / FILE_NAME).write_text('{"format": 1, "remedies": 3}')
    script = Script()
    lad = ladder(tmp_path, script)
    assert lad.loop == CrashLoop()
    assert (tmp_path / "state" / (FILE_NAME + ".corrupt")).exists()
    (line,) = script.problems
    assert "set aside" in line and "\n" not in line


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "loadwatch.toml"
    p.write_text(text)
    return p


def test_remedies_config(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[vllm]\nargv = ['vllm']\nremedies = ['max_model_len']\n"))
    assert cfg.vllm is not None and cfg.vllm.remedies == ("max_model_len",)
    assert cfg.vllm.remedy_min_model_len == 2048
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "[vllm]\nargv = ['vllm']\nremedies = ['fp16']\n"))
    assert info.value.key == "[vllm] remedies" and "unknown name 'fp16'" in info.value.problem


def test_an_unknown_remedy_exits_78_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[vllm]\nargv = ['vllm']\nremedies = ['more_gpus']\n")
    out = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", "--config", str(path)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert out.returncode == 78
    (line,) = out.stderr.strip().splitlines()
    assert "[vllm] remedies" in line and "more_gpus" in line and "max_model_len" in line


def test_status_shows_the_first_failure_and_the_remedies(tmp_path: Path) -> None:
    from dataclasses import replace

    from loadwatch.daemon.state.loadstate import LoadState
    from loadwatch.exporters.http.routes import status_json

    script = Script(kv_too_small(4096, 1568))
    lad = ladder(tmp_path, script)
    lad.failed(restarting=True)
    state = replace(LoadState(), crash_loop=lad.loop, remedy_counts=lad.counts)
    for red in (Redactor(), Redactor(["sk-secret"])):  # the fast encoder, and the dict route
        doc = json.loads(status_json(state.snapshot(1300.0), red))
        first = doc["first_failure"]
        assert first["kind"] == "kv_cache_too_small" and first["phase"] == "kv_cache"
        assert first["excerpt"] and "--max-model-len" in first["argv"]
        (step,) = doc["remedies"]
        assert step["outcome"] == "applied" and step["after"] == "1568"
        assert step["diff"] == ["- --max-model-len 4096", "+ --max-model-len 1568"]
    assert json.loads(status_json(LoadState().snapshot(1.0), Redactor()))["first_failure"] is None


@pytest.mark.parametrize(
    ("log", "kind", "phase", "words"),
    [
        # real vLLM 0.32 on the CPU, its KV cache too small (tests/e2e/test_real_vllm.py)
        ("real-v0.32-supervised-kv-too-small.log", "kv_cache_too_small", "kv_cache", "max seq len"),
        # an OOM at shard 3 of 37 (the fixture's .source names the issue it is from)
        ("v0-bracket-header.log", "cuda_oom", "weights", "CUDA out of memory"),
    ],
)
def test_the_failure_is_read_from_the_folded_session(
    log: str, kind: str, phase: str, words: str
) -> None:
    from loadwatch.daemon.supervise.ladder import seen_in
    from loadwatch.daemon.tools.analyze import LogReader, SessionFolder
    from loadwatch.daemon.tools.analyze_input import DEFAULT_RECORD_BYTES

    reader = LogReader(Path(__file__).parents[1] / "fixtures" / log, DEFAULT_RECORD_BYTES)
    folder = SessionFolder(reader.opened.mtime, None)
    for ev in reader.events():
        folder.add(ev)
    reader.close()
    seen = seen_in(folder.state.session)
    assert seen is not None
    failed, excerpt = seen
    assert (failed.kind, failed.phase) == (kind, phase) and words in failed.message
    assert excerpt and all(len(line) <= 400 for line in excerpt)


# vLLM 0.32's OOM message (torch's, raised in the profiling run: the allocation sizes are made up)
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.05 GiB is free."
)
BOTH = ("gpu_memory_utilization", "max_model_len")


def gmu(argv: Any) -> str | None:
    args = list(argv)
    i = args.index("--gpu-memory-utilization") if "--gpu-memory-utilization" in args else None
    return None if i is None else args[i + 1]


def test_gpu_memory_utilization_is_lowered_after_an_oom_in_the_kv_profiling(
    tmp_path: Path,
) -> None:
    script = Script(Failed("cuda_oom", "kv_cache", OOM_TEXT))
    lad = ladder(tmp_path, script, BOTH)
    _sup, _rec, ops = supervise(tmp_path, lad, [1, 0], ready_on=2)
    assert [gmu(a) for a, _, _ in ops.spawned] == [None, "0.85"]
    applied, helped = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert applied["remedy"] == "gpu_memory_utilization" and applied["outcome"] == "applied"
    assert applied["diff"] == ["+ --gpu-memory-utilization 0.85"]
    assert (
        "cuda_oom in kv_cache" in applied["reason"] and "0.9 (vLLM's default)" in applied["reason"]
    )
    assert helped["outcome"] == "helped"


def test_a_remedy_that_did_not_help_is_reverted_before_the_next_is_tried(tmp_path: Path) -> None:
    # An OOM in the CUDA-graph capture: less memory for vLLM; then its KV cache is too small for
    # --max-model-len: that remedy goes, the next one comes, on the configured command.
    script = Script(
        Failed("cuda_oom", "graph_capture", OOM_TEXT),
        kv_too_small(4096, 3000),
        kv_too_small(4096, 3000),
    )
    lad = ladder(tmp_path, script, BOTH)
    _sup, _rec, ops = supervise(tmp_path, lad, [1, 1, 0], ready_on=3)
    assert [(gmu(a), mml(a)) for a, _, _ in ops.spawned] == [
        (None, "4096"),
        ("0.85", "4096"),
        (None, "3000"),  # the first remedy reverted before the second
    ]
    assert script.remedy_lines() == [
        ("gpu_memory_utilization", "applied"),
        ("gpu_memory_utilization", "reverted"),
        ("max_model_len", "applied"),
        ("max_model_len", "helped"),
    ]
    loop, counts = script.shown[-1]
    assert [(s.remedy, s.outcome) for s in loop.remedies] == [
        ("gpu_memory_utilization", "reverted"),
        ("max_model_len", "helped"),
    ]
    assert counts.counts[("gpu_memory_utilization", "reverted")] == 1


def test_gpu_memory_utilization_has_a_floor_and_ignores_other_phases(tmp_path: Path) -> None:
    low = (*ARGV, "--gpu-memory-utilization", "0.52")
    oom = Failed("cuda_oom", "graph_capture", OOM_TEXT)
    settings = Settings(min_model_len=1024)
    assert "below 0.5" in str(propose("gpu_memory_utilization", oom, low, settings))
    for phase in ("weights", "unknown", "config"):
        assert (
            propose("gpu_memory_utilization", Failed("cuda_oom", phase, OOM_TEXT), ARGV, settings)
            is None
        )
    change = propose(
        "gpu_memory_utilization", oom, (*ARGV, "--gpu-memory-utilization=0.8"), settings
    )
    assert not isinstance(change, str) and change is not None and change.after == "0.75"


def test_a_kept_loop_of_another_command_is_dropped(tmp_path: Path) -> None:
    script = Script(kv_too_small(4096, 1568))
    ladder(tmp_path, script).failed(restarting=True)  # kept, a remedy applied
    assert (tmp_path / "state" / FILE_NAME).exists()
    red = Redactor()
    fixed = Ladder(
        (*ARGV[:4], "1024"),  # the operator fixed the command and restarted the daemon
        ("max_model_len",),
        Settings(min_model_len=1024),
        CrashLoopFile(tmp_path / "state", script.problems.append),
        seen=script.seen,
        redact=red.argv,
        say=script.say,
        changed=script.changed,
        clock=lambda: 1300.0,
    )
    assert fixed.loop == CrashLoop() and mml(fixed.argv()) == "1024"
    assert not (tmp_path / "state" / FILE_NAME).exists()
    assert script.lines[-1]["event"] == "vllm.crash_loop_dropped"
    # the same command (its secret redacted alike) keeps it
    script2 = Script(kv_too_small(4096, 1568))
    ladder(tmp_path, script2).failed(restarting=True)
    assert ladder(tmp_path, script2).loop.first_failure is not None


def refusing_preflight(lad: Ladder, fits: str) -> Any:
    """A preflight in refuse mode whose memory plan says the command's --max-model-len will not
    fit (daemon/tools/memplan_render.py's check line, with the plan's prediction of vLLM's own
    ValueError) until it is `fits`."""

    def hook() -> str | None:
        now = mml(lad.argv())
        if now == fits:
            return None
        expect = kv_too_small(int(now), int(fits)).message
        return f"preflight: --max-model-len {int(now):,} will not fit: expect {expect}"

    return hook


def test_a_start_the_preflight_refuses_is_remedied_before_vllm_runs(tmp_path: Path) -> None:
    script = Script()
    lad = ladder(tmp_path, script)
    rec = Recorder()
    ops = VirtualOps([0])
    holder: list[Supervisor] = []

    def on_event(e: ProcessEvent) -> None:
        rec(e)
        if e.kind == "started":
            holder[0].note_ready()

    cfg = _cfg(tmp_path, argv=ARGV, preflight=refusing_preflight(lad, "1568"))
    sup = Supervisor(cfg, on_event=on_event, ops=ops, planner=lad)
    holder.append(sup)
    assert asyncio.run(sup.run()) == "exited"
    # one start, with the remedy: vLLM never ran with the command that could not fit
    assert [mml(a) for a, _, _ in ops.spawned] == ["1568"]
    assert script.remedy_lines() == [("max_model_len", "applied"), ("max_model_len", "helped")]
    applied = script.lines[0]
    assert applied["kind"] == "kv_cache_too_small" and applied["phase"] == "preflight"
    during = script.shown[1][0].first_failure
    assert during is not None and during.phase == "preflight"
    assert [e.kind for e in rec.events][:2] == ["backoff", "started"]


def test_a_refusal_with_remedies_off_changes_nothing(tmp_path: Path) -> None:
    script = Script()
    lad = ladder(tmp_path, script, remedies=())
    lad.refused(
        "preflight: --max-model-len 4,096 will not fit: expect " + kv_too_small(4096, 1568).message
    )
    assert lad.loop == CrashLoop() and script.lines == []
    assert not (tmp_path / "state" / FILE_NAME).exists()
