"""Warnings: grouped by code, layers and processes kept bounded, and the KV-scale verdict."""

from __future__ import annotations

import pytest

from loadwatch.daemon.sources.inputs import ModelInfo
from loadwatch.daemon.state.kvdtype import (
    argv_kv_dtype,
    effective_kv_dtype,
    parse_version,
    warning_verdict,
)
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.snapshot import WarningView
from loadwatch.parsers.events import (
    KvScaleWarning,
    LogError,
    LogWarning,
    ScaleFactorWarning,
    message_code,
)

from .helpers import T0, fold, model, ms, started


def _kv_warnings(
    layers: range, procs: tuple[str, ...] = ("Worker_TP0",)
) -> list[tuple[float, object]]:
    out: list[tuple[float, object]] = []
    for i, layer in enumerate(layers):
        for p in procs:
            for scale in ("k", "v"):
                out.append(
                    (
                        T0 + 10 + i * 0.001,
                        KvScaleWarning(
                            scale=scale,  # type: ignore[arg-type]
                            layer=layer,
                            checkpoint_name=f"model.layers.{layer}.self_attn.{scale}_scale",
                            process=p,
                        ),
                    )
                )
    return out


def _warning(st: LoadState, code: str = "kv_scale_missing") -> WarningView:
    snap = st.snapshot(T0 + 100)
    assert snap.session is not None
    return next(w for w in snap.session.warnings if w.code == code)


ARGV = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m")


@pytest.mark.parametrize(
    ("argv", "kv", "version", "verdict", "reason_has"),
    [
        ((*ARGV, "--kv-cache-dtype", "fp8"), None, "0.11.1", "flagged", "--kv-cache-dtype fp8"),
        ((*ARGV, "--kv-cache-dtype=bfloat16"), "fp8", "0.12.0", "benign", "bfloat16"),
        ((*ARGV, "--kv_cache_dtype", "fp8_e4m3"), None, None, "flagged", "fp8_e4m3"),
        (ARGV, "fp8", "0.12.0", "flagged", "follows the checkpoint's fp8"),
        ((*ARGV, "--kv-cache-dtype", "auto"), "fp8", "0.13.0", "flagged", "checkpoint"),
        (ARGV, "fp8", "0.11.2", "benign", "keeps the model's dtype"),
        (ARGV, None, "0.12.0", "benign", "declares no KV dtype"),
        (ARGV, "fp8", None, "flagged", "assuming vLLM 0.12 or later"),
        # watch mode: no argv, and a log that does not show the start-up
        ((), "fp8", "0.12.0", "flagged", "assuming no --kv-cache-dtype"),
        ((*ARGV, "--config", "serve.yaml"), "fp8", "0.12.0", "unknown", "--config"),
    ],
)
def test_kv_scale_verdict_follows_the_effective_kv_dtype(
    argv: tuple[str, ...], kv: str | None, version: str | None, verdict: str, reason_has: str
) -> None:
    items: list[tuple[float, object]] = [
        (T0, started(T0, argv=argv)),
        (T0, model([100, 100], kv=kv)),
    ]
    if version:
        items.append((T0 + 1, ms("version", value=version)))
    st, _ = fold(items + _kv_warnings(range(3)))  # type: ignore[arg-type]
    w = _warning(st)
    assert w.verdict == verdict
    assert reason_has in w.reason
    assert w.count == 6


def test_verdict_is_unknown_until_the_checkpoint_is_read_then_settles() -> None:
    st, _ = fold([(T0, started(T0, argv=ARGV)), (T0 + 1, ms("version", value="0.12.0"))])  # type: ignore[list-item]
    st, _ = fold(_kv_warnings(range(2)), st)  # type: ignore[arg-type]
    assert _warning(st).verdict == "unknown"
    assert "checkpoint not read yet" in _warning(st).reason
    st, _ = fold([(T0 + 20, model([1, 1]))], st)
    assert _warning(st).verdict == "benign"


