"""The `fp8_kv_unsupported` remedy, driven by the supervisor on a virtual clock as the others are
(test_remedies.py): the flag (`--kv-cache-dtype bfloat16`) or the reversible config patch of a
real checkpoint directory (the demo's Kimi-K2.5-NVFP4, sparse shards), checked against the
memory plan of 8 x RTX PRO 6000 first."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from loadwatch.daemon.config import ConfigError, load_config
from loadwatch.daemon.crashloop_file import FILE_NAME
from loadwatch.daemon.state.memplan_inputs import gpu_model_capacity
from loadwatch.daemon.supervise.fp8_kv import KvCost, kv_cost
from loadwatch.daemon.supervise.ladder import Ladder, Seen
from loadwatch.daemon.supervise.remedies import Failed, Settings
from loadwatch.daemon.tools.demo import make_model_dir
from loadwatch.daemon.tools.patch import BACKUP_SUFFIX, revert_model
from tests.supervisor.test_remedies import Script, kv_too_small, ladder, supervise, write

# vLLM's TRITON_MLA backend on SM120 (vllm/v1/attention/backends/mla/triton_mla.py, raised in
# `TritonMLAImpl.__init__`)
FP8 = Failed("fp8_kv_unsupported", "model_init", "TritonMLA V1 with FP8 KV cache not yet supported")


def model(tmp_path: Path) -> Path:
    return make_model_dir(tmp_path / "models", fp8_kv=True)


def argv_for(m: Path, *extra: str) -> tuple[str, ...]:
    return ("vllm", "serve", str(m), "--tensor-parallel-size", "8", *extra)


def cost_on_rtx_pro_6000(argv: Sequence[str]) -> KvCost | None:
    return kv_cost(argv, {}, gpu_model_capacity("RTX PRO 6000"))


def fp8_ladder(tmp_path: Path, script: Script, argv: Sequence[str], mode: str) -> Ladder:
    settings = Settings(fp8_mode=mode, kv_cost=cost_on_rtx_pro_6000)
    return ladder(tmp_path, script, ("fp8_kv_unsupported",), argv=argv, settings=settings)


def files(m: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(m.iterdir()) if p.suffix != ".safetensors"}


class FilesSeen(Script):
    """A script that keeps the model's files as each failed start left them."""

    def __init__(self, m: Path, *failures: Failed) -> None:
        super().__init__(*failures)
        self.model = m
        self.files_seen: list[dict[str, bytes]] = []

    def seen(self) -> Seen | None:
        self.files_seen.append(files(self.model))
        return super().seen()


def remedy_events(script: Script) -> list[dict[str, object]]:
    return [d for d in script.lines if d["event"] == "vllm.remedy"]


def test_the_flag_is_applied_once_announced_with_its_kv_cost_and_helps(tmp_path: Path) -> None:
    m = model(tmp_path)
    argv = argv_for(m)
    script = Script(FP8)
    lad = fp8_ladder(tmp_path, script, argv, "flag")
    before = files(m)
    _sup, _rec, ops = supervise(tmp_path, lad, [1, 0], ready_on=2)
    assert [tuple(a) for a, _, _ in ops.spawned] == [argv, (*argv, "--kv-cache-dtype", "bfloat16")]
    applied, helped = remedy_events(script)
    assert applied["remedy"] == "fp8_kv_unsupported" and applied["outcome"] == "applied"
    assert applied["diff"] == ["+ --kv-cache-dtype bfloat16"]
    reason = str(applied["reason"])
    assert "refused the FP8 KV cache" in reason
    # the capacity it costs, from the memory plan: half the tokens of the FP8 cache
    assert "KV tokens per GPU: with FP8 " in reason and "with the model dtype " in reason
    assert "262,144 fits with it" in reason
    assert helped["outcome"] == "helped"
    assert files(m) == before  # the flag changes no file
    assert script.shown[-1][1].counts == {
        ("fp8_kv_unsupported", "applied"): 1,
        ("fp8_kv_unsupported", "helped"): 1,
    }


def test_the_flag_is_removed_when_it_did_not_help(tmp_path: Path) -> None:
    m = model(tmp_path)
    argv = argv_for(m)
    script = Script(FP8, FP8, FP8)
    sup, _rec, ops = supervise(
        tmp_path, fp8_ladder(tmp_path, script, argv, "flag"), [1, 1, 1], crash_loop_starts=3
    )
    assert sup.state == "fatal"
    assert [tuple(a) for a, _, _ in ops.spawned] == [
        argv,
        (*argv, "--kv-cache-dtype", "bfloat16"),
        argv,  # reverted: applied once, never again in this loop
    ]
    events = remedy_events(script)
    assert [(d["remedy"], d["outcome"]) for d in events][:3] == [
        ("fp8_kv_unsupported", "applied"),
        ("fp8_kv_unsupported", "reverted"),
        (None, "none"),
    ]
    assert events[1]["diff"] == ["- --kv-cache-dtype bfloat16"]
    assert str(events[2]["reason"]).startswith("ladder exhausted")


