"""Every process that writes to the log, and the rank that went silent while its peers moved on.

A vLLM start is many processes writing to one log, told apart by their prefix: workers by rank
(`Worker_TP3`, `VllmWorker_rank3`, `Worker_DP0_TP1_EP1`), engine cores, API servers, Ray
actors. Per session each one's first and last line the parser read (offset and time), the phase
the session was in at its last line, the weights shard reached by then, and its own weights bar
where it prints one, are kept in `Session.processes` by `Worker_TP5 pid=1234` (Ray's actors
share a name): folded by nodefold.py's `track_node`, one dict update per event, and a run of
k/v warnings or a bar's burst once per process.

A process is silent while its peers moved on when, among the processes of its family (the name
without its rank numbers: `Worker_TP`), more than half of its peers, and at least two, logged
past it (two weights-bar updates later or more, a later phase, or a threshold later), and its
own last line is older than that threshold. The check is a pass over the session's processes:
it runs with the stall check of a run that holds a `Tick` (the daemon ticks each second;
`analyze` once a second of the log's time), never per record. Its time is the fold's own (the daemon's
clock live, the log's stamps analysed), never a log stamp against the daemon's clock.
Peers that all stopped together name nobody: that is the session's own stall. A load where
only rank 0 goes on (it prints the bar and the steps after the weights) names nobody either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from loadwatch.daemon.state.durations import duration
from loadwatch.daemon.state.records import new_tuple
from loadwatch.daemon.state.session import ProcessTrack, Session, Stall
from loadwatch.parsers.events import Event, ShardProgress

if TYPE_CHECKING:
    from loadwatch.daemon.state.fold import Fold

# processes per session (a node holds 8 or 16 ranks, plus cores and servers)
MAX_TRACKED: Final = 128
MIN_PEERS_ON: Final = 2  # peers that must have moved on to name a rank
_RANK_DIGITS = str.maketrans("", "", "0123456789")
_ORDER: Final = {"starting": 0, "loading_weights": 1, "post_load": 2, "ready": 3}


def family(name: str) -> str:
    return name.translate(_RANK_DIGITS)


def who(name: str, pid: int | None) -> str:
    """A process's key and how the stall names it: Ray's actors share one name, not a pid."""
    return name if pid is None else f"{name} pid={pid}"


# (name, pid) -> `who`: a load's every line is noted under its process's key, and the same
# string each time is hashed once
_KEYS: Final[dict[tuple[str, int | None], str]] = {}


def _key(spot: tuple[str, int | None]) -> str:
    key = _KEYS.get(spot)
    if key is None:
        if len(_KEYS) >= 4 * MAX_TRACKED:
            _KEYS.clear()
        key = _KEYS[spot] = who(spot[0], spot[1])
    return key


def track_process(f: Fold, ev: Event) -> None:
    """Note one log event's line under its process."""
    name = ev.process
    if name is not None and f.sess is not None:
        if isinstance(ev, ShardProgress) and ev.bar == "weights":
            _weights(f, 1, ev.done)
        at = f.at(ev.ts)
        _note(f, f.mine("processes"), _key((name, ev.pid)), ev, ev, at, at, _moment(f))


# Each process's first and last line in a run, as indexes, by (name, pid): `process_spans`
Spans = dict[tuple[str | None, int | None], tuple[int, int]]


def process_spans(run: Sequence[Event]) -> Spans:
    """Each process's first and last line in `run`, as indexes, by (name, pid) in order of first
    appearance (lines without a process too, under None): one pass, each field read once."""
    spans: Spans = {}
    for i, ev in enumerate(run):
        key = (ev.process, ev.pid)
        span = spans.get(key)
        spans[key] = (i, i) if span is None else (span[0], i)
    return spans


