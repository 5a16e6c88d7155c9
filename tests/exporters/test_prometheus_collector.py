"""The collector's load gauges against a real fold: the stall threshold and the silence are there
all through a load (not only once a stall is raised), and /health's answer in either mode."""

from __future__ import annotations

from dataclasses import replace

from loadwatch.daemon.sources.inputs import GpuReading, GpuSample, HealthProbe, Tick, XidEvent
from loadwatch.daemon.state.loadstate import LoadState
from loadwatch.daemon.state.published import Published, SupervisorStats, Totals
from loadwatch.exporters.prometheus import LoadwatchCollector, registry_for, render
from tests.client import parse_metrics
from tests.state.helpers import T0, bar, fold, ms, started

THRESHOLD = "loadwatch_load_stall_threshold_seconds"
SILENCE = "loadwatch_load_silence_seconds"
HEALTH = "loadwatch_vllm_health_up"


def published(state: LoadState, at: float, supervisor: SupervisorStats | None = None) -> Published:
    return Published(
        state=state,
        at=at,
        started_at=T0,
        version="test",
        totals=Totals(),
        log=None,
        gpu=None,
        supervisor=supervisor,
        load_budget_s=None,
    )


def scrape(
    state: LoadState, now: float, supervisor: SupervisorStats | None = None
) -> dict[str, float]:
    """name -> value of the unlabelled samples one scrape at `now` gives."""
    pub = published(state, now, supervisor)
    text = render(registry_for(LoadwatchCollector(lambda: pub, lambda: now))).decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split(" ")
            out[name] = float(value)
    return out


def steady_load() -> tuple[LoadState, float]:
    """A load of 20 shards, one every 5 s; the eighth done at T0 + 41."""
    items: list[tuple[float, object]] = [(T0, started(T0)), (T0 + 1, bar(0, 20))]
    items += [(T0 + 1 + 5 * i, bar(i, 20)) for i in range(1, 9)]
    st, _ = fold(items, stall_k=5.0, stall_floor_s=10.0)  # type: ignore[arg-type]
    return st, T0 + 41


def test_threshold_and_silence_while_loading_are_what_the_stall_will_use() -> None:
    st, last = steady_load()
    m = scrape(st, last + 4)
    assert m["loadwatch_load_stalled"] == 0.0
    assert m[SILENCE] == 4.0
    threshold = m[THRESHOLD]
    assert 20.0 < threshold < 30.0  # 5 x the 5 s a shard takes, over the 10 s floor
    # The stall comes when the silence passes that threshold, and keeps it.
    ticks: list[tuple[float, object]] = [(last + s, Tick()) for s in range(5, 40)]
    stalled, tr = fold(ticks, st)  # type: ignore[arg-type]
    (raised,) = [t for t in tr if t.kind == "stall_raised"]
    assert raised.threshold_s == threshold
    assert raised.at - last > threshold >= raised.at - 1 - last
    m = scrape(stalled, last + 39)
    assert m["loadwatch_load_stalled"] == 1.0
    assert (m[THRESHOLD], m[SILENCE]) == (threshold, 39.0)


def test_before_the_first_shard_and_after_the_weights_the_quiet_threshold() -> None:
    """Starting, the first file's allowance (over the floor); after the weights, the quiet
    threshold: silence since the log last showed a step of the load."""
    st, _ = fold([(T0, started(T0))], stall_floor_s=10.0, quiet_stall_s=900.0)
    m = scrape(st, T0 + 30)
    assert (m[THRESHOLD], m[SILENCE]) == (900.0, 30.0)
    st, _ = fold([(T0 + 40, bar(0, 4))], st)
    m = scrape(st, T0 + 50)
    assert (m[THRESHOLD], m[SILENCE]) == (600.0, 10.0)  # stall_first_shard_s: no shard timed yet
    items: list[tuple[float, object]] = [(T0 + 41 + i, bar(i, 4)) for i in range(1, 5)]
    items.append((T0 + 46, ms("weights_loaded", seconds=5.0, gib=1.0)))
    st, _ = fold(items, st)  # type: ignore[arg-type]
    assert st.snapshot(T0 + 60).phase == "post_load"
    m = scrape(st, T0 + 60)
    assert (m[THRESHOLD], m[SILENCE]) == (900.0, 14.0)


def test_no_threshold_once_ready() -> None:
    st, _ = fold(
        [(T0, started(T0)), (T0 + 1, ms("api_server_start", value="http://127.0.0.1:8000"))],
        stall_floor_s=10.0,
    )
    st, _ = fold([(T0 + 2, HealthProbe(ok=True, ts=T0 + 2, status=200))], st)
    assert st.snapshot(T0 + 3).ready
    m = scrape(st, T0 + 3)
    assert THRESHOLD not in m and SILENCE not in m


def test_health_up_in_watch_mode_and_supervise_mode() -> None:
    """Watch mode has no supervisor: /health's answer is exported all the same, and it is the
    state's last probe in supervise mode too."""
    st, _ = fold([(T0, started(T0))])
    assert HEALTH not in scrape(st, T0 + 1)  # not probed yet: unknown, not 0
    up, _ = fold([(T0 + 2, HealthProbe(ok=True, ts=T0 + 2, status=200))], st)
    assert scrape(up, T0 + 3)[HEALTH] == 1.0
    down, _ = fold([(T0 + 4, HealthProbe(ok=False, ts=T0 + 4, error="connection refused"))], up)
    assert scrape(down, T0 + 5)[HEALTH] == 0.0
    sup = SupervisorStats(
        state="running",
        starts_total=1,
        exits={},
        errors_total=0,
        last_success_ts=T0,
        orphans=None,
    )
    assert scrape(up, T0 + 3, sup)[HEALTH] == 1.0  # the latest probe, as the state holds it


def test_the_counts_are_read_from_the_state() -> None:
    """Events by type, Xids by GPU and code, the compute capability: the state's, as folded."""
    sample = GpuSample(index=0, health="ok", uuid="GPU-a", compute_capability=(9, 0))
    xids = (XidEvent(0, 79, T0), XidEvent(0, 79, T0), XidEvent(0, 13, T0))
    st, _ = fold([(T0, started(T0)), (T0 + 1, bar(0, 4)), (T0 + 1, bar(1, 4))])
    st, _ = fold([(T0 + 2, GpuReading(ts=T0 + 2, samples=(sample,), xids=xids))], st)
    pub = replace(published(st, T0 + 3), totals=Totals.of(st, st.snapshot(T0 + 3)))
    text = render(registry_for(LoadwatchCollector(lambda: pub, lambda: T0 + 3))).decode()
    m = parse_metrics(text.encode())
    assert m['loadwatch_events_total{type="shard_progress"}'] == 2.0
    assert m['loadwatch_gpu_xid_events_total{UUID="GPU-a",gpu="0"}'] == 3.0
    assert m['loadwatch_gpu_xid_errors_total{UUID="GPU-a",gpu="0",xid="79"}'] == 2.0
    assert 'compute_capability="9.0"' in text
