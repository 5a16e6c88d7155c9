"""The lines of torch.compile, the profiling run and kernel autotuning, read field by field.

Bodies are vLLM's own format strings with their numbers filled in, from the source files named
in each test (the `[file.py:N]` of vLLM's header put around them, as tests/parsers/
test_lines_2026.py does), or whole lines quoted from the public issues named; the fixtures
gh-vllm-35061-tp8-aot-compile.log, gh-vllm-46367-autotuner.log and
gh-club3090-617-autotuner-prefix.log hold more of those.
"""

from __future__ import annotations

import pytest

from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import Event, Milestone, ShardProgress

HEAD = "(EngineCore pid=134) INFO 07-02 21:31:27 [{}] "


def events(*lines: str) -> list[Event]:
    data = ("\n".join(lines) + "\n").encode()
    return EventStream(ref_ts=1796083200.0).feed_all(split_records(data))


def milestone(line: str) -> Milestone:
    (ev,) = events(line)
    assert isinstance(ev, Milestone)
    return ev


def test_aot_compilation_loaded_from_the_cache() -> None:
    """vllm/compilation/decorators.py (`VLLM_USE_AOT_COMPILE`): `logger.info("Directly load AOT
    compilation from path %s", aot_compilation_path)`."""
    ev = milestone(
        HEAD.format("decorators.py:312") + "Directly load AOT compilation from path "
        "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/8fc6bc4f/rank_0_0/model"
    )
    assert (ev.kind, ev.detail, ev.value) == ("torch_compile", "aot_load", None)


@pytest.mark.parametrize("verb", ["saving", "saved"])
def test_aot_artifact_saved(verb: str) -> None:
    """vllm/compilation/decorators.py: `saving AOT compiled function to %s`, then `saved AOT
    compiled function to %s` (the first as vllm-project/vllm#35061 shows it)."""
    ev = milestone(
        HEAD.format("decorators.py:575") + f"{verb} AOT compiled function to "
        "/tmp/cache/vllm/torch_compile_cache/torch_aot_compile/082f3e10/rank_0_0/model"
    )
    assert (ev.kind, ev.detail) == ("torch_compile", "aot_save")


def test_the_profiling_run_says_how_long_it_took() -> None:
    """vllm/compilation/monitor.py `monitor_profiling_run` (vLLM PR #36098):
    `Initial profiling/warmup run took %.2f s`, after `torch.compile took ... in total` (PR
    #38012)."""
    ev = milestone(HEAD.format("monitor.py:81") + "Initial profiling/warmup run took 117.91 s")
    assert (ev.kind, ev.detail, ev.seconds) == ("kv_cache", "profiling_run", 117.91)


@pytest.mark.parametrize(
    ("body", "detail", "seconds"),
    [
        # vllm-project/vllm#35061: no space between the seconds and their unit
        ("Compiling a graph for compile range (1, 32768) takes 65.20s", "compile_graph", 65.2),
        ("Cache the graph of compile range (1, 32768) for later use", "cache_save", None),
        # vllm/compilation/backends.py (`CompilerManager.compile`), the dynamic-shape form
        ("Cache the graph for dynamic shape for later use", "cache_save", None),
    ],
)
def test_compile_lines(body: str, detail: str, seconds: float | None) -> None:
    ev = milestone(HEAD.format("backends.py:366") + body)
    assert (ev.kind, ev.detail, ev.seconds) == ("torch_compile", detail, seconds)


def test_compile_words_from_another_logger_are_not_a_milestone() -> None:
    """The words alone, printed by a file outside vllm/compilation/, say nothing."""
    assert events(HEAD.format("logger.py:37") + "Initial profiling/warmup run took 1.25 s") == []


@pytest.mark.parametrize(
    ("line", "desc", "done", "total", "rate"),
    [
        # vllm-project/vllm#46367: the op's name holds colons
        (
            "[AutoTuner]: Tuning flashinfer::trtllm_fp8_block_scale_moe:   5%|▍         | "
            "1/21 [00:00<00:06,  3.29profile/s]",
            "Tuning flashinfer::trtllm_fp8_block_scale_moe",
            1,
            21,
            3.29,
        ),
        # noonghunna/club-3090#617: before the first rate
        (
            "[AutoTuner]: Tuning fp8_gemm:  10%|▉         | 2/21 [00:00<?, ?profile/s]",
            "Tuning fp8_gemm",
            2,
            21,
            None,
        ),
    ],
)
def test_autotuner_bar(line: str, desc: str, done: int, total: int, rate: float | None) -> None:
    (ev,) = events(line)
    assert isinstance(ev, ShardProgress)
    assert (ev.desc, ev.bar, ev.unit, ev.done, ev.total) == (desc, "autotune", "items", done, total)
    assert ev.rate_per_s == (pytest.approx(rate) if rate is not None else None)