def track_processes(
    f: Fold,
    run: Sequence[Event],
    prev: float | None = None,
    *,
    moves_time: bool = True,
    spans: Spans | None = None,
    times: list[float] | None = None,
) -> None:
    """Note a run of events folded in one call (k/v warnings back to back, a bar's burst) as
    one at a time would: only each process's first (when it is new) and last line matter.
    Replayed, each line's time is worked out as `Fold.at` would have, from `prev` (the
    session's last event time before the run) on; `moves_time=False`: the run's events leave
    that time where it is (client text), so each line's time is `Fold.at`'s now. `spans`: the
    run's `process_spans`, and `times` its records' (`replayed`), when the caller has them."""
    if f.sess is None:
        return
    if spans is None:
        spans = process_spans(run)
    end = run[-1]
    if isinstance(end, ShardProgress) and end.bar == "weights":  # (a bar's burst: all of it)
        _weights(f, len(run), end.done)
    timed = f.replay and moves_time  # (each line at its own time, as replayed)
    moment = _moment(f)
    procs = f.mine("processes")
    for spot, (j, i) in spans.items():
        if spot[0] is None:
            continue
        key = _key(spot)  # type: ignore[arg-type]
        if key in procs:
            j = i
        if timed:
            if times is None:
                times = replayed(f, run, prev)
            cleared = _note(f, procs, key, run[j], run[i], times[i], times[j], moment)
        else:
            cleared = _note(f, procs, key, run[j], run[i], f.at(run[i].ts), f.at(run[j].ts), moment)
        if cleared:
            moment = _moment(f)


def replayed(f: Fold, run: Sequence[Event], prev: float | None) -> list[float]:
    """Each record's time in a run folded replayed, as `Fold.at` gives it one at a time, the
    session's last event time before the run being `prev`."""
    out: list[float] = []
    t = prev
    for ev in run:
        if ev.ts is None:
            t = t if t is not None else f.now
        else:
            x = ev.ts + f.offset
            t = min(x if t is None or x > t else t, f.now)
        out.append(t)
    return out


def _weights(f: Fold, updates: int, done: int) -> None:
    sd = f.draft().__dict__
    sd["weights_updates"] += updates
    sd["weights_done"] = done


Moment = tuple[str, str, int, int]


def _moment(f: Fold) -> Moment:
    """What a process's line notes of the session now: its live phase, the step under way, the
    weights bar's updates and shards (the same for every process of a run)."""
    s = f.s
    steps = s.timeline.steps
    return f.live_phase(), steps[-1].phase if steps else "", s.weights_updates, s.weights_done


def _note(
    f: Fold,
    procs: dict[str, ProcessTrack],
    key: str,
    first: Event,
    last: Event,
    at: float,
    first_at: float,
    moment: Moment,
) -> bool:
    """Note `last` (and, for a process new to the session, `first`) under process `key` in
    `procs` (the session's, as the fold's own), at `moment`; True when that ended the stall of
    this rank, which changes the moment."""
    rec = procs.get(key)
    if rec is None and len(procs) >= MAX_TRACKED:
        return False
    phase, step, mark, shard = moment
    bar_done: int | None
    bar_total: int | None
    if isinstance(last, ShardProgress) and last.bar == "weights":
        bar_done, bar_total = last.done, last.total
    elif rec is not None:
        bar_done, bar_total = rec.bar_done, rec.bar_total
    else:
        bar_done = bar_total = None
    if rec is None:
        name = last.process
        assert name is not None
        fam, pid, first_offset, first_seen = family(name), last.pid, first.offset, first_at
    else:
        name, fam, pid = rec.name, rec.family, rec.pid
        first_offset, first_seen = rec.first_offset, rec.first_at
    procs[key] = new_tuple(
        ProcessTrack,
        (
            name,
            fam,
            pid,
            first_offset,
            first_seen,
            last.offset,
            at,
            phase,
            mark,
            shard,
            bar_done,
            bar_total,
            step,
        ),
    )
    st = f.s.stall
    if st is not None and st.kind == "rank" and st.process == key:
        f.clear_stall(at, f"{key} logged again")
        return True
    return False


# -- the silent rank ------------------------------------------------------------------------------


def _moved_on(peer: ProcessTrack, p: ProcessTrack, threshold_s: float) -> bool:
    """`peer` logged past `p`: two weights-bar updates or more later (one may straddle: a
    rank's lines of a shard on either side of rank 0's update), a later phase, or a threshold
    later."""
    return (
        peer.mark - p.mark >= 2
        or _ORDER.get(peer.phase, 0) > _ORDER.get(p.phase, 0)
        or peer.last_at - p.last_at > threshold_s
    )


