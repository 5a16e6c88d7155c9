"""The catalog's entries for what follows the weights before the engine is ready: torch.compile
(cold, from its cache, from an AOT artifact), the profiling run that sizes the KV cache, and
the bars of kernel autotuning.

Sources of the wordings (vLLM's own source, and real excerpts of public issues):
- `Directly load AOT compilation from path %s`: vllm/compilation/decorators.py
  (`VLLM_USE_AOT_COMPILE`, vLLM PR #24274 and after).
- `saving AOT compiled function to %s` / `saved AOT compiled function to %s`:
  vllm/compilation/decorators.py; the first as vllm-project/vllm#35061 shows it
  (`[decorators.py:575] saving AOT compiled function to /tmp/cache/vllm/...`).
- `Compiling a graph for compile range (1, 32768) takes 65.20s` (no space before the unit),
  `Cache the graph of compile range (1, 32768) for later use` and `torch.compile takes 85.78 s
  in total`: vllm-project/vllm#35061; `Cache the graph for dynamic shape for later use`:
  vllm/compilation/backends.py (`CompilerManager.compile`).
- `Initial profiling/warmup run took %.2f s`: vllm/compilation/monitor.py
  (`monitor_profiling_run`, vLLM PR #36098), printed after `torch.compile took ... in total`
  (vLLM PR #38012).
- `[AutoTuner]: Tuning fp8_gemm: 100%|██████████| 21/21 [00:00<00:00, 33.51profile/s]` and
  `[AutoTuner]: Tuning flashinfer::trtllm_fp8_block_scale_moe:   5%|▍         | 1/21
  [00:00<00:06,  3.29profile/s]`: FlashInfer's autotuner bar, noonghunna/club-3090#612,
  #617 and vllm-project/vllm#46367.
"""

from __future__ import annotations

from loadwatch.parsers.entries import (
    BARE,
    SEC,
    Entry,
    rx,
)
from loadwatch.parsers.vllm.builders import (
    milestone,
    unit_progress,
)

# vllm/compilation/'s files, where torch.compile's lines come from
COMPILATION = (
    "backends.py",
    "monitor.py",
    "decorators.py",
    "wrapper.py",
    "compiler_interface.py",
    "piecewise_backend.py",
    "caching.py",
)

COMPILE: tuple[Entry, ...] = (
    Entry(
        "ms.compile_cache_dir",
        ("for vLLM's torch.compile",),
        rx(r"Using cache directory: (?P<d>\S{1,400}+) for vLLM's torch\.compile"),
        milestone("torch_compile", detail="cache_dir", value="d"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_dynamo",
        ("Dynamo bytecode transform time",),
        rx(r"Dynamo bytecode transform time: " + SEC + r" s"),
        milestone("torch_compile", detail="dynamo", seconds="sec"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_graph",
        ("Compiling a graph for",),
        rx(r"Compiling a graph for (?P<shape>.{1,200}?) takes " + SEC + r" ?s"),
        milestone("torch_compile", detail="compile_graph", seconds="sec", value="shape"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_cache_load",
        ("from the cache, took",),
        rx(
            r"Directly load the compiled graph\(s\) for (?P<shape>.{1,200}?) from the cache, took "
            + SEC
            + r" s"
        ),
        milestone("torch_compile", detail="cache_load", seconds="sec", value="shape"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_cache_save",
        ("for later use",),
        rx(r"^Cache the graph (?:of compile range .{1,200}? |for dynamic shape )for later use"),
        milestone("torch_compile", detail="cache_save"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_aot_load",
        ("AOT compil",),
        rx(r"^Directly load AOT compilation from path "),
        milestone("torch_compile", detail="aot_load"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_aot_save",
        ("AOT compil",),
        rx(r"^sav(?:ing|ed) AOT compiled function to "),
        milestone("torch_compile", detail="aot_save"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "ms.compile_total",
        ("torch.compile take", "torch.compile took"),
        rx(r"torch\.compile (?:takes|took) " + SEC + r" s in total"),
        milestone("torch_compile", detail="total", seconds="sec"),
        "info",
        loggers=COMPILATION,
    ),
)

WARMUP: tuple[Entry, ...] = (
    Entry(
        "ms.profiling_run",
        ("Initial profiling/warmup run took",),
        rx(r"^Initial profiling/warmup run took " + SEC + r" ?s"),
        milestone("kv_cache", detail="profiling_run", seconds="sec"),
        "info",
        loggers=COMPILATION,
    ),
    Entry(
        "progress.autotuner",
        ("profile/s]", "s/profile]"),
        rx(
            # The `[AutoTuner]: ` tag is read as a launcher's (lines.py), the message starts at
            # `Tuning`. The op's name may hold colons (`flashinfer::trtllm_fp8_block_scale_moe`):
            # the description ends at the colon before the percentage.
            r"(?P<desc>Tuning [^\r\n|]{1,200}?):\s{1,8}+(?P<pct>\d{1,3}+)%"
            r"(?:\|[^|\r\n]{0,400}+\| ?| )"
            r"(?P<n>\d{1,9}+)/(?P<total>\d{1,9}+) ?"
            r"\[(?P<el>[\d:]{1,12}+)<(?P<rem>[\d:?]{1,12}+),\s{0,8}+"
            r"(?P<rate>\?profile/s|\d{1,9}+(?:\.\d{1,9}+)?(?:profile/s|s/profile))\]"
        ),
        unit_progress,
        "info",
        levels=BARE,
    ),
)