def test_the_patch_is_applied_announced_with_its_files_and_reverted_byte_for_byte(
    tmp_path: Path,
) -> None:
    m = model(tmp_path)
    argv = argv_for(m)
    original = files(m)
    script = FilesSeen(m, FP8, FP8)
    lad = fp8_ladder(tmp_path, script, argv, "patch")
    sup, _rec, ops = supervise(tmp_path, lad, [1, 1], crash_loop_starts=2)
    assert sup.state == "fatal"
    # the command never changes: the patch is of the checkpoint's config
    assert [tuple(a) for a, _, _ in ops.spawned] == [argv, argv]
    assert script.files_seen[0] == original
    patched = script.files_seen[1]["hf_quant_config.json"]
    assert b"kv_cache_quant_algo" not in patched
    assert (
        script.files_seen[1]["hf_quant_config.json" + BACKUP_SUFFIX]
        == original["hf_quant_config.json"]
    )
    applied, reverted, _none = remedy_events(script)
    assert applied["outcome"] == "applied" and "config's FP8 KV declaration dropped" in str(
        applied["reason"]
    )
    diff = list(applied["diff"])  # type: ignore[call-overload]
    assert any("hf_quant_config.json" in line for line in diff)
    assert any(line.startswith("-") and "kv_cache_quant_algo" in line for line in diff)
    assert reverted["outcome"] == "reverted"
    restored = "restored from hf_quant_config.json" + BACKUP_SUFFIX
    assert any(restored in line for line in reverted["diff"])  # type: ignore[attr-defined]
    assert files(m) == original  # byte for byte, the backups gone


def test_a_patch_that_helped_stays_and_patch_model_revert_restores_it(tmp_path: Path) -> None:
    m = model(tmp_path)
    argv = argv_for(m)
    original = files(m)
    script = Script(FP8)
    _sup, _rec, _ops = supervise(
        tmp_path, fp8_ladder(tmp_path, script, argv, "patch"), [1, 0], ready_on=2
    )
    assert [d["outcome"] for d in remedy_events(script)] == ["applied", "helped"]
    assert b"kv_cache_quant_algo" not in (m / "hf_quant_config.json").read_bytes()
    _text, code = revert_model(m)
    assert code == 0 and files(m) == original


def test_a_patch_in_effect_is_reverted_by_the_next_daemon(tmp_path: Path) -> None:
    m = model(tmp_path)
    argv = argv_for(m)
    original = files(m)
    script = Script(FP8, FP8)
    fp8_ladder(tmp_path, script, argv, "patch").failed(restarting=True)  # the daemon stops here
    saved = json.loads((tmp_path / "state" / FILE_NAME).read_text())
    assert saved["remedies"][0]["patched"] == str(m) and saved["remedies"][0]["diff"]
    again = fp8_ladder(tmp_path, script, argv, "patch")
    assert again.loop.remedies[0].diff  # the files' diff kept across the restart
    again.failed(restarting=True)
    assert [s.outcome for s in again.loop.remedies] == ["reverted"]
    assert files(m) == original


def test_a_patch_of_a_dropped_loop_is_put_back(tmp_path: Path) -> None:
    m = model(tmp_path)
    original = files(m)
    script = Script(FP8)
    fp8_ladder(tmp_path, script, argv_for(m), "patch").failed(restarting=True)
    assert files(m) != original
    # the operator changed the command and restarted the daemon: that loop is not this one's
    fixed = fp8_ladder(tmp_path, script, argv_for(m, "--kv-cache-dtype", "bfloat16"), "patch")
    assert fixed.loop.first_failure is None and files(m) == original
    dropped = script.lines[-1]
    assert dropped["event"] == "vllm.crash_loop_dropped"
    assert any("restored from" in line for line in dropped["reverted"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["flag", "patch"])
def test_not_applied_when_the_plan_says_the_bf16_cache_does_not_fit(
    tmp_path: Path, mode: str
) -> None:
    m = model(tmp_path)
    # fits with the FP8 cache; the bf16 one takes twice the bytes per token (test_memplan.py)
    argv = argv_for(m, "--max-model-len", "400000")
    original = files(m)
    script = Script(FP8, FP8)
    _sup, _rec, ops = supervise(
        tmp_path, fp8_ladder(tmp_path, script, argv, mode), [1, 1], crash_loop_starts=2
    )
    assert [tuple(a) for a, _, _ in ops.spawned] == [argv, argv]
    (none,) = remedy_events(script)
    assert none["outcome"] == "none" and none["remedy"] is None
    reason = str(none["reason"])
    assert "fp8_kv_unsupported: the model-dtype KV cache would not fit" in reason
    assert "400,000 will not fit with it" in reason
    assert "To serve at least one request with the model's max seq len (400000)" in reason
    assert files(m) == original
    assert script.shown[-1][1].counts == {}


def test_the_patch_is_not_tried_over_an_explicit_fp8_flag(tmp_path: Path) -> None:
    m = model(tmp_path)
    argv = argv_for(m, "--kv-cache-dtype", "fp8")
    script = Script(FP8)
    lad = fp8_ladder(tmp_path, script, argv, "patch")
    lad.failed(restarting=True)
    (none,) = remedy_events(script)
    assert "--kv-cache-dtype fp8 is given" in str(none["reason"])
    assert not any(p.name.endswith(BACKUP_SUFFIX) for p in m.iterdir())


def test_other_failures_are_not_this_remedys(tmp_path: Path) -> None:
    m = model(tmp_path)
    script = Script(kv_too_small(4096, 1568))
    fp8_ladder(tmp_path, script, argv_for(m), "flag").failed(restarting=True)
    (none,) = remedy_events(script)
    assert none["reason"] == "no remedy configured for kv_cache_too_small"


def test_remedy_fp8_config(tmp_path: Path) -> None:
    base = "[vllm]\nargv = ['vllm']\nremedies = ['fp8_kv_unsupported']\n"
    cfg = load_config(write(tmp_path, base))
    assert cfg.vllm is not None and cfg.vllm.remedy_fp8 == "flag"
    cfg = load_config(write(tmp_path, base + "remedy_fp8 = 'patch'\n"))
    assert cfg.vllm is not None and cfg.vllm.remedy_fp8 == "patch"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, base + "remedy_fp8 = 'edit'\n"))
    assert info.value.key == "[vllm] remedy_fp8"
