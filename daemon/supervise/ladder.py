"""The ladder of remedies of a crash loop, and the loop's first failure.

The supervisor asks it for the command of each start (`argv`) and tells it of each failed start
(`failed`) and of readiness (`ready`). After a failed start it

1. keeps the loop's first failure (kind, phase, message, excerpt, the redacted command), the root
   cause the later attempts bury;
2. reverts the remedy that start ran with, if any: it did not help;
3. when a restart follows, applies the next remedy of `[vllm] remedies` that has a change for
   this failure and was not tried in this loop (each at most once: the ladder never loops), or
   says that there is none (`outcome` none, with the reason; the ladder is `exhausted` when
   remedies were tried and none is left, which is judged when no restart follows too).

Each step is a `vllm.remedy` line (`say`) before the restart, the loop on `/status` (`changed`
hands it to the daemon's state), and the loop is saved in the state directory (crashloop_file.py)
so that a restart of the daemon starts where the ladder was, with the first failure. A start that
reaches ready ends the loop: the remedy it ran with helped and stays in the command for this
daemon's life; the file is removed.

A start the preflight refuses (`refused`, `preflight = "refuse"`) is judged as a failure in phase
`preflight`: its memory plan predicts vLLM's own error, estimate included, so the same remedies
apply before vLLM runs at all (the preflight checks the command `argv` gives). A loop kept for
another command than the configured one is dropped when the daemon starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from loadwatch.daemon.crashloop_file import CrashLoopFile
from loadwatch.daemon.state.crashloop import (
    MAX_ARGV,
    MAX_LINE_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_STEPS,
    CrashLoop,
    FirstFailure,
    RemedyCounts,
    RemedyStep,
    excerpt_of,
)
from loadwatch.daemon.state.failures import root_cause
from loadwatch.daemon.state.session import Session
from loadwatch.daemon.state.timeline import UNKNOWN
from loadwatch.daemon.supervise.remedies import (
    PREFLIGHT,
    STALL,
    Change,
    Failed,
    Settings,
    carry_out,
    no_remedy,
    predicted,
    propose,
    step_diff,
    undo,
    with_change,
)

Seen = tuple[Failed, tuple[str, ...]]  # a failure and its excerpt


def seen_in(session: Session | None) -> Seen | None:
    """The failure a session (state/session.py's `Session`) ended with: its root cause, and the
    phase of the start-up step under way when it failed."""
    if session is None:
        return None
    root = root_cause(session.failures)
    steps = session.timeline.steps
    # (the step under way, even when its phase is not known yet: after the weights' last line
    # and before the next step's first, an OOM is not the weights')
    phase = steps[-1].phase if steps else UNKNOWN
    if root is None:
        kind = session.failure_kind or "other"
        return Failed(kind, phase, session.reason or ""), ()
    return Failed(root.kind, phase, root.message[:MAX_MESSAGE_CHARS]), excerpt_of(root)


class Ladder:
    def __init__(
        self,
        base_argv: Sequence[str],
        remedies: Sequence[str],
        settings: Settings,
        store: CrashLoopFile,
        *,
        seen: Callable[[], Seen | None],
        redact: Callable[[Sequence[str]], Sequence[str]],
        say: Callable[..., None],
        changed: Callable[[CrashLoop, RemedyCounts], None],
        clock: Callable[[], float],
    ) -> None:
        self._base = tuple(base_argv)
        self._remedies = tuple(remedies)
        self._settings = settings
        self._store = store
        self._seen = seen
        self._redact = redact
        self._say = say
        self._changed = changed
        self._clock = clock
        self._kept: tuple[RemedyStep, ...] = ()  # remedies that helped, in this daemon's life
        self.counts = RemedyCounts()
        self.loop = store.load()
        first = self.loop.first_failure
        if first is not None and first.argv != self._redacted(self._base):
            # The operator changed the command since (a fix, say): its failures and remedies
            # are not this command's; a patch of the model that loop applied and never judged
            # is put back, as it would have been had its start failed.
            tried = self.loop.in_effect
            self._say(
                "vllm.crash_loop_dropped",
                reason="the configured command differs from the one the kept crash loop began "
                "with: a new command starts a new loop",
                reverted=list(undo(tried)) if tried is not None and tried.patched else None,
            )
            self.loop = CrashLoop()
            store.save(self.loop)
        self._publish()

    def _redacted(self, argv: Sequence[str]) -> tuple[str, ...]:
        return tuple(self._redact(argv))[:MAX_ARGV]

    def argv(self) -> tuple[str, ...]:
        """The command of the next start: the configured one with the remedies that helped and
        the one being tried."""
        argv = self._base
        now = self.loop.in_effect
        for step in (*self._kept, *((now,) if now is not None else ())):
            if step.option is not None:
                argv = with_change(argv, step.option, step.after)
        return argv

    def failed(self, restarting: bool, stalled_in: str | None = None) -> None:
        """A start failed; `restarting`: another follows (else no remedy is applied: the first
        failure is kept, the remedy it ran with reverted, the ladder judged exhausted or not).
        `stalled_in`: the supervisor ended it for a stall in that start-up phase (a failure of
        kind `stall`, whatever the log says)."""
        if stalled_in is not None:
            why = f"the start stalled in {stalled_in} and was ended"
            self._judge((Failed(STALL, stalled_in, why), (why,)), restarting)
            return
        self._judge(self._seen() or (Failed("other", UNKNOWN, ""), ()), restarting)

    def refused(self, reason: str) -> None:
        """The preflight refused a start (`preflight = "refuse"`): what it predicts, in vLLM's
        own words where the memory plan gives them, is judged as a failure in phase `preflight`
        (its start never ran), so the same remedies apply before vLLM runs at all."""
        if self._remedies:
            failed = predicted(reason)
            self._judge((failed, (failed.message[:MAX_LINE_CHARS],)), True)

    def _judge(self, seen: Seen, restarting: bool) -> None:
        failed, excerpt = seen
        loop = self.loop
        if loop.first_failure is None:
            argv = self._redacted(self.argv())
            first = FirstFailure(
                failed.kind, failed.phase, failed.message, excerpt, argv, self._clock()
            )
            loop = CrashLoop(first)
        tried = loop.in_effect
        if tried is not None:
            undone = replace(tried, outcome="reverted", at=self._clock())
            loop = replace(loop, remedies=(*loop.remedies[:-1], undone))
            again = "was refused" if failed.phase == PREFLIGHT else "failed again"
            why = f"the start with it {again} ({failed.kind}); reverted"
            self._step(undone, why, failed, undo(tried))
        if self._remedies and (restarting or loop.remedies):
            loop = self._next(loop, failed, restarting)
        self.loop = loop
        self._store.save(loop)
        self._publish()

    def _next(self, loop: CrashLoop, failed: Failed, apply: bool) -> CrashLoop:
        """The next remedy applied (`apply`: a start follows), or why there is none; without a
        start to follow, only whether the ladder is exhausted."""
        used = {s.remedy for s in loop.remedies}
        reasons: list[str] = []
        argv = self.argv()  # (the one that failed is reverted by now: loop.in_effect is None)
        for name in self._remedies:
            if name in used:
                continue
            change = propose(name, failed, argv, self._settings)
            if isinstance(change, Change) and len(loop.remedies) < MAX_STEPS:
                if not apply:
                    return loop  # (one is left, for the next start: after a daemon restart)
                change = carry_out(change)  # (the patch of the model's config, if it is one)
                if isinstance(change, str):
                    reasons.append(f"{name}: {change}")
                    continue
                step = RemedyStep(
                    name,
                    "applied",
                    change.reason,
                    change.option,
                    change.before,
                    change.after,
                    self._clock(),
                    step_diff(change),
                    change.patch_dir,
                )
                self._step(step, change.reason, failed, step.diff)
                return replace(loop, remedies=(*loop.remedies, step), exhausted=False)
            if isinstance(change, str):
                reasons.append(f"{name}: {change}")
        why = no_remedy(failed)
        exhausted = bool(loop.remedies)
        if why is None:
            tried = ", ".join(sorted(used))
            why = "; ".join(reasons) or (
                f"every remedy for it was tried ({tried})"
                if exhausted
                else f"no remedy configured for {failed.kind}"
            )
        if exhausted:
            why = f"ladder exhausted: {why}"
        self._say(
            "vllm.remedy",
            remedy=None,
            outcome="none",
            reason=why,
            kind=failed.kind,
            phase=failed.phase,
        )
        return replace(loop, exhausted=exhausted)

    def ready(self) -> None:
        """A start reached ready: the remedy it ran with helped; the crash loop is over."""
        loop = self.loop
        step = loop.in_effect
        if step is not None:
            helped = replace(step, outcome="helped", at=self._clock())
            loop = replace(loop, remedies=(*loop.remedies[:-1], helped))
            self._kept = (*self._kept, helped)
            self._step(helped, "the start with it reached ready", None, helped.diff)
        if loop.first_failure is None and step is None:
            return
        self.loop = replace(loop, first_failure=None, exhausted=False)
        self._store.save(self.loop)  # (removes the file: no loop under way)
        self._publish()

    def _step(
        self, step: RemedyStep, reason: str, failed: Failed | None, diff: Sequence[str]
    ) -> None:
        self.counts = self.counts.add(step.remedy, step.outcome)
        self._say(
            "vllm.remedy",
            remedy=step.remedy,
            outcome=step.outcome,
            reason=reason,
            diff=list(diff),
            kind=failed.kind if failed is not None else None,
            phase=failed.phase if failed is not None else None,
        )

    def _publish(self) -> None:
        self._changed(self.loop, self.counts)


__all__ = ["Ladder", "Seen", "seen_in"]