def test_log_evidence_of_an_fp8_kv_cache_flags_the_missing_scales() -> None:
    items: list[tuple[float, object]] = [(T0, ms("version", value="0.9.0"))]
    items += _kv_warnings(range(2))
    items.append(
        (
            T0 + 20,
            ScaleFactorWarning(
                code="kv_scale_default",
                message="Using KV cache scaling factor 1.0 for fp8_e4m3. This may cause accuracy issues.",
            ),
        )
    )
    st, _ = fold(items)  # type: ignore[arg-type]
    assert _warning(st).verdict == "flagged"
    assert _warning(st, "kv_scale_default").verdict == "flagged"
    snap = st.snapshot(T0 + 30)
    assert snap.kv_cache.source == "log" and snap.kv_cache.quantized is True


def test_layers_and_processes_are_kept_per_code() -> None:
    items: list[tuple[float, object]] = [(T0, started(T0, argv=ARGV))]
    items += _kv_warnings(range(61), procs=("Worker_TP0", "Worker_TP1"))
    st, _ = fold(items)  # type: ignore[arg-type]
    w = _warning(st)
    assert w.count == 61 * 2 * 2
    assert w.layers == tuple(range(61)) and w.layer_count == 61
    assert w.processes == ("Worker_TP0", "Worker_TP1")
    assert w.scales == ("k", "v")
    snap = st.snapshot(T0 + 100)
    assert snap.session is not None and snap.session.warnings_total == 244


def test_a_thousand_warnings_stay_bounded() -> None:
    items: list[tuple[float, object]] = [(T0, started(T0))]
    for i in range(1000):
        items.append(
            (
                T0 + 1 + i * 0.01,
                KvScaleWarning(scale="k", layer=i * 10, process=f"Worker_TP{i % 40}"),
            )
        )
        # A distinct message each (the code is the message's words): letters for the digits.
        word = "w" + "".join(chr(97 + int(d)) for d in str(i))
        items.append((T0 + 1 + i * 0.01, LogWarning(source="file.py:1", message=f"odd {word}")))
    st, _ = fold(items, max_warning_codes=16, max_processes=8, max_layer=5000)  # type: ignore[arg-type]
    assert st.session is not None
    assert len(st.session.warnings) == 17  # 16 codes and "other"
    assert st.session.warnings_total == 2000
    w = st.session.warnings["kv_scale_missing"]
    assert len(w.processes) == 8
    assert w.layers_mask.bit_count() == 500 and w.layers_over == 500
    other = st.session.warnings["other"]
    assert other.count == 1000 - 15


def test_unrated_warnings_say_so() -> None:
    st, _ = fold([(T0, LogWarning(source="gpu_model_runner.py:12", message="something odd"))])
    w = _warning(st, "log.something_odd")
    assert w.verdict == "unrated" and w.sample == "something odd"


def test_unrated_codes_come_from_the_message_not_the_line_number() -> None:
    """The same warning moved to another file:line by a new vLLM release keeps its code; the
    values vLLM interpolates (numbers, paths, quoted names) do not make new codes."""
    # Real, from tests/fixtures/real-v0.32-llama.log (vLLM 0.32 on the CPU, system_utils.py:255)
    real = (
        "Found ulimit of 20000 and failed to automatically increase with error current limit "
        "exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too "
        "many open files`. Consider increasing with ulimit -n"
    )
    moved = real.replace("20000", "1024")
    st, _ = fold(
        [
            (T0, LogWarning(source="system_utils.py:255", message=real)),
            (T0 + 1, LogWarning(source="system_utils.py:262", message=moved)),
            # Real, from tests/fixtures/real-v0.32-kv-too-small.log (multiproc_executor.py:315);
            # the same message of another worker and exit code is the same code.
            (
                T0 + 2,
                LogError(
                    source="multiproc_executor.py:315",
                    message="Worker proc VllmWorker-0 died unexpectedly (exit code: 0), "
                    "shutting down executor.",
                ),
            ),
            (
                T0 + 3,
                LogError(
                    source="multiproc_executor.py:322",
                    message="Worker proc VllmWorker-1 died unexpectedly (exit code: 1), "
                    "shutting down executor.",
                ),
            ),
        ]
    )
    assert st.session is not None
    assert set(st.session.warnings) == {
        "log.found_ulimit_of_and_failed_to",
        "error.worker_proc_died_unexpectedly_exit_code",
    }
    assert st.session.warnings["error.worker_proc_died_unexpectedly_exit_code"].count == 2
    assert st.session.warnings["log.found_ulimit_of_and_failed_to"].count == 2
    assert message_code("log", "12 34 ...") == "log.unknown"


