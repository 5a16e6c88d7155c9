"""FP8 KV on SM120 from the installed vLLM, not a date: the supervised interpreter is asked what
its TritonMLABackend supports (the real vLLM 0.32 install; stand-in installs of older builds
given by PYTHONPATH, as the supervised environment would), and preflight decides from that."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadwatch.daemon.sources.model.model_info import read_model_dir
from loadwatch.daemon.supervise.vllm_probe import (
    TritonMlaAnswer,
    ask_triton_mla_fp8,
    supervised_python,
)
from loadwatch.daemon.tools.preflight import preflight, start_hook_for_argv
from tests.realvllm.vllmproc import vllm_available, vllm_python
from tests.supervisor.modeldirs import copy_model

# The 2026 build before PR #34597, and a 2025 build that raised in the backend's constructor.
BEFORE_34597 = """
class TritonMLABackend(MLACommonBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = ["auto", "float16", "bfloat16"]
"""
OLD_2025 = """
class TritonMLAImpl(MLACommonImpl):
    def __init__(self, *args, **kwargs):
        if is_quantized_kv_cache(self.kv_cache_dtype):
            raise NotImplementedError("TritonMLA V1 with FP8 KV cache not yet supported")
"""


def _stand_in(root: Path, source: str) -> dict[str, str]:
    pkg = root / "vllm"
    (pkg / "v1" / "attention" / "backends" / "mla").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the probe must not import vllm')\n")
    (pkg / "v1" / "attention" / "backends" / "mla" / "triton_mla.py").write_text(source)
    return {"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)}


@pytest.fixture
def kimi(tmp_path: Path) -> Path:
    return copy_model("kimi-k25-nvfp4", tmp_path / "kimi")


def _backend(report):  # type: ignore[no-untyped-def]
    return next(c for c in report.checks if c.name == "attention_backend")


@pytest.mark.realvllm
def test_the_installed_vllm_032_says_fp8() -> None:
    if not vllm_available():
        pytest.fail(f"no vLLM environment at {vllm_python()}: run `make vllm`")
    argv = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    answer = ask_triton_mla_fp8(argv, {})
    assert answer.fp8 is True
    assert answer.asked == f"vLLM 0.32.0 at {vllm_python()}"
    assert "fp8_e4m3" in answer.reason


def test_older_builds_say_no(tmp_path: Path) -> None:
    env = _stand_in(tmp_path / "a", BEFORE_34597)
    answer = ask_triton_mla_fp8([sys.executable, "-m", "vllm.entrypoints.openai.api_server"], env)
    assert answer.fp8 is False and "auto, float16, bfloat16" in answer.reason
    env = _stand_in(tmp_path / "b", OLD_2025)
    answer = ask_triton_mla_fp8(["python3", "-m", "vllm"], env)
    assert answer.fp8 is False and "refuses an FP8 KV cache" in answer.reason


def test_what_cannot_be_asked_is_none(tmp_path: Path) -> None:
    assert ask_triton_mla_fp8(["no-such-vllm", "serve", "m"], {"PATH": str(tmp_path)}).fp8 is None
    env = {"PATH": str(Path(sys.executable).parent)}  # loadwatch's own python has no vllm
    answer = ask_triton_mla_fp8([sys.executable, "-m", "vllm"], env)
    assert answer.fp8 is None and answer.asked.startswith("vLLM (version unknown) at ")


def test_console_script_shebang_names_the_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    assert supervised_python(["vllm", "serve", "m"], {"PATH": str(tmp_path)}) == sys.executable
    env_script = tmp_path / "bin" / "vllm"
    env_script.parent.mkdir()
    env_script.write_text("#!/usr/bin/env python3\n")
    found = supervised_python([str(env_script)], {"PATH": str(Path(sys.executable).parent)})
    assert found is not None and Path(found).name.startswith("python3")


def test_preflight_decides_from_the_answer(kimi: Path) -> None:
    info = read_model_dir(kimi)
    yes = TritonMlaAnswer(True, "vLLM 0.32.0 at /v/bin/python", "supported: fp8")
    no = TritonMlaAnswer(False, "vLLM 0.16.0 at /v/bin/python", "supported: auto")
    unknown = TritonMlaAnswer(None, "no interpreter", "cannot tell")
    ok = preflight(info, None, (12, 0), triton=yes)
    assert (
        _backend(ok).status == "ok"
        and "vLLM 0.32.0 at /v/bin/python says so" in _backend(ok).message
    )
    assert ok.fix is None  # the patch is proposed only where it is needed
    bad = preflight(info, None, (12, 0), triton=no)
    assert (
        _backend(bad).status == "fail"
        and "vLLM 0.16.0 at /v/bin/python refuses" in _backend(bad).message
    )
    assert bad.fix is not None and "--drop-fp8-kv-cache" in bad.fix
    fallback = preflight(info, None, (12, 0), triton=unknown)
    assert _backend(fallback).status == "fail"
    assert (
        "could not ask the installed vLLM: cannot tell; by the date rule"
        in _backend(fallback).message
    )


def test_supervise_hook_asks_the_supervised_vllm(kimi: Path, tmp_path: Path) -> None:
    env = _stand_in(tmp_path / "old", BEFORE_34597)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(kimi)]
    seen = []
    hook = start_hook_for_argv(
        argv, "refuse", gpu_cc=lambda: (12, 0), on_report=seen.append, env=env
    )
    assert hook is not None
    reason = hook()
    assert reason is not None and "refuses an FP8 KV cache" in reason
    assert f"at {sys.executable}" in reason
    report = seen[-1]
    assert report.memory is not None and report.memory.kv is not None  # the plan, from the argv
    assert report.memory.kv.bytes == 61 * 576
