"""The vLLM logs the end-to-end runs recorded under supervision, folded as the daemon folds them.

`real-v0.32-supervised-patched.log`: the tiny DeepSeek-V3-style checkpoint after `patch-model
--drop-fp8-kv-cache` (its `hf_quant_config.json` keeps `quant_algo: FP8` with every module
excluded, so vLLM runs with `quantization=modelopt` and the KV cache in bf16, and names the scales
`layers.N.self_attn.attn.k_scale`), a completion, then SIGTERM: a clean shutdown without the
`EngineDeadError` traceback the earlier recording has.

`real-v0.32-supervised-kv-too-small.log`: two starts with `--kv-cache-memory-bytes 1000000` back to
back in one file, as the supervisor writes them; the first ends in `Failed core proc(s):
{'EngineCore': 1}` and the next start's lines follow at once.

Fast (no vLLM): the facts the live tests saw must hold when the bytes are replayed.
"""

from __future__ import annotations

from datetime import datetime

from loadwatch.daemon.sources.inputs import HealthProbe, ModelInfo, ProcessEvent, ShardInfo
from loadwatch.daemon.state.loadstate import Input, LoadState, run
from loadwatch.daemon.state.snapshot import Snapshot
from loadwatch.parsers import Event, EventStream, Milestone, split_records
from tests.conftest import FIXTURES

# The shard files of the tiny checkpoint (tinymodel.py, seed 1234: the same bytes every build).
SIZES = [
    100976936,
    99135960,
    101102168,
    101102168,
    99135968,
    101102168,
    101102168,
    99135968,
    101102168,
    99135984,
    101102232,
    100540360,
]
LAYERS = 12
ARGV = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--enforce-eager")


def events(name: str) -> list[Event]:
    ref = datetime(2026, 12, 1).timestamp()
    return EventStream(ref_ts=ref).feed_all(split_records((FIXTURES / name).read_bytes()))


def patched_model() -> ModelInfo:
    """What read_model_dir says of the patched checkpoint."""
    return ModelInfo(
        path="/m",
        shards=tuple(
            ShardInfo(f"model-{i + 1:05d}-of-00012.safetensors", s) for i, s in enumerate(SIZES)
        ),
        total_bytes=sum(SIZES),
        architecture="DeepseekV3ForCausalLM",
        model_type="deepseek_v3",
        is_mla=True,
        num_layers=LAYERS,
        quant_algo="FP8",
        checkpoint_kv_dtype=None,
    )


def _is(ev: Event, kind: str) -> bool:
    return isinstance(ev, Milestone) and ev.kind == kind


def fold_supervised(evs: list[Event], exit_codes: list[int], stop_at: str | None) -> Snapshot:
    """Feed the log as the daemon does live: each start's process events and model facts, the
    log events a moment after they were written, a 200 from /health once the API server is up,
    `stopping` before the first shutdown line when `stop_at` is set, and the exits."""
    starts = [i for i, ev in enumerate(evs) if _is(ev, "version")]
    assert len(starts) == len(exit_codes)
    first = next(e.ts for e in evs if e.ts is not None)
    now = first - 1
    items: list[tuple[float, Input]] = []
    for n, begin in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(evs)
        items.append((now, ProcessEvent(kind="started", ts=now, pid=1000 + n, argv=ARGV)))
        items.append((now, patched_model()))
        stopping = False
        for ev in evs[begin:end]:
            now = max(now, (ev.ts or now) + 0.1)
            if stop_at and _is(ev, stop_at) and not stopping:
                stopping = True
                items.append((now, ProcessEvent(kind="stopping", ts=now, pid=1000 + n)))
            items.append((now, ev))
            if _is(ev, "app_startup_complete"):
                items.append((now, HealthProbe(ok=True, ts=now, status=200)))
        now += 1
        code = exit_codes[n]
        items.append((now, ProcessEvent(kind="exited", ts=now, pid=1000 + n, exit_code=code)))
    state, _ = run(items)
    return state.snapshot(now)


def test_the_patched_checkpoint_served_and_stopped_cleanly() -> None:
    evs = events("real-v0.32-supervised-patched.log")
    snap = fold_supervised(evs, [0], stop_at="shutdown")
    s = snap.session
    assert s is not None and snap.sessions_total == 1
    assert [h.phase for h in s.history] == [
        "starting",
        "loading_weights",
        "post_load",
        "ready",
        "stopped",
    ]
    assert s.failure_kind is None and not [f for f in s.failures if f.fatal]
    assert s.version == "0.32.0" and s.time_to_ready_s is not None
    (bar,) = [b for b in s.bars if b.kind == "weights"]
    assert (bar.done, bar.total) == (12, 12)
    assert s.progress.bytes_done == s.progress.bytes_total == sum(SIZES)
    # modelopt names the scales one level deeper; the parser still finds every layer
    (kv,) = [w for w in s.warnings if w.code == "kv_scale_missing"]
    assert kv.layers == tuple(range(LAYERS)) and kv.count == 2 * LAYERS
    assert kv.verdict == "benign", kv.reason
    assert snap.kv_cache.quantized is False


def test_the_log_alone_judges_the_patched_checkpoints_scale_warnings() -> None:
    # vLLM logs `Using fp8 data type to store kv cache` when the cache is quantized; this start
    # (the checkpoint patched to bf16) logged none, so the log alone says the scales are unused,
    # without the model directory (before: the verdict stayed open, "unknown", until READY).
    state = LoadState()
    for ev in events("real-v0.32-supervised-patched.log"):
        state = state.apply(ev, 1.9e9)
    snap = state.snapshot(1.9e9)
    s = snap.session
    assert s is not None
    (kv,) = [w for w in s.warnings if w.code == "kv_scale_missing"]
    assert kv.verdict == "benign"
    kv_cache = snap.to_dict()["kv_cache"]
    assert kv_cache["source"] == "log" and kv_cache["quantized"] is False
    # no EngineDeadError on this SIGTERM: the session ends stopped with no failure at all
    assert s.phase == "stopped" and s.failures == ()


def test_a_supervised_crash_loop_log_holds_two_failed_sessions() -> None:
    evs = events("real-v0.32-supervised-kv-too-small.log")
    snap = fold_supervised(evs, [1, 1], stop_at=None)
    assert snap.sessions_total == 2 and snap.restarts == 1 and snap.phase == "failed"
    s = snap.session
    assert s is not None and s.failure_kind == "kv_cache_too_small" and s.exit_code == 1
    (prev,) = snap.sessions
    assert prev.failure_kind == "kv_cache_too_small" and prev.exit_code == 1
    for shards in (prev.shards_done, s.progress.shards_done):
        assert shards == 12  # the weights were in before the KV cache failed
    # each start logs the same five failure records, and each stays in its own session: the
    # engine core's "failed to start", its ValueError (logged, then re-raised bare), the
    # worker's death and the API server's RuntimeError; one root cause, the rest its echoes
    assert [(f.kind, f.count, f.echoes) for f in s.failures] == [("kv_cache_too_small", 5, 4)]
    assert sorted(e.exc_type or "-" for e in s.failures[0].evidence) == [
        "-",
        "-",
        "RuntimeError",
        "ValueError",
        "ValueError",
    ]
    assert prev.failures_total == s.failures_total == 5
