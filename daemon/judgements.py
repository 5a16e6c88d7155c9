"""Judgements of the live world in force, kept across a restart so the next daemon does not make
them again as new.

A stall, an OOM forecast and a vLLM process gone without a word are judged on the daemon's clock
(ticks, GPU readings, the process watch), not on a log record, so the emit mark cannot say they
were written. A restarted daemon rebuilds the session from its log and, while the world is as
it was, judges the same thing again. So the judgements in force are kept in the log source's
checkpoint beside the session they belong to (`keys`), and the first time the next daemon raises
one of them for that session (`again`), what that input caused is written as a replay: the
event log shows one stall, and the supervisor is not told twice. A judgement that ended while
no daemon watched and began again with nothing logged in between is taken for the same one
(its lines say replay; the state and the metrics are right either way).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loadwatch.daemon.state.snapshot import Transition


def raised(t: Transition) -> str | None:
    """The judgement a transition raises, as kept; None: it raises none."""
    if t.kind == "stall_raised":
        return "stall"
    if t.kind == "forecast_raised":
        return f"forecast:{t.gpu_index}"
    if t.kind == "failure" and t.failure_kind == "vanished":
        return "vanished"
    return None


def _cleared(t: Transition) -> str | None:
    if t.kind == "stall_cleared":
        return "stall"
    if t.kind == "forecast_cleared":
        return f"forecast:{t.gpu_index}"
    return None


class Judgements:
    """The judgements in force for the current session, and those a daemon before this one
    raised that this one has not raised again yet."""

    def __init__(self, held: object = ()) -> None:
        """`held`: what the checkpoint kept (`keys`), as read back (anything: it is checked)."""
        keys = held if isinstance(held, list | tuple) else ()
        self._held = {k for k in keys if isinstance(k, str)}
        self._in_force = set(self._held)

    def keys(self) -> list[str]:
        """What the checkpoint keeps."""
        return sorted(self._in_force)

    def again(self, transitions: Sequence[Transition]) -> bool:
        """Whether one live input's transitions raise a judgement made before the restart
        (then they are written as replays); notes them either way."""
        repeat = False
        for t in transitions:
            key = raised(t)
            if key is not None and key in self._held:
                self._held.discard(key)
                repeat = True
        self.note(transitions, replay=False)
        return repeat

    def logged(self) -> None:
        """vLLM logged something new (live): a stall held from before the restart is over, so
        one raised from now on is a new one."""
        self._held.discard("stall")

    def note(self, transitions: Iterable[Transition], *, replay: bool) -> None:
        """What the transitions raise, clear or begin anew; `replay`: they come of records read
        back (a restart rebuilding the session it kept judgements of)."""
        for t in transitions:
            if t.kind == "session_started" and not replay:
                self._held.clear()  # another vLLM start: nothing held is about it
                self._in_force.clear()
            key = raised(t)
            if key is not None:
                self._in_force.add(key)
            gone = _cleared(t)
            if gone is not None:
                self._in_force.discard(gone)
                self._held.discard(gone)