def silent_ranks(
    procs: Mapping[str, ProcessTrack],
    now: float,
    threshold_s: float,
    read_at: float | None = None,
) -> list[tuple[ProcessTrack, int]]:
    """The processes silent for over `threshold_s` at `now` while most of their peers moved on,
    each with how many peers did. `read_at`: when the daemon last read a backlog (silence
    counts from there at the earliest)."""
    # Silent for over `threshold_s` at `now`, counted from a backlog's read at the earliest:
    # the last line before `before`
    before = now - threshold_s
    if read_at is not None and read_at >= before:
        return []  # a backlog read since: nobody silent that long
    silent = {p.family for p in procs.values() if p.last_at < before}
    if not silent:
        return []  # (what nearly every tick finds: nobody silent to hold against peers)
    families: dict[str, list[ProcessTrack]] = {}
    for p in procs.values():
        # (only the families of silent processes: during a load the API server and the engine
        # core, families of one, are silent at every tick while the workers print)
        if p.family in silent:
            families.setdefault(p.family, []).append(p)
    out: list[tuple[ProcessTrack, int]] = []
    for members in families.values():
        peers = len(members) - 1
        if peers < MIN_PEERS_ON:
            continue
        for p in members:
            if p.last_at >= before:
                continue
            on = sum(1 for q in members if q is not p and _moved_on(q, p, threshold_s))
            if on >= MIN_PEERS_ON and 2 * on > peers:
                out.append((p, on))
    return out


def silent_rank_reason(p: ProcessTrack, peers_on: int, now: float) -> str:
    name = who(p.name, p.pid)
    silent = duration(now - p.last_at)
    if p.phase == "loading_weights" and p.mark:
        return f"{name} silent for {silent} since shard {p.shard} while {peers_on} peers read on"
    step = p.step or p.phase or "starting"
    return f"{name} silent for {silent} in {step} while {peers_on} peers logged on"


def check_silent_rank(f: Fold) -> None:
    """After the stall check of a run that holds a Tick: a stall for the rank silent longest
    while its peers moved on, held to the threshold the session's stall check uses now."""
    s, watch = f.sess, f.watch
    if s is None or watch is None or s.stall is not None or len(s.processes) <= MIN_PEERS_ON:
        return
    found = silent_ranks(s.processes, f.now, watch.threshold_s, s.backlog_read_at)
    if found:
        p, on = min(found, key=lambda x: x[0].last_at)
        reason = silent_rank_reason(p, on, f.now)
        key = who(p.name, p.pid)
        f.raise_stall(
            Stall("rank", p.last_at, f.now, watch.threshold_s, None, reason, s.phase, key)
        )


# -- the view ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessView:
    """One process of the session in /status and `analyze --json`."""

    name: str
    pid: int | None
    first_offset: int
    first_at: float
    last_offset: int
    last_at: float
    silent_s: float  # since its last line
    phase: str  # the session's phase at its last line
    step: str | None  # the start-up's step under way at its last line (timeline.py)
    shard: int | None  # the weights shards done at its last line (None: no weights bar yet)
    bar_done: int | None  # its own weights bar, where it prints one
    bar_total: int | None
    silent_while_peers_moved_on: bool


def process_views(s: Session, now: float, threshold_s: float | None) -> tuple[ProcessView, ...]:
    """The session's processes in order of their first line, each marked when it is the rank
    silent while its peers moved on (the stall's, or judged now against `threshold_s`)."""
    named: set[str] = set()
    if s.stall is not None and s.stall.kind == "rank" and s.stall.process is not None:
        named.add(s.stall.process)
    if threshold_s is not None and s.processes:
        found = silent_ranks(s.processes, now, threshold_s, s.backlog_read_at)
        named.update(who(p.name, p.pid) for p, _ in found)
    return tuple(
        ProcessView(
            name=p.name,
            pid=p.pid,
            first_offset=p.first_offset,
            first_at=p.first_at,
            last_offset=p.last_offset,
            last_at=p.last_at,
            silent_s=max(now - p.last_at, 0.0),
            phase=p.phase,
            step=p.step or None,
            shard=p.shard if p.mark else None,
            bar_done=p.bar_done,
            bar_total=p.bar_total,
            silent_while_peers_moved_on=who(p.name, p.pid) in named,
        )
        for p in s.processes.values()  # (in the order of their first lines)
    )


__all__ = [
    "ProcessView",
    "check_silent_rank",
    "family",
    "process_spans",
    "process_views",
    "silent_rank_reason",
    "silent_ranks",
    "track_process",
    "track_processes",
    "who",
]
