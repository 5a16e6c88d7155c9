"""Real log text through the real parser into the fold; the /status JSON shape; random input."""

from __future__ import annotations

import json
from datetime import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from loadwatch.daemon.sources.inputs import GpuReading, HealthProbe, IoSample, ProcessEvent, Tick
from loadwatch.daemon.state.loadstate import Input, LoadState, StateConfig
from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import Event, Failure, Milestone, ShardProgress

from .helpers import GIB, T0, bar, fail, fold, gpu, io, model, ms, phases, started

ARGV = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/ds")


def _h(level: str, t: float, src: str) -> str:
    return f"{level} {datetime.fromtimestamp(t):%m-%d %H:%M:%S} [{src}]"


def _log(t: float) -> bytes:
    e = "(EngineCore_DP0 pid=1100) "
    a = "(APIServer pid=1000) "
    lines = [
        f"{a}{_h('INFO', t, 'api_server.py:1896')} vLLM API server version 0.11.1\n",
        f"{e}{_h('INFO', t + 5, 'gpu_model_runner.py:2602')} Starting to load model /models/ds...\n",
        f"{e}{_h('INFO', t + 6, 'cuda.py:366')} Using TRITON_MLA backend.\n",
    ]
    for layer in range(3):
        for s in ("k", "v"):
            lines.append(
                f"{e}{_h('WARNING', t + 7, 'kv_cache.py:86')} Found {s}_scale in the checkpoint "
                f"(e.g. model.layers.{layer}.self_attn.{s}_scale), but not found the expected name "
                f"in the model (e.g. model.layers.{layer}.self_attn.attn.{s}_scale). "
                f"{s}_scale is not loaded.\n"
            )
    bar_ = "Loading safetensors checkpoint shards"
    lines += [
        f"{e}\r{bar_}:   0% Completed | 0/3 [00:00<?, ?it/s]\n",
        f"{e}\r{bar_}:  33% Completed | 1/3 [00:02<00:04,  2.00s/it]\n",
        f"{e}\r{bar_}:  67% Completed | 2/3 [00:04<00:02,  2.00s/it]\n",
        f"{e}\r{bar_}: 100% Completed | 3/3 [00:06<00:00,  2.00s/it]\n",
        f"{e}\r{bar_}: 100% Completed | 3/3 [00:06<00:00,  2.00s/it]\n\n",
        f"{e}{_h('INFO', t + 14, 'default_loader.py:314')} Loading weights took 6.10 seconds\n",
        f"{e}{_h('INFO', t + 14, 'gpu_model_runner.py:2653')} Model loading took 1.2 GiB memory and 8.0 seconds\n",
        f"{e}{_h('INFO', t + 20, 'gpu_worker.py:298')} Available KV cache memory: 0.10 GiB\n",
        f"{e}{_h('ERROR', t + 21, 'core.py:708')} EngineCore failed to start.\n",
        f"{e}{_h('ERROR', t + 21, 'core.py:708')} Traceback (most recent call last):\n",
        f'{e}{_h("ERROR", t + 21, "core.py:708")}   File "core.py", line 699, in run_engine_core\n',
        f"{e}{_h('ERROR', t + 21, 'core.py:708')}     engine_core = EngineCoreProc(*args, **kwargs)\n",
        f"{e}{_h('ERROR', t + 21, 'core.py:708')} ValueError: To serve at least one request with the "
        "model's max seq len (4096), (0.50 GiB KV cache is needed, which is larger than the "
        "available KV cache memory (0.10 GiB). Based on the available memory, the estimated "
        "maximum model length is 800. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.\n",
        f"{a}Traceback (most recent call last):\n",
        f'{a}  File "api_server.py", line 1953, in <module>\n',
        f"{a}    uvloop.run(run_server(args))\n",
        f"{a}RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n",
    ]
    return "".join(lines).encode()


def _events(t: float) -> list[Event]:
    stream = EventStream(ref_ts=t + 3600)
    out = stream.feed_all(split_records(_log(t)))
    return out


def test_a_real_failed_startup_log() -> None:
    t = T0
    evs = _events(t)
    assert any(isinstance(e, ShardProgress) for e in evs)
    assert any(isinstance(e, Failure) for e in evs)
    items: list[tuple[float, Input]] = [(t - 1, started(t - 1, pid=1000, argv=ARGV))]
    items.append((t - 1, model([GIB, GIB, GIB])))
    for ev in evs:
        # live following: each event is seen a moment after its line was written
        items.append(((ev.ts or t) + 0.2, ev))
    items.append((t + 23, ProcessEvent(kind="exited", ts=t + 23, pid=1000, exit_code=0)))
    stt, tr = fold(items)
    snap = stt.snapshot(t + 24)
    s = snap.session
    assert s is not None
    assert s.version == "0.11.1"
    assert snap.phase == "failed" and s.failure_kind == "kv_cache_too_small"
    assert phases(tr) == ["loading_weights", "post_load", "failed"]
    (w,) = [w for w in s.warnings if w.code == "kv_scale_missing"]
    assert w.count == 6 and w.layers == (0, 1, 2) and w.processes == ("EngineCore_DP0",)
    # `auto` on 0.11 keeps the model dtype: the missing scales are harmless
    assert w.verdict == "benign"
    (b,) = s.bars
    assert b.done == 3 and b.total == 3 and b.process == "EngineCore_DP0"
    assert s.weights_load_s == 6.1
    ms_keys = {m.key: m for m in s.milestones}
    assert ms_keys["attention_backend"].value == "TRITON_MLA"
    assert ms_keys["kv_cache.available_memory"].gib == 0.1
    # one root cause; the engine's and the API server's "initialization failed" are its echoes
    (root,) = s.failures
    assert root.kind == "kv_cache_too_small" and root.echoes >= 1
    assert any(e.message.startswith("Engine core initialization failed") for e in root.evidence), (
        root.evidence
    )
    json.dumps(snap.to_dict())


