"""Durations learned from earlier starts: which past starts compare with this one, what they
say of the time left to ready, and how long a step without a bar may stay silent.

The history itself (a bounded list of `PastStart`, the last starts that got ready) comes in
with the state's configuration (`StateConfig.history`): the daemon reads and writes its file
(daemon/history.py); here there is no I/O.

Two starts compare when they load the same model directory (path and size) with the same vLLM
version, parallel layout, GPU model and KV-cache dtype, from a page cache in the same state
(cold or warm as the start began: daemon/sources/model/page_cache.py). What the current start does not know
yet (its first line names no layout), or an entry did not know, is no difference: at the first
line of a repeat start every start of that vLLM version compares, and the set narrows as the
log says more.

Durations are the timeline's (timeline.py): the fold's times, never a log stamp against the
daemon's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadwatch.daemon.state.durations import duration
from loadwatch.daemon.state.kvdtype import decide_kv_dtype
from loadwatch.daemon.state.memplan_inputs import layout_from_argv
from loadwatch.daemon.state.snapshot import STARTUP_UNKNOWN, StartupEtaView

if TYPE_CHECKING:
    from loadwatch.daemon.sources.inputs import ModelInfo
    from loadwatch.daemon.state.session import Session
    from loadwatch.daemon.state.snapshot import EtaView

PER_KEY = 20  # past starts kept per key
TOTAL = 200  # past starts kept in all
MIN_SPREAD = 0.1  # of the median: the spread assumed where the past starts agree (or are one)


@dataclass(frozen=True, slots=True)
class StartKey:
    """What makes two starts comparable; None: not known."""

    model: str | None = None  # the model directory
    model_bytes: int | None = None  # its weights' total size
    version: str | None = None  # vLLM's
    layout: str | None = None  # "tp8 pp1 dp1"
    gpu: str | None = None  # the NVML name of the first GPU
    kv_dtype: str | None = None
    cache: str | None = None  # the model's page cache as the start began: "warm", "cold"

    def agrees(self, other: StartKey) -> bool:
        """No field known on both sides differs."""
        for name in self.__slots__:
            a, b = getattr(self, name), getattr(other, name)
            if a is not None and b is not None and a != b:
                return False
        return True


@dataclass(frozen=True, slots=True)
class PastStart:
    """One start that got ready: its steps' seconds in order (a step the log never named is
    added to the next one), the time from its first step to ready, the weights' read rate."""

    key: StartKey
    ready_at: float
    steps: tuple[tuple[str, float], ...]
    ready_s: float
    weights_bytes_per_s: float | None = None

    def seconds(self) -> dict[str, float]:
        """Seconds per phase, a repeated phase's steps added up."""
        out: dict[str, float] = {}
        for phase, s in self.steps:
            out[phase] = out.get(phase, 0.0) + s
        return out


# -- keys and entries ---------------------------------------------------------------------------


def start_key(model: ModelInfo | None, gpus: Mapping[int, Any], s: Session) -> StartKey:
    """The key of session `s`, from what the state knows now."""
    layout = None
    args = s.argv if s.argv is not None else s.launch_args  # (the options vLLM logged at start)
    if args is not None:
        lay = layout_from_argv(args)
        layout = f"tp{lay.tensor_parallel} pp{lay.pipeline_parallel} dp{lay.data_parallel}"
    gpu = next((gpus[i].sample.name for i in sorted(gpus) if gpus[i].sample.name), None)
    kv = decide_kv_dtype(s.argv, s.kv, model, s.version, bool(s.load_started_by))
    return StartKey(
        model=model.path if model is not None else None,
        model_bytes=model.total_bytes if model is not None else None,
        version=s.version,
        layout=layout,
        gpu=gpu,
        kv_dtype=kv.dtype if kv.source != "unknown" else None,
        cache=s.page_cache,
    )


def comparable(history: Sequence[PastStart], key: StartKey) -> tuple[PastStart, ...]:
    """The past starts that compare with `key`, oldest first, at most `PER_KEY`."""
    return tuple(e for e in history if e.key.agrees(key))[-PER_KEY:]


def entry_of(model: ModelInfo | None, gpus: Mapping[int, Any], s: Session) -> PastStart | None:
    """What session `s`, ready now, adds to the history; None when its start is not known (a
    log that begins after it) or it never got ready."""
    tl = s.timeline.steps
    if s.ready_at is None or not tl or tl[0].before_log or s.reason == "first_event":
        return None
    steps: list[tuple[str, float]] = []
    carry = 0.0
    for st in tl:
        if st.phase == "first_completion" or st.started_at >= s.ready_at:
            break
        end = st.ended_at if st.ended_at is not None else s.ready_at
        took = max(min(end, s.ready_at) - st.started_at, 0.0) + carry
        if st.phase == STARTUP_UNKNOWN:
            carry = took
            continue
        carry = 0.0
        steps.append((st.phase, took))
    if carry and steps:
        steps[-1] = (steps[-1][0], steps[-1][1] + carry)
    if not steps:
        return None
    weights = sum(t for p, t in steps if p == "weights")
    size = model.total_bytes if model is not None else None
    rate = size / weights if size and weights > 0 else None
    ready_s = s.ready_at - tl[0].started_at
    return PastStart(start_key(model, gpus, s), s.ready_at, tuple(steps), ready_s, rate)


def remember(history: Sequence[PastStart], entry: PastStart) -> tuple[PastStart, ...]:
    """`history` with `entry`, bounded: the last `PER_KEY` of its key, the last `TOTAL` in all."""
    same = [e for e in history if e.key == entry.key]
    drop = {id(e) for e in same[: max(len(same) + 1 - PER_KEY, 0)]}
    kept = [e for e in history if id(e) not in drop]
    return (*kept, entry)[-TOTAL:]


