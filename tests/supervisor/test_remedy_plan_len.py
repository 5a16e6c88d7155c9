"""The `max_model_len` remedy when vLLM's error gives no estimate: the memory plan's longest
`--max-model-len` (state/memplan_inputs.py), planned for a real checkpoint directory (the demo's
Kimi-K2.5-NVFP4, sparse shards) on 8 x RTX PRO 6000, driven by the supervisor on a virtual clock
as the other remedies are (test_remedies.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from loadwatch.daemon.state.memplan_inputs import fitting_len, gpu_model_capacity, plan_argv
from loadwatch.daemon.supervise.ladder import Ladder
from loadwatch.daemon.supervise.remedies import Failed, Settings, propose
from loadwatch.daemon.tools.demo import make_model_dir
from tests.supervisor.test_remedies import Script, ladder, mml, supervise

# vLLM 0.32's ValueError when the KV cache gets no memory at all: no estimate in it
# (vllm/v1/core/kv_cache_utils.py, `check_enough_kv_cache_memory`)
NO_MEMORY = Failed(
    "kv_cache_too_small",
    "kv_cache",
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine (this flag also controls CPU memory reservation on the CPU "
    "backend, despite its name).",
)


def argv_for(tmp_path: Path, max_len: str) -> tuple[str, ...]:
    m = make_model_dir(tmp_path / "models", fp8_kv=False)
    return ("vllm", "serve", str(m), "--tensor-parallel-size", "8", "--max-model-len", max_len)


def planned_on_rtx_pro_6000(argv: Sequence[str]) -> int | None:
    return fitting_len(plan_argv(argv, {}, gpu_model_capacity("RTX PRO 6000")))


def plan_ladder(tmp_path: Path, script: Script, argv: Sequence[str], floor: int = 2048) -> Ladder:
    settings = Settings(min_model_len=floor, planned_len=planned_on_rtx_pro_6000)
    return ladder(tmp_path, script, argv=argv, settings=settings)


def test_the_plan_says_the_longest_length_that_fits(tmp_path: Path) -> None:
    argv = argv_for(tmp_path, "2000000")
    plan = plan_argv(argv, {}, gpu_model_capacity("RTX PRO 6000"))
    assert plan is not None and plan.verdict == "will_fail" and plan.low is not None
    # the pessimistic budget's length: one that fits only the optimistic one may fail again
    assert fitting_len(plan) == plan.low.max_len_fits == 287344
    assert plan.high is not None and plan.high.max_len_fits > 287344
    assert plan_argv(("vllm", "serve"), {}, None) is None  # no model directory: no plan


def test_without_an_estimate_the_plan_is_applied_once_announced_and_reverted(
    tmp_path: Path,
) -> None:
    argv = argv_for(tmp_path, "2000000")
    script = Script(NO_MEMORY, NO_MEMORY, NO_MEMORY)
    lad = plan_ladder(tmp_path, script, argv)
    sup, _rec, ops = supervise(tmp_path, lad, [1, 1, 1], crash_loop_starts=3)
    assert sup.state == "fatal"
    assert [mml(a) for a, _, _ in ops.spawned] == ["2000000", "287344", "2000000"]
    lines = [d for d in script.lines if d["event"] == "vllm.remedy"]
    applied, reverted = lines[0], lines[1]
    assert applied["remedy"] == "max_model_len" and applied["outcome"] == "applied"
    assert applied["diff"] == ["- --max-model-len 2000000", "+ --max-model-len 287344"]
    assert "vLLM gave no estimate; the memory plan says" in applied["reason"]
    assert reverted["outcome"] == "reverted"
    assert reverted["diff"] == ["- --max-model-len 287344", "+ --max-model-len 2000000"]
    assert lines[2]["outcome"] == "none" and lines[2]["reason"].startswith("ladder exhausted")


def test_vllms_own_estimate_wins_over_the_plan(tmp_path: Path) -> None:
    argv = argv_for(tmp_path, "2000000")
    said = Failed(
        "kv_cache_too_small",
        "kv_cache",
        # vLLM 0.32, vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory` (cut)
        "To serve at least one request with the model's max seq len (2000000), (130.89 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (22.51 GiB). Based "
        "on the available memory, the estimated maximum model length is 300000.",
    )
    change = propose("max_model_len", said, argv, Settings(planned_len=planned_on_rtx_pro_6000))
    assert not isinstance(change, str) and change is not None and change.after == "300000"


def test_the_plans_length_keeps_the_floor(tmp_path: Path) -> None:
    argv = argv_for(tmp_path, "2000000")
    why = propose(
        "max_model_len",
        NO_MEMORY,
        argv,
        Settings(min_model_len=400000, planned_len=planned_on_rtx_pro_6000),
    )
    assert why == ("the memory plan's (287344) is below the floor (remedy_min_model_len = 400000)")


def test_when_neither_knows_the_ladder_says_so(tmp_path: Path) -> None:
    script = Script(NO_MEMORY, NO_MEMORY)
    argv = ("vllm", "serve", str(tmp_path / "absent"), "--max-model-len", "4096")
    lad = plan_ladder(tmp_path, script, argv)
    _sup, _rec, ops = supervise(tmp_path, lad, [1, 1], crash_loop_starts=2)
    assert [mml(a) for a, _, _ in ops.spawned] == ["4096", "4096"]
    (none,) = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert none["remedy"] is None and none["outcome"] == "none"
    assert none["reason"] == (
        "max_model_len: neither vLLM nor the memory plan said which --max-model-len would fit"
    )
