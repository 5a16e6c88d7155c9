"""The start-up timeline: one vLLM start as the steps an operator thinks in, each with its start,
end and duration, read from the milestones and bars the log shows.

Each signal (a milestone, a bar starting or finishing, the ready line, the first completion)
names a phase (`PHASES`). The rules, in order:

- A signal of the step under way continues it.
- A step's end (`Loading weights took`, `Model loading took`, `torch.compile took ... in total`,
  `Graph capturing finished`, the weights bar's last file) closes it; the next step begins
  there. Its phase is the next signal's: until one comes it is `unknown`. So weight
  post-processing is the time from the weights' end to `Model loading took`, where vLLM prints
  that line; where it does not, that time goes to the step that shows next.
- A word of the step just closed, while the next has said nothing of its own, is another rank's
  (TP workers print the same lines): its end moves the boundary later (the slowest rank ends
  the step); anything else says the step goes on.
- A signal of a phase passed before is a lagging rank's echo and moves nothing, unless the
  process that prints it ended that phase itself and now starts it again (a drafter's second
  weights bar): then it is a new step.
- A signal of a phase not seen yet closes the step under way and opens its own. When it says
  how long it took (`Dynamo bytecode transform time: 18.47 s`, `Graph capturing finished in 4
  secs`, a bar's elapsed time), its step begins that much earlier, never before the closed
  step's own last line.

Steps are contiguous from the session's start, so their durations add up to the time from the
start to the last boundary. A phase lasts until the next phase shows in the log: the quiet time
after a step's last line is the step's (`last_at` says where its own lines ended). A session the
log does not show the start of (a tail of a log) begins with a step whose start is not known
(`before_log`). Times are the fold's (`Fold.at`): never a log stamp against the daemon's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from loadwatch.daemon.state.records import new_tuple
from loadwatch.daemon.state.snapshot import STARTUP_PHASES, STARTUP_UNKNOWN, StartupStepView

# The phases (snapshot.py's STARTUP_PHASES), in load order:
# config: configuration, architecture, engine config, the workers' start; weights: the weights
# read (per loader bar: files, tensors, bytes); weight_postprocess: repacking, quantisation,
# between the weights and the next step; torch_compile; autotune: kernel autotuning and warm-up,
# a bar of its own unit; kv_cache: the profiling run, KV-cache sizing and allocation;
# graph_capture; engine_ready: the engine is up, the API server starts; api_server;
# first_completion: the servable check's completion (`[vllm] servable`).
PHASES = STARTUP_PHASES
UNKNOWN = STARTUP_UNKNOWN
Edge = Literal["start", "on", "end"]
MAX_STEPS = 64
MAX_BARS_PER_STEP = 8
MAX_PROCESSES = 16
OTHERS = "…"  # the processes past MAX_PROCESSES


# The steps and the timeline are named tuples, made with `new_tuple` (`_step`, `_timeline`,
# `_with`): a load marks a step with each milestone, and a frozen dataclass is built through a
# Python-level `__init__` that sets each field, several times slower.
class Step(NamedTuple):
    phase: str
    started_at: float
    ended_at: float | None = None
    last_at: float | None = None  # its own last signal (None: none yet)
    before_log: bool = False  # began before the log does: its start is not known
    bars: tuple[str, ...] = ()  # the keys of the bars it drew (`Session.bars`)
    detail: str | None = None
    firm: bool = False  # opened by a line that says the phase starts there: never moved earlier


class Timeline(NamedTuple):
    steps: tuple[Step, ...] = ()
    # process -> the phases it ended (the default shared by all, as every one: never changed in
    # place, `mark` makes a new one)
    ended: Mapping[str, frozenset[str]] = {}
    done: bool = False  # ready (and served), or the session ended: nothing moves any more
    dropped: int = 0  # early steps let go at MAX_STEPS


def _step(
    phase: str,
    started_at: float,
    last_at: float | None = None,
    before_log: bool = False,
    bars: tuple[str, ...] = (),
    detail: str | None = None,
    firm: bool = False,
) -> Step:
    """A step that has not ended."""
    return new_tuple(Step, (phase, started_at, None, last_at, before_log, bars, detail, firm))


def _timeline(
    steps: tuple[Step, ...], ended: Mapping[str, frozenset[str]], done: bool, dropped: int
) -> Timeline:
    return new_tuple(Timeline, (steps, ended, done, dropped))


def begin(at: float, reason: str) -> Timeline:
    """A new session's timeline: configuration first when the log shows vLLM's start (or the
    daemon started it); otherwise a step of a phase not known yet, begun before the log when
    the session is one the log opened mid-way."""
    if reason in ("log_version", "log_launch_args", "process_start"):
        logged = reason != "process_start"
        return Timeline((_step("config", at, last_at=at if logged else None),))
    return Timeline((_step(UNKNOWN, at, before_log=reason == "first_event"),))


# -- the signals ----------------------------------------------------------------------------------

_MILESTONES: dict[str, tuple[str, Edge]] = {
    "version": ("config", "on"),
    "launch_args": ("config", "on"),
    "engine_config": ("config", "on"),
    "kv_cache.dtype": ("config", "on"),  # printed while vLLM builds its configuration
    "model_load_start": ("weights", "start"),
    "checkpoint_info": ("weights", "on"),
    "gguf_shards": ("weights", "on"),
    "model_init": ("weights", "on"),
    "weights_loaded": ("weights", "end"),
    "model_memory": ("weight_postprocess", "end"),  # `Model loading took`: the load is over
    "torch_compile.cache_dir": ("torch_compile", "start"),
    "torch_compile.total": ("torch_compile", "end"),
    "engine_init": ("engine_ready", "start"),
    "graph_capture": ("graph_capture", "end"),
}
_KINDS: dict[str, tuple[str, Edge]] = {
    "weights_loaded": ("weights", "end"),
    "torch_compile": ("torch_compile", "on"),
    "kv_cache": ("kv_cache", "on"),
    "api_server_start": ("api_server", "on"),
}
_DETAILS = {
    "torch_compile.cache_load": "loaded from the compile cache",
    "torch_compile.aot_load": "AOT compilation loaded from the cache",
    "torch_compile.aot_save": "compiled, AOT artifact saved",
}


# The milestones whose seconds are their own phase's time so far (`Loading weights took`,
# `Graph capturing finished in`); not `init engine ... took` nor `Model loading took`, whose
# seconds span several steps.
_TIMED = frozenset(
    {
        "weights_loaded",
        "torch_compile.dynamo",
        "torch_compile.compile_graph",
        "torch_compile.cache_load",
        "torch_compile.total",
        "kv_cache.profiling_run",
        "graph_capture",
    }
)


def milestone_signal(kind: str, detail: str | None) -> tuple[str, Edge, str | None, bool] | None:
    """(phase, edge, a note for the step, whether its seconds are the phase's) of a milestone,
    or None for one of no phase (the attention backend, shutdown lines)."""
    key = kind if detail is None else f"{kind}.{detail}"
    hit = _MILESTONES.get(key) or _MILESTONES.get(kind) or _KINDS.get(kind)
    if hit is None:
        return None
    return hit[0], hit[1], _DETAILS.get(key), key in _TIMED or kind in _TIMED


def bar_phase(kind: str) -> str | None:
    """The phase of a tqdm bar: the weights (and their prefetch), graph capture, kernel
    autotuning (a bar of its own unit); None for another bar counting `it` (a download's
    `Fetching 163 files`): it says nothing of where the start-up is."""
    if kind in ("weights", "prefetch"):
        return "weights"
    return kind if kind in ("graph_capture", "autotune") else None


# -- folding a signal -----------------------------------------------------------------------------


def mark(
    tl: Timeline,
    phase: str,
    t: float,
    who: str | None,
    edge: Edge,
    took: float | None = None,
    bar: str | None = None,
    detail: str | None = None,
) -> Timeline:
    """`tl` after a signal of `phase` at `t` from process `who` (see the module's rules).
    `took`: the seconds it says its phase took up to `t`."""
    if tl.done or not tl.steps:
        return tl
    steps = list(tl.steps)
    cur = steps[-1]
    who = who or "-"
    ended = tl.ended
    if who not in ended and len(ended) >= MAX_PROCESSES:
        who = OTHERS
    again = edge == "start" and phase in ended.get(who, ())
    implied = t - took if took is not None and took > 0 else None
    if cur.phase == phase and not again:
        steps[-1] = _touch(cur, t, bar, detail)
        if implied is not None and implied < cur.started_at and not cur.firm:
            _backdate(steps, implied)
        if edge == "end":
            _close(steps, t)
    elif cur.last_at is None and len(steps) > 1 and steps[-2].phase == phase and not again:
        prev = steps[-2]
        if edge == "end":  # a slower rank ends it later (never earlier)
            end = max(t, prev.ended_at or t)
            steps[-2] = _touch(_with(prev, ended_at=end), end, bar, detail)
            steps[-1] = _with(cur, started_at=end)
        else:  # it is not over: another rank is still in it
            steps[-2] = _touch(_with(prev, ended_at=None), t, bar, detail)
            del steps[-1]
    elif not again and any(s.phase == phase for s in steps):
        pass  # a lagging rank's echo of a phase passed
    elif cur.phase == UNKNOWN:  # the step under way says what it is
        steps[-1] = _touch(_with(cur, phase=phase), t, bar, detail)
        if edge == "end":
            _close(steps, t)
    else:
        floor = cur.last_at if cur.last_at is not None else cur.started_at
        t = max(t, floor)  # (see `_close`)
        start = min(max(implied, floor), t) if implied is not None else t
        steps[-1] = _with(cur, ended_at=start)
        if start <= cur.started_at and cur.last_at is None:
            del steps[-1]  # nothing of its own and no time: it never was
        firm = edge == "start" and implied is None
        bars = (bar,) if bar else ()
        steps.append(_step(phase, start, last_at=t, bars=bars, detail=detail, firm=firm))
        if edge == "end":
            _close(steps, t)
    if edge == "end" and phase not in ended.get(who, ()):
        ended = {**ended, who: ended.get(who, frozenset()) | {phase}}
    return _bounded(steps, ended, tl)


def ready(tl: Timeline, t: float, who: str | None, serve_check: bool) -> Timeline:
    """vLLM serves (its ready line, or /health 200): the API server's step ends; the first
    completion's begins when the servable check is on, else the start-up is over."""
    tl = mark(tl, "api_server", t, who, "end")
    if tl.done or not tl.steps:
        return tl
    steps = list(tl.steps)
    last = steps[-1]
    if last.ended_at is None:
        if last.phase == UNKNOWN and last.last_at is None:
            del steps[-1]  # the step the API server's end opened: nothing comes after ready
        else:  # (the ready line came while another step was open: it ends there)
            steps[-1] = _with(last, ended_at=_end(last, t))
    if serve_check:
        start = max(t, steps[-1].ended_at or t) if steps else t
        steps.append(_step("first_completion", start, firm=True))
        return _timeline(tuple(steps), tl.ended, False, tl.dropped)
    return _timeline(tuple(steps), tl.ended, True, tl.dropped)


def served(tl: Timeline, t: float) -> Timeline:
    """The servable check's completion succeeded: the start-up is over."""
    if tl.done or not tl.steps or tl.steps[-1].phase != "first_completion":
        return tl
    last = tl.steps[-1]
    steps = (*tl.steps[:-1], _with(last, ended_at=_end(last, t), last_at=t))
    return _timeline(steps, tl.ended, True, tl.dropped)


def finish(tl: Timeline, t: float) -> Timeline:
    """The session failed or stopped at `t`: the step under way ends there."""
    if tl.done or not tl.steps:
        return _timeline(tl.steps, tl.ended, True, tl.dropped)
    steps = list(tl.steps)
    last = steps[-1]
    if len(steps) > 1 and last.phase == UNKNOWN and last.last_at is None and t <= last.started_at:
        del steps[-1]  # it ended where the step before did: that one is where it stopped
    else:
        steps[-1] = _with(last, ended_at=_end(last, t))
    return _timeline(tuple(steps), tl.ended, True, tl.dropped)


_FIELD_AT = {name: i for i, name in enumerate(Step._fields)}


def _with(s: Step, **changes: Any) -> Step:
    """`s` with `changes` (`_replace` is an interpreted call)."""
    values = list(s)
    for name, value in changes.items():
        values[_FIELD_AT[name]] = value
    return new_tuple(Step, tuple(values))


def _touch(s: Step, t: float, bar: str | None, detail: str | None) -> Step:
    bars = s.bars
    if bar and bar not in bars and len(bars) < MAX_BARS_PER_STEP:
        bars = (*bars, bar)
    last = max(t, s.started_at, s.last_at if s.last_at is not None else t)
    return _with(s, last_at=last, bars=bars, detail=detail or s.detail)


def _end(s: Step, t: float) -> float:
    """Where step `s` ends if at `t`: never before its start nor its own last line. (Times are
    the fold's; read from a log by `analyze`, a bar's time is worked out from its elapsed field
    and may run a little ahead of the next stamped line.)"""
    return max(t, s.started_at, s.last_at if s.last_at is not None else t)


def _close(steps: list[Step], t: float) -> None:
    """The last step ends at `t`; the next begins there, its phase the next signal's."""
    last = steps[-1]
    end = _end(last, t)
    steps[-1] = _with(last, ended_at=end)
    steps.append(_step(UNKNOWN, end))


def _backdate(steps: list[Step], implied: float) -> None:
    """The last step began at `implied` (its line says so), earlier than first seen: it takes
    that time from the step before, never before that step's own last line."""
    if len(steps) < 2:
        return
    prev = steps[-2]
    floor = prev.last_at if prev.last_at is not None else prev.started_at
    start = max(implied, floor)
    if start >= steps[-1].started_at:
        return
    steps[-1] = _with(steps[-1], started_at=start)
    if start <= prev.started_at and prev.last_at is None:
        del steps[-2]
        if len(steps) > 1:
            steps[-2] = _with(steps[-2], ended_at=start)
    else:
        steps[-2] = _with(prev, ended_at=start)


def _bounded(steps: list[Step], ended: Mapping[str, frozenset[str]], tl: Timeline) -> Timeline:
    dropped = tl.dropped
    if len(steps) > MAX_STEPS:
        dropped += len(steps) - MAX_STEPS
        steps = steps[-MAX_STEPS:]
    return _timeline(tuple(steps), ended, tl.done, dropped)


# -- reading it ---------------------------------------------------------------------------------


def timeline_view(tl: Timeline, bars: Mapping[str, Any], now: float) -> tuple[StartupStepView, ...]:
    """The steps as exporters show them; the open one's duration runs to `now`. A bar named
    is shown with what it counted: `Loading safetensors checkpoint shards: 163/163 files`."""
    out = []
    for s in tl.steps:
        end = s.ended_at if s.ended_at is not None else max(now, s.started_at)
        counted = []
        for key in s.bars:
            b = bars.get(key)
            if b is not None:
                counted.append(f"{b.desc}: {b.done}/{b.total} {b.unit}")
        out.append(
            StartupStepView(
                phase=s.phase,
                started_at=s.started_at,
                ended_at=s.ended_at,
                duration_s=max(end - s.started_at, 0.0),
                last_line_at=s.last_at,
                began_before_log=s.before_log,
                detail=s.detail,
                bars=tuple(counted),
            )
        )
    return tuple(out)
