"""Seeded synthetic weight loads that print what vLLM prints.

A trace is the ordered list of `(now, input)` pairs the daemon's loop would apply to `LoadState`:
the supervisor's process start, the model directory's `ModelInfo`, log events, one `GpuReading`,
one `IoSample` and one `Tick` per second, and at the end either the bar's last line or the crash.
Log events are produced the way the daemon gets them: text lines in vLLM's format, fed through the
real parser (`EventStream`). The weights bar is vLLM's `bar_format` driven by a replica of tqdm's
arithmetic: an exponential moving average (smoothing 0.3, bias-corrected) of items and of seconds
between refreshes, a refresh only when at least `mininterval` (0.1 s) passed since the last one,
dynamic `miniters`, and remaining = items left / smoothed rate printed with `int()` seconds (tqdm
truncates). `close()` redraws the final line once more, as the real bar does.

Kinds:
    uniform      equal shards, steady cold-cache speed with per-shard noise
    nonuniform   shard sizes that vary (independent sizes, dense/expert blocks, a few big files)
    cold_warm    equal shards; part way the rest of the files are in the page cache (3-6x faster)
    warm_cold    equal shards; the first part is cached, the rest comes from disk
    slowdown     equal shards; part way another job takes the disk (2-4x slower to the end)
    stall        equal shards; the storage hangs mid-shard for a few thresholds, then resumes
    oom          GPU memory that would overflow at 70-90% of the weights (the trace ends there)
Every kind except `oom` ends its load below the GPU's memory (some of them within 3% of it), and a
third of them allocate the weights up front as vLLM's default loader does (flat memory in the bar).
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from datetime import datetime

from loadwatch.daemon.sources.inputs import (
    GpuReading,
    GpuSample,
    IoSample,
    ModelInfo,
    ProcessEvent,
    ShardInfo,
)
from loadwatch.daemon.state.loadstate import StateConfig, Tick
from loadwatch.parsers.events import Event, Record
from loadwatch.parsers.vllm.stream import EventStream

KINDS = ("uniform", "nonuniform", "cold_warm", "warm_cold", "slowdown", "stall", "oom")
GIB = 1024**3
BAR_DESC = "Loading safetensors checkpoint shards"
T0 = 1_763_000_000.0  # an epoch second in November 2025


# -- tqdm's arithmetic -------------------------------------------------------------------------


class _Ema:
    """tqdm's EMA: bias-corrected exponential moving average."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.last = 0.0
        self.calls = 0

    def add(self, x: float) -> None:
        self.last = self.alpha * x + (1 - self.alpha) * self.last
        self.calls += 1

    def value(self) -> float:
        if not self.calls:
            return self.last
        return self.last / (1 - (1 - self.alpha) ** self.calls)