def test_status_json_has_the_documented_shape() -> None:
    items: list[tuple[float, Input]] = [
        (T0, started(T0, argv=ARGV)),
        (T0, model([GIB] * 4)),
        (T0 + 1, ms("model_load_start")),
        (T0 + 2, bar(0, 4)),
        (T0 + 4, bar(1, 4)),
        (T0 + 4, gpu(T0 + 4, 10 * GIB)),
        (T0 + 4, io(T0 + 4, GIB)),
        (T0 + 5, HealthProbe(ok=False, ts=T0 + 5, error="connection refused")),
        (T0 + 6, fail("other", "something", exc_type="RuntimeError")),
    ]
    st_, tr = fold(items)
    d = st_.snapshot(T0 + 6).to_dict()
    text = json.dumps(d)
    assert json.loads(text) == d
    assert set(d) == {
        "schema",
        "at",
        "phase",
        "ready",
        "not_ready",
        "live",
        "not_live",
        "restarts",
        "sessions_total",
        "session",
        "sessions",
        "model",
        "kv_cache",
        "memory_plan",
        "gpu_source_up",
        "gpu_error",
        "gpus",
        "supervisor",
        "health",
        "node",
        "client_text",
        "first_failure",  # (supervise mode: a started vLLM)
        "remedies",
    }
    assert set(d["node"]) == {"role", "progress", "ready"}
    assert d["node"]["role"]["role"] == "head"
    s = d["session"]
    for key in ("history", "progress", "bars", "stall", "warnings", "failures", "milestones"):
        assert key in s
    assert set(s["progress"]["eta"]) == {
        "remaining_s",
        "low_s",
        "high_s",
        "finish_at",
        "finish_low_at",
        "finish_high_at",
        "rate_per_s",
        "units",
        "inputs",
    }
    assert s["progress"]["eta"]["inputs"] == [
        "Loading safetensors checkpoint shards: 4 files weighed by the model directory's shard sizes"
    ]
    assert {"unit", "sizes_from"} <= set(s["bars"][0])
    assert "ep_weight_filter" in s
    assert d["gpus"][0]["memory_used_bytes"] == 10 * GIB
    assert d["health"]["consecutive_failures"] == 1
    for t in tr:
        td = t.to_dict()
        assert td["transition"] == t.kind and "at" in td
        assert None not in td.values()
        json.dumps(td)


# -- random input never breaks the fold ------------------------------------------------------

_events_st = st.one_of(
    st.builds(
        lambda d, n, p, k: bar(min(d, n), n, process=p, kind=k),
        st.integers(0, 12),
        st.integers(1, 12),
        st.sampled_from(["Worker_TP0", "EngineCore_DP1", None]),
        st.sampled_from(["weights", "graph_capture", "prefetch", "other"]),
    ),
    st.builds(
        lambda k: Milestone(kind=k),
        st.sampled_from(
            [
                "version",
                "model_load_start",
                "model_memory",
                "kv_cache",
                "api_server_start",
                "app_startup_complete",
                "torch_compile",
            ]
        ),
    ),
    st.builds(
        lambda k, m: fail(k, m),
        st.sampled_from(["cuda_oom", "kv_cache_too_small", "engine_init_failed", "other"]),
        st.sampled_from(["a", "b"]),
    ),
    st.builds(
        lambda kind, code: ProcessEvent(kind=kind, ts=0, pid=1, exit_code=code),
        st.sampled_from(["started", "exited", "stopping", "backoff", "fatal"]),
        st.sampled_from([0, 1, None]),
    ),
    st.builds(lambda ok: HealthProbe(ok=ok, ts=0), st.booleans()),
    st.builds(lambda b: IoSample(ts=0, read_bytes=b), st.one_of(st.none(), st.integers(0, 10**10))),
    st.builds(lambda u: gpu(0, u), st.integers(0, 90 * GIB)),
    st.just(Tick()),
    st.just(GpuReading(ts=0, source_up=False, error="NVML gone")),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30), _events_st), max_size=60))
def test_any_input_sequence_folds_and_snapshots(steps: list[tuple[float, Input]]) -> None:
    state = LoadState(config=StateConfig(max_sessions=3, stall_floor_s=5, quiet_stall_s=20))
    now = T0
    for dt, item in steps:
        now += dt
        # inputs carry the clock of whoever made them
        if isinstance(item, ProcessEvent | HealthProbe | IoSample | GpuReading):
            item = type(item)(**{**{f: getattr(item, f) for f in item.__slots__}, "ts": now})  # type: ignore[arg-type]
        state = state.apply(item, now)
        s = state.session
        if s is not None:
            assert s.phase in {
                "starting",
                "loading_weights",
                "post_load",
                "ready",
                "failed",
                "stalled",
                "stopped",
            }
            assert (s.phase == "stalled") == (s.stall is not None)
            assert len(state.past) <= 3
        for t in state.transitions:
            json.dumps(t.to_dict())
    json.dumps(state.snapshot(now).to_dict())
