from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.tools.patch import drop_fp8_kv_cache
from loadwatch.daemon.tools.preflight import (
    parse_gpu_cc,
    preflight,
    preflight_cli,
    start_hook,
    start_hook_for_argv,
)
from tests.supervisor.modeldirs import copy_model


@pytest.fixture
def kimi(tmp_path: Path) -> Path:
    return copy_model("kimi-k25-nvfp4", tmp_path)


def _check(report, name):  # type: ignore[no-untyped-def]
    return [c for c in report.checks if c.name == name]


def test_mla_fp8_checkpoint_on_sm120_will_fail(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi), None, (12, 0))
    assert report.verdict == "will_fail" and report.exit_code == 1
    assert report.attention == "mla"
    assert report.kv_cache_dtype == "fp8_e4m3"
    assert report.backends == ()
    (backend,) = _check(report, "attention_backend")
    assert backend.status == "fail"
    assert "only MLA backend is TRITON_MLA" in backend.message
    assert "2026-03-12" in backend.message
    assert report.fix is not None and "--drop-fp8-kv-cache" in report.fix
    (kv,) = _check(report, "kv_cache_dtype")
    assert "config.json:quantization_config.kv_cache_scheme" in kv.message
    assert report.scale_warnings_benign is False
    assert report.shard_count == 12


def test_explicit_kv_dtype_wins_and_makes_scale_warnings_benign(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi), "bfloat16", (12, 0))
    assert report.verdict == "ok" and report.exit_code == 0
    assert report.kv_cache_dtype == "bfloat16"
    assert report.backends == ("TRITON_MLA",)
    assert report.scale_warnings_benign is True
    (scales,) = _check(report, "kv_scale_warnings")
    assert "61 layers" in scales.message and "benign" in scales.message


def test_explicit_fp8_on_sm120_suggests_dropping_the_flag(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi), "fp8", (12, 0))
    assert report.verdict == "will_fail"
    assert report.fix == "drop --kv-cache-dtype or pass --kv-cache-dtype bfloat16"


@pytest.mark.parametrize(
    ("cc", "backends"),
    [((9, 0), ("FLASHMLA",)), ((10, 0), ("FLASHINFER_MLA", "CUTLASS_MLA", "FLASHMLA"))],
)
def test_fp8_mla_runs_on_hopper_and_blackwell_dc(
    kimi: Path, cc: tuple[int, int], backends: tuple[str, ...]
) -> None:
    report = preflight(read_model_dir(kimi), None, cc)
    assert report.verdict == "ok"
    assert report.backends == backends


def test_newer_vllm_accepts_fp8_on_triton_mla(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi), None, (12, 0), vllm_date=dt.date(2026, 4, 1))
    assert report.verdict == "ok"
    assert report.backends == ("TRITON_MLA",)


def test_old_vllm_auto_ignores_checkpoint_kv(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi), "auto", (12, 0), vllm_date=dt.date(2025, 6, 1))
    assert report.kv_cache_dtype == "auto"
    assert report.verdict == "ok"


def test_unknown_gpu_is_a_warning(kimi: Path) -> None:
    report = preflight(read_model_dir(kimi))
    assert report.verdict == "warnings" and report.exit_code == 2
    (backend,) = _check(report, "attention_backend")
    assert backend.status == "warn"


def test_patched_model_passes_on_sm120(kimi: Path) -> None:
    _, code = drop_fp8_kv_cache(kimi)
    assert code == 0
    report = preflight(read_model_dir(kimi), None, (12, 0))
    assert report.verdict == "ok", report.to_text()
    assert report.kv_cache_dtype == "auto"
    assert report.scale_warnings_benign is True


def test_standard_attention_with_fp8_and_no_scales_warns(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}
        )
    )
    (tmp_path / "model.safetensors").write_bytes(b"x")
    report = preflight(read_model_dir(tmp_path), "fp8", (12, 0))
    assert report.attention == "standard"
    assert report.verdict == "warnings"
    (scales,) = _check(report, "kv_scale_warnings")
    assert scales.status == "warn" and "1.0" in scales.message


def test_broken_dirs_will_fail_with_one_line_reasons(tmp_path: Path) -> None:
    report = preflight(read_model_dir(tmp_path / "missing"), None, (9, 0))
    assert report.verdict == "will_fail"
    assert report.failures[0].startswith("model directory")
    (tmp_path / "config.json").write_text("{}")
    report = preflight(read_model_dir(tmp_path), None, (9, 0))
    assert report.failures == ("no weight files found (*.safetensors, *.bin, *.pt)",)


def test_cli_function_text_json_exit(kimi: Path) -> None:
    text, data, code = preflight_cli(str(kimi), None, parse_gpu_cc("12.0"))
    assert code == 1
    assert data["verdict"] == "will_fail" and data["exit_code"] == 1
    assert data["gpu_cc"] == "12.0"
    json.dumps(data)  # JSON-ready
    assert text.splitlines()[-1] == "verdict: will fail"
    assert any(line.strip().startswith("FAIL  attention_backend") for line in text.splitlines())
    assert "fix: loadwatch patch-model" in text


@pytest.mark.parametrize("bad", ["twelve", "12.", "", "-1.0", "9.x"])
def test_parse_gpu_cc_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="compute capability"):
        parse_gpu_cc(bad)


def test_parse_gpu_cc_accepts() -> None:
    assert parse_gpu_cc("12.0") == (12, 0)
    assert parse_gpu_cc("9") == (9, 0)
    assert parse_gpu_cc(" 10.3 ") == (10, 3)


def test_start_hook_modes(kimi: Path) -> None:
    seen = []
    assert start_hook(str(kimi), "off") is None
    warn = start_hook(str(kimi), "warn", gpu_cc=lambda: (12, 0), on_report=seen.append)
    assert warn is not None and warn() is None
    assert seen[-1].verdict == "will_fail"
    refuse = start_hook(str(kimi), "refuse", gpu_cc=lambda: (12, 0))
    assert refuse is not None
    reason = refuse()
    assert reason is not None and reason.startswith("preflight: on compute capability 12.0")
    drop_fp8_kv_cache(kimi)
    assert refuse() is None  # re-reads the directory before every start


def test_start_hook_from_argv(kimi: Path) -> None:
    argv = ["vllm", "serve", str(kimi), "--kv-cache-dtype", "bfloat16", "--port", "8001"]
    hook = start_hook_for_argv(argv, "refuse", gpu_cc=lambda: (12, 0))
    assert hook is not None and hook() is None
    argv2 = ["python", "-m", "vllm.entrypoints.openai.api_server", f"--model={kimi}"]
    hook2 = start_hook_for_argv(argv2, "refuse", gpu_cc=lambda: (12, 0))
    assert hook2 is not None and hook2() is not None


def test_start_hook_reports_a_checkpoint_out_of_bounds_as_will_fail(tmp_path: Path) -> None:
    """The supervise-mode check before each start: a config.json nested too deep once raised
    RecursionError in the hook's thread; now it is a will-fail reason in one line."""
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    seen: list[Any] = []
    warn = start_hook(str(tmp_path), "warn", gpu_cc=lambda: (9, 0), on_report=seen.append)
    assert warn is not None and warn() is None
    assert seen[-1].verdict == "will_fail"
    refuse = start_hook(str(tmp_path), "refuse", gpu_cc=lambda: (9, 0))
    assert refuse is not None
    reason = refuse()
    assert reason is not None and reason.startswith(f"preflight: model directory {tmp_path}")
    assert "nested deeper than" in reason and "\n" not in reason