def _interval(seconds: float) -> str:
    mins, s = divmod(int(seconds), 60)
    h, m = divmod(mins, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class TqdmBar:
    """The weights bar as vLLM draws it, one `update(1)` per finished file."""

    mininterval = 0.1
    maxinterval = 10.0

    def __init__(self, total: int, start_t: float, desc: str = BAR_DESC) -> None:
        self.total = total
        self.desc = desc
        self.start_t = start_t
        self.n = 0
        self.last_print_n = 0
        self.last_print_t = start_t
        self.miniters = 0.0
        self.ema_dn = _Ema()
        self.ema_dt = _Ema()
        self.ema_miniters = _Ema()

    def line(self, now: float) -> str:
        elapsed = now - self.start_t
        rate: float | None = None
        if self.ema_dt.calls and self.ema_dt.value():
            rate = self.ema_dn.value() / self.ema_dt.value()
        elif elapsed:
            rate = self.n / elapsed if self.n else None
        if rate:
            inv = 1 / rate
            rate_fmt = f"{inv:5.2f}s/it" if inv > 1 else f"{rate:5.2f}it/s"
            remaining = _interval((self.total - self.n) / rate)
        else:
            rate_fmt, remaining = "?it/s", "?"
        pct = self.n / self.total * 100
        return (
            f"{self.desc}: {pct:3.0f}% Completed | {self.n}/{self.total} "
            f"[{_interval(elapsed)}<{remaining}, {rate_fmt}]"
        )

    def update(self, now: float) -> str | None:
        """One more file done at `now`; the line printed, if tqdm refreshes."""
        self.n += 1
        if self.n - self.last_print_n < self.miniters:
            return None
        dt = now - self.last_print_t
        if dt < self.mininterval:
            return None
        dn = self.n - self.last_print_n
        if dt and dn:
            self.ema_dn.add(dn)
            self.ema_dt.add(dt)
        text = self.line(now)
        if dt >= self.maxinterval:
            self.miniters = dn * self.mininterval / dt
        else:
            self.ema_miniters.add(dn * self.mininterval / dt)
            self.miniters = self.ema_miniters.value()
        self.last_print_n = self.n
        self.last_print_t = now
        return text


# -- traces ------------------------------------------------------------------------------------


@dataclass
class Truth:
    kind: str
    seed: int
    shards: int
    bar_start_t: float
    shard_end_t: list[float]  # when file i+1 finished
    expected_shard_s: list[float]  # the mean time file i takes at the speed it loads at
    bar_end_t: float | None  # the first N/N line; None when the load died
    sizes: list[int]
    with_model: bool = True
    uniform_sizes: bool = True
    stall_start_t: float | None = None  # the last byte read before the hang
    stall_end_t: float | None = None
    stall_threshold_s: float | None = None  # max(k x typical shard time, floor), from the truth
    switch_t: float | None = None  # when the speed changed (speed-change kinds)
    oom_t: float | None = None
    oom_fraction: float | None = None
    memory_total_bytes: int = 0
    final_used_ratio: float = 0.0  # where a load that fits ends, as a share of the GPU
    upfront: bool = False

    def fraction_at(self, t: float) -> float:
        """True fraction of bytes loaded at `t` (linear inside a file, flat while it hangs)."""
        total = sum(self.sizes)
        done = 0
        prev = self.bar_start_t
        for i, end in enumerate(self.shard_end_t):
            if t < end:
                if t <= prev:
                    return done / total
                s0, s1 = self.stall_start_t, self.stall_end_t
                if s0 is not None and s1 is not None and prev <= s0 < end:
                    if t < s0:
                        part = 0.3 * (t - prev) / (s0 - prev)
                    elif t < s1:
                        part = 0.3
                    else:
                        part = 0.3 + 0.7 * (t - s1) / (end - s1)
                else:
                    part = (t - prev) / (end - prev)
                return (done + part * self.sizes[i]) / total
            done += self.sizes[i]
            prev = end
        return done / total


@dataclass
class Trace:
    truth: Truth
    inputs: list[tuple[float, object]] = field(default_factory=list)
    config: StateConfig = field(default_factory=StateConfig)


def _header(level: str, t: float, src: str) -> str:
    d = datetime.fromtimestamp(t)
    return f"{level} {d:%m-%d %H:%M:%S} [{src}]"


def _sizes(kind: str, rng: random.Random, n: int) -> tuple[list[int], bool]:
    base = rng.uniform(3.5, 5.0) * 1e9
    if kind in ("nonuniform",) or (kind == "oom" and rng.random() < 0.5):
        pattern = rng.choice(("iid", "blocks", "heavy"))
        if pattern == "iid":
            sizes = [base * rng.uniform(0.2, 1.0) for _ in range(n)]
        elif pattern == "blocks":
            sizes = []
            small = True
            while len(sizes) < n:
                run = rng.randint(3, 10)
                lo, hi = (0.15, 0.35) if small else (0.85, 1.0)
                sizes.extend(base * rng.uniform(lo, hi) for _ in range(run))
                small = not small
            sizes = sizes[:n]
        else:
            sizes = [
                base * (rng.uniform(1.5, 3.0) if rng.random() < 0.08 else rng.uniform(0.6, 1.0))
                for _ in range(n)
            ]
        sizes[-1] *= rng.uniform(0.1, 0.6)
        return [int(s) for s in sizes], False
    # Equal files, except that the last one holds what is left (as checkpoint sharding does).
    sizes = [base * rng.uniform(0.995, 1.005) for _ in range(n)]
    sizes[-1] *= rng.uniform(0.1, 1.0)
    return [int(s) for s in sizes], True


def _speed_plan(kind: str, rng: random.Random) -> tuple[float, float, float, bool, bool]:
    """(speed before, speed after, switch fraction, cold before, cold after) in bytes/s."""
    cold = rng.uniform(1.0, 3.0) * 1e9
    switch = rng.uniform(0.3, 0.6)
    if kind == "cold_warm":
        return cold, cold * rng.uniform(3.0, 6.0), switch, True, False
    if kind == "warm_cold":
        return cold * rng.uniform(3.0, 6.0), cold, switch, False, True
    if kind == "slowdown":
        return cold, cold / rng.uniform(2.0, 4.0), switch, True, True
    return cold, cold, 2.0, True, True


def generate(kind: str, seed: int, with_model: bool = True) -> Trace:
    """One seeded load of the given kind (see the module doc)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace kind {kind!r}; expected one of {', '.join(KINDS)}")
    rng = random.Random(f"{kind}:{seed}")
    n = rng.randint(40, 180)
    sizes, uniform = _sizes(kind, rng, n)
    total_bytes = sum(sizes)
    cum = [0]
    for s in sizes:
        cum.append(cum[-1] + s)
    before, after, switch, cold_before, cold_after = _speed_plan(kind, rng)
    sigma = rng.uniform(0.06, 0.18)
    overhead = rng.uniform(0.02, 0.15)
    tp = rng.choice((1, 2, 4, 8))
    gpu_total = rng.choice((80, 141)) * GIB
    stall_k, stall_floor = 5.0, 20.0
    config = StateConfig(stall_k=stall_k, stall_floor_s=stall_floor)

    # -- timeline of the files
    t_start = T0 + rng.uniform(0, 3600)
    bar_start = t_start + rng.uniform(8, 25)
    ends: list[float] = []
    expected: list[float] = []
    cold_flags: list[bool] = []
    t = bar_start
    stall_at = rng.randint(int(n * 0.3), int(n * 0.7)) if kind == "stall" else -1
    stall_start = stall_end = None
    stall_threshold = None
    switch_t = None
    for i, size in enumerate(sizes):
        frac = cum[i] / total_bytes
        speed, is_cold = (before, cold_before) if frac < switch else (after, cold_after)
        if frac >= switch and switch_t is None:
            switch_t = t
        d = overhead + size / speed * math.exp(rng.gauss(0.0, sigma))
        expected.append(overhead + size / speed * math.exp(sigma * sigma / 2))
        cold_flags.append(is_cold)
        if i == stall_at:
            shard_times = sorted(b - a for a, b in zip([bar_start, *ends[:-1]], ends, strict=True))
            typical = shard_times[len(shard_times) // 2]
            stall_threshold = max(stall_k * typical, stall_floor)
            stall_start = t + 0.3 * d
            hang = stall_threshold * rng.uniform(3.0, 5.0)
            stall_end = stall_start + hang
            d += hang
        t += d
        ends.append(t)

    # -- memory per GPU as a function of the bytes fraction
    base = rng.uniform(0.5, 1.2) * GIB
    init = rng.uniform(0.2, 1.5) * GIB  # buffers allocated at model init
    f_first = sizes[0] / total_bytes
    emb = rng.uniform(0.5, 3.0) * GIB  # replicated embeddings in the first file
    upfront = kind != "oom" and rng.random() < 1 / 3
    oom_fraction = None
    if kind == "oom":
        oom_fraction = rng.uniform(0.7, 0.9)
        slope = (gpu_total - base - init - emb) / (oom_fraction - f_first)
        final_ratio = (base + init + emb + slope * (1 - f_first)) / gpu_total
    else:
        final_ratio = rng.choice((rng.uniform(0.55, 0.9), rng.uniform(0.93, 0.97)))
        slope = (final_ratio * gpu_total - base - init - emb) / (1 - f_first)
    transient = rng.uniform(0.0, 0.01) * gpu_total  # staging buffers while a file loads

    def used_at(frac: float, loading: bool) -> float:
        if upfront:
            u = final_ratio * gpu_total
        else:
            u = base + init + (emb if frac >= f_first else emb * frac / f_first)
            u += slope * max(0.0, frac - f_first)
        if loading and frac < 1.0:
            u += transient
        return float(int(u) // (2 * 1024**2) * (2 * 1024**2))

    oom_t = None
    if oom_fraction is not None:
        # The first time the load's memory crosses the GPU's size.
        for i, end in enumerate(ends):
            if cum[i + 1] / total_bytes >= oom_fraction:
                prev = bar_start if i == 0 else ends[i - 1]
                part = (oom_fraction * total_bytes - cum[i]) / sizes[i]
                oom_t = prev + part * (end - prev)
                break
    truth = Truth(
        kind=kind,
        seed=seed,
        shards=n,
        bar_start_t=bar_start,
        shard_end_t=ends,
        expected_shard_s=expected,
        bar_end_t=None,
        sizes=sizes,
        with_model=with_model,
        uniform_sizes=uniform,
        stall_start_t=stall_start,
        stall_end_t=stall_end,
        stall_threshold_s=stall_threshold,
        switch_t=switch_t,
        oom_t=oom_t,
        oom_fraction=oom_fraction,
        memory_total_bytes=gpu_total,
        final_used_ratio=final_ratio,
        upfront=upfront,
    )
    trace = Trace(truth=truth, config=config)
    out = trace.inputs
    end_t = oom_t if oom_t is not None else ends[-1]

    # -- log lines through the real parser
    stream = EventStream(ref_ts=end_t + 60)
    pid = 4000 + seed
    proc = "Worker_TP0" if tp > 1 else "EngineCore_DP0"
    lag = rng.uniform(0.02, 0.3)  # the follower's delay

    def log(at: float, text: str) -> None:
        for ev in stream.feed(Record(text)):
            out.append((at + lag, ev))

    argv = (
        "python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/trace",
        "--tensor-parallel-size",
        str(tp),
    )
    out.append((t_start, ProcessEvent(kind="started", ts=t_start, pid=pid, argv=argv)))
    if with_model:
        shards = tuple(
            ShardInfo(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(sizes)
        )
        out.append(
            (
                t_start + 0.05,
                ModelInfo(path="/models/trace", shards=shards, total_bytes=total_bytes),
            )
        )
    h = _header("INFO", t_start + 1, "api_server.py:1900")
    log(t_start + 1, f"(APIServer pid={pid}) {h} vLLM API server version 0.11.1")
    h = _header("INFO", bar_start - 3, "gpu_model_runner.py:2000")
    log(bar_start - 3, f"({proc} pid={pid + 1}) {h} Starting to load model /models/trace...")
    bar = TqdmBar(n, bar_start)
    log(bar_start, f"({proc} pid={pid + 1}) {bar.line(bar_start)}")
    for i, end in enumerate(ends):
        if oom_t is not None and end > oom_t:
            break
        text = bar.update(end)
        if i == n - 1:
            text = bar.line(end)
            if truth.bar_end_t is None:
                truth.bar_end_t = end
            log(end, f"({proc} pid={pid + 1}) {text}")
            log(end + 0.001, f"({proc} pid={pid + 1}) {bar.line(end)}")  # close() redraws
            break
        if text is not None:
            log(end, f"({proc} pid={pid + 1}) {text}")
    if oom_t is not None:
        h = _header("ERROR", oom_t, "core.py:700")
        log(
            oom_t,
            f"({proc} pid={pid + 1}) {h} torch.OutOfMemoryError: CUDA out of memory. Tried to "
            f"allocate 1.00 GiB. GPU 0 has a total capacity of {gpu_total / GIB:.2f} GiB of which "
            "20.00 MiB is free.",
        )
        out.append((oom_t + 2, ProcessEvent(kind="exited", ts=oom_t + 2, pid=pid, exit_code=1)))
    else:
        h = _header("INFO", ends[-1] + 0.5, "default_loader.py:300")
        log(
            ends[-1] + 0.5,
            f"({proc} pid={pid + 1}) {h} Loading weights took {ends[-1] - bar_start:.2f} seconds",
        )
        h = _header("INFO", ends[-1] + 1, "gpu_model_runner.py:2100")
        gib = final_ratio * gpu_total / GIB
        log(
            ends[-1] + 1,
            f"({proc} pid={pid + 1}) {h} Model loading took {gib:.4f} GiB and {ends[-1] - t_start:.2f} seconds",
        )

    # -- once a second: GPUs, bytes read by the process tree, a tick
    cold_cum = [0]
    for i, size in enumerate(sizes):
        cold_cum.append(cold_cum[-1] + (size if cold_flags[i] else 0))
    sec = t_start + rng.uniform(0, 1)
    last_t = end_t + 3
    while sec < last_t:
        frac = truth.fraction_at(sec)
        loading = bar_start <= sec < (ends[-1] if oom_t is None else oom_t)
        if sec < bar_start - 3:
            used = base
        elif sec < bar_start:
            used = base + init if not upfront else final_ratio * gpu_total
        else:
            used = used_at(frac, loading)
        samples = tuple(
            GpuSample(
                index=g,
                health="ok",
                memory_used_bytes=int(min(used, gpu_total)),
                memory_total_bytes=gpu_total,
                utilization_ratio=0.3 if loading else 0.0,
                sampled_at=sec,
            )
            for g in range(tp)
        )
        out.append((sec, GpuReading(ts=sec, samples=samples)))
        # Cold files are read from storage (and counted); cached ones are not.
        x = frac * total_bytes
        i = bisect.bisect_right(cum, x) - 1
        read = cold_cum[min(i, n)]
        if i < n and cold_flags[i]:
            read += x - cum[i]
        out.append((sec + 0.01, IoSample(ts=sec + 0.01, read_bytes=int(read), pids=tp + 1)))
        out.append((sec + 0.02, Tick()))
        sec += 1.0
    out.sort(key=lambda p: p[0])
    return trace


def events_only(trace: Trace) -> list[Event]:
    return [item for _, item in trace.inputs if isinstance(item, Event)]


__all__ = ["GIB", "KINDS", "TqdmBar", "Trace", "Truth", "events_only", "generate"]