# -- the time left to ready ---------------------------------------------------------------------


def _open_step(s: Session) -> tuple[str, float, frozenset[str]] | None:
    """(the phase of the step under way, its start, the phases closed before it)."""
    tl = s.timeline.steps
    if not tl or tl[-1].ended_at is not None or s.timeline.done:
        return None
    seen = frozenset(x.phase for x in tl[:-1] if x.phase != STARTUP_UNKNOWN)
    return tl[-1].phase, tl[-1].started_at, seen


def _median(values: Sequence[float]) -> float:
    from statistics import median  # (imported here: `analyze` has no past start, so never asks)

    return median(values)


def _rest(e: PastStart, phase: str, seen: frozenset[str]) -> float:
    """The seconds past start `e` spent in the phases after `phase` not seen yet."""
    return sum(t for p, t in e.seconds().items() if p not in seen and p != phase)


def _remaining(e: PastStart, phase: str, elapsed: float, seen: frozenset[str]) -> float:
    """What past start `e` says is left from a step of `phase` `elapsed` seconds old."""
    took = e.seconds()
    rest = _rest(e, phase, seen)
    if phase in took:
        return max(took[phase] - elapsed, 0.0) + rest
    return max(rest - elapsed, 0.0)  # a step not named yet: it eats into what comes next


def startup_eta(
    past: Sequence[PastStart], s: Session, now: float, bar: EtaView | None
) -> tuple[StartupEtaView | None, str | None]:
    """The time left to ready, with a range, and the reason when there is none. While the
    weights load, their bar's own ETA is what is left of that step; otherwise each past start
    says what is left of the step under way and of the steps after it (low: the fastest,
    mid: the median, high: the slowest)."""
    if s.ready_at is not None or s.phase in ("ready", "failed", "stopped"):
        return None, "the start-up is over"
    if not past:
        return None, "no earlier start of this model, vLLM version, layout and GPU in the history"
    open_ = _open_step(s)
    if open_ is None:
        return None, "no start-up step under way"
    phase, since, seen = open_
    elapsed = max(now - since, 0.0)
    by_bar = phase == "weights" and bar is not None
    if by_bar:
        assert bar is not None
        rests = sorted(_rest(e, phase, seen) for e in past)
        low = rests[0] + bar.low_s
        mid = _median(rests) + bar.remaining_s
        high = rests[-1] + bar.high_s
    else:
        left = sorted(_remaining(e, phase, elapsed, seen) for e in past)
        low, mid, high = left[0], _median(left), left[-1]
    pad = MIN_SPREAD * mid  # one start, or starts that agree: the spread is not known
    low, high = min(low, mid - pad), max(high, mid + pad)
    first = s.timeline.steps[0]
    overdue = None
    if not first.before_log:
        overdue = max(now - first.started_at - max(e.ready_s for e in past), 0.0)
    took = [e.seconds()[phase] for e in past if phase in e.seconds()]
    phase_overdue = None
    if took and phase != STARTUP_UNKNOWN and not s.timeline.steps[-1].before_log:
        phase_overdue = max(elapsed - max(took), 0.0)
    basis = f"the median of {len(past)} earlier start{'s' if len(past) > 1 else ''}"
    if s.page_cache is not None:
        basis += f" on a {s.page_cache} page cache"
    if by_bar:
        basis = "the weights bar's ETA and " + basis
    return (
        StartupEtaView(
            remaining_low_s=max(low, 0.0),
            remaining_s=max(mid, 0.0),
            remaining_high_s=max(high, 0.0),
            ready_at=now + max(mid, 0.0),
            step=phase,
            past_starts=len(past),
            overdue_s=overdue,
            basis=basis,
            phase_overdue_s=phase_overdue,
        ),
        None,
    )


# -- the stall test for a step without a bar ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class LearnedStep:
    """How long the step under way may stay silent, as the past starts say."""

    phase: str
    started_at: float
    threshold_s: float
    low_s: float  # the fastest past start's seconds in this phase
    high_s: float  # the slowest
    starts: int

    def reason(self, now: float) -> str:
        n = f"the last {self.starts} starts" if self.starts > 1 else "the last start"
        took = duration(self.high_s)
        if round(self.low_s) != round(self.high_s):
            took = f"{duration(self.low_s)}-{took}"
        return f"{self.phase} has run {duration(now - self.started_at)}; {n} took {took}"


def learned_step(
    past: Sequence[PastStart], s: Session, k: float, floor_s: float
) -> LearnedStep | None:
    """The silence the step under way may keep: the slowest past start's time in its phase
    plus `k` times their spread (at least `MIN_SPREAD` of the median), never under `floor_s`.
    None for the weights (their bar has its own test), a step begun before the log, or a phase
    no past start shows. A step the log has not named yet is the phase that came next in the
    latest past start."""
    open_ = _open_step(s)
    if not past or open_ is None or s.timeline.steps[-1].before_log:
        return None
    phase, since, seen = open_
    if phase == STARTUP_UNKNOWN:
        phase = next((p for p, _ in past[-1].steps if p not in seen), STARTUP_UNKNOWN)
    if phase in ("weights", STARTUP_UNKNOWN):
        return None
    took = [e.seconds()[phase] for e in past if phase in e.seconds()]
    if not took:
        return None
    spread = max(max(took) - min(took), MIN_SPREAD * _median(took))
    threshold = max(max(took) + k * spread, floor_s)
    return LearnedStep(phase, since, threshold, min(took), max(took), len(took))


__all__ = [
    "LearnedStep",
    "PastStart",
    "StartKey",
    "comparable",
    "entry_of",
    "learned_step",
    "remember",
    "start_key",
    "startup_eta",
]