def test_argv_forms_and_versions() -> None:
    assert argv_kv_dtype(("--kv-cache-dtype", "FP8", "--kv-cache-dtype", "auto")) == "auto"
    assert argv_kv_dtype(("--kv-cache-dtype=fp8_e5m2",)) == "fp8_e5m2"
    assert argv_kv_dtype(("--kv-cache-dtype",)) is None
    assert argv_kv_dtype(("serve",)) is None
    assert parse_version("0.11.1rc6.dev143+gdeadbeef") == (0, 11)
    assert parse_version("v0.12.0") == (0, 12)
    assert parse_version("dev") is None
    assert parse_version(None) is None


def test_verdict_rules_directly() -> None:
    fp8 = effective_kv_dtype(("--kv-cache-dtype", "fp8"), None, None)
    bf16 = effective_kv_dtype(("--kv-cache-dtype", "bfloat16"), None, None)
    unknown = effective_kv_dtype(None, ModelInfo(path="/m"), "0.12.0")
    assert warning_verdict("q_scale_from_k", fp8)[0] == "flagged"
    assert warning_verdict("q_scale_from_k", bf16)[0] == "benign"
    assert warning_verdict("kv_scale_missing", unknown)[0] == "unknown"
    assert warning_verdict("q_prob_scale_default", bf16)[0] == "flagged"
    assert warning_verdict("log.x.py:1", fp8)[0] == "unrated"
    for code in ("kv_scale_missing", "q_scale_from_k", "kv_scale_default"):
        _, reason = warning_verdict(code, fp8)
        assert reason and "\n" not in reason


def test_shutdown_on_a_signal_makes_the_engine_dead_traceback_harmless() -> None:
    from loadwatch.daemon.state.loadstate import LoadState
    from loadwatch.parsers import EventStream, split_records
    from tests.conftest import FIXTURES

    data = (FIXTURES / "real-v0.32-deepseek-kvscales.log").read_bytes()
    state = LoadState()
    for ev in EventStream(ref_ts=1.8e9).feed_all(split_records(data)):
        state = state.apply(ev, 1.9e9)
    session = state.snapshot(1.9e9).session
    assert session is not None
    assert session.phase == "stopped" and session.failure_kind is None
    # the EngineDeadError after `received signal=SIGTERM` is the stop itself: no failure
    assert session.failures == () and session.failures_total == 0


def test_the_logs_fp8_kv_dtype_line_flags_the_scale_warnings() -> None:
    from loadwatch.daemon.state.loadstate import LoadState
    from loadwatch.parsers import EventStream, split_records
    from tests.conftest import FIXTURES

    data = (FIXTURES / "real-v0.32-deepseek-fp8kv.log").read_bytes()
    events = EventStream(ref_ts=1.8e9).feed_all(split_records(data))
    # The engine config names the dtype too (stronger): without it, the dtype line decides.
    for drop_engine_config, source, says in (
        (True, "log", "the log says vLLM stores the KV cache in fp8_e4m3"),
        (False, "engine_config", "kv_cache_dtype=fp8_e4m3 in vLLM's engine config"),
    ):
        state = LoadState()
        for ev in events:
            if drop_engine_config and getattr(ev, "kind", None) == "engine_config":
                continue
            state = state.apply(ev, 1.9e9)
        snap = state.snapshot(1.9e9)
        session = snap.session
        assert session is not None
        kv = next(w for w in session.warnings if w.code == "kv_scale_missing")
        assert kv.verdict == "flagged" and "fp8_e4m3" in kv.reason and says in kv.reason
        assert snap.kv_cache.source == source and snap.kv_cache.quantized is True
        assert session.failure_kind == "fp8_kv_unsupported"
