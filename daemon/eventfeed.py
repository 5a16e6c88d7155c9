"""The event log's one feeder: every line the daemon writes goes through `EventFeed`.

Most lines are written as they are told (`line`, `problem`). The effects of a run of log records
(its log events, and the state transitions its records caused) are written as the log source
tagged the run (`sources/log/source.py`):

- emit "new": all of them;
- "none": the log events not (written by the daemon before), the transitions marked
  ``"replay": true`` (re-derived while the state is rebuilt);
- "missing" (a run a kill cut short): those the event log file lacks, as usual; with no file to
  read back, all of them, marked ``replay``.

A line is known by what caused it, not by its content: the name and the offset of the record
(transitions caused by a record carry it as ``offset``), and the k-th of that name from that
record. So a transition re-derived by a restart at a later clock is still the same transition.

Folding is how the lines are rendered, nothing more: k/v scale warnings back to back in a run's
effects (a load prints one per layer, scale and worker) are written as one `log.kv_scale_run`
line that lists each record's offset and time (`offsets`, `record_ts`: what a record's own line
is known by) and sums what they say (count, layers with their records, scales, processes). Which records a folded line holds depends only
on the run's events in order, so the run a kill cut short, written again by the restart, folds
the same records into the same lines; the records a written line holds are known as written.
There is no setting for it: the line lists what identifies each record (its offset and time;
vLLM's log holds the record itself at that offset), one format serves every reader of the event log and the
restart's read-back, and a line per record would write ten times the lines during a load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from loadwatch.daemon.sources.log.emitmark import FOLDED_AS, Ordinals
from loadwatch.daemon.sources.log.source import Notice, Run
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import Event, KvScaleWarning
from loadwatch.parsers.events import field_names
from loadwatch.parsers.vllm.argv_secrets import Redactor


class EventFeed:
    def __init__(self, eventlog: EventLog, redactor: Redactor | None = None) -> None:
        self.eventlog = eventlog
        self.redactor = redactor or Redactor()
        self._error: str | None = None  # the event log file's last failure, said once

    def line(self, name: str, **fields: Any) -> None:
        self.eventlog.emit(name, **fields)

    def problem(self, text: str) -> None:
        self.eventlog.emit("daemon.problem", error=self.redactor.text(text))

    def notice(self, notice: Notice) -> None:
        if notice.name == "daemon.problem":
            self.problem(str(notice.fields.get("error", "")))
        else:
            self.eventlog.emit(notice.name, **notice.fields)

    def position(self) -> tuple[str, int] | None:
        return self.eventlog.position()

    def transition(self, t: Transition, *, replay: bool = False) -> None:
        """A transition no log record caused (a tick's stall, a GPU reading's forecast)."""
        fields = t.to_dict()
        kind = fields.pop("transition")
        if replay:
            fields["replay"] = True
        self.eventlog.emit(f"transition.{kind}", **fields)

    def check(self) -> None:
        """The event log's file failing (a full disk) is said on the console, which works."""
        error = self.eventlog.last_error
        if error != self._error:
            if error is not None:
                self.problem(error)
            else:
                self.eventlog.emit("daemon.recovered", source="eventlog")
            self._error = error

    def effects(self, run: Run) -> RunEffects:
        return RunEffects(self.eventlog, run)


_KV: Final = f"log.{KvScaleWarning.type}"


class RunEffects:
    """Writes the effects of one run, each exactly once (see the module doc): used as a context,
    whose end writes the folded line still open, and the run's lines to the file in one write
    (`EventLog.held`)."""

    def __init__(self, eventlog: EventLog, run: Run) -> None:
        self._eventlog = eventlog
        self._run = run
        self._ordinal = Ordinals()
        self._kv: list[KvScaleWarning] = []  # back to back, not written yet
        self._held = eventlog.held()

    def __enter__(self) -> RunEffects:
        self._held.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            self._held.__exit__(None, None, None)

    def transition(self, t: Transition, offset: int) -> None:
        self._close_fold()
        fields = t.to_dict()
        kind = fields.pop("transition")
        fields.setdefault("offset", offset)  # (as the fold notes it)
        self._write(f"transition.{kind}", fields, log=False)

    def part(
        self,
        events: Sequence[Event],
        transitions: Sequence[Transition],
        effect: Callable[[Transition, int], None],
    ) -> None:
        """The effects of a part of the run folded in one call, in record order: the
        transitions a record caused (`effect` writes each) before that record's event, as one
        event at a time would; those judged after the part's last record (a stall, a cleared
        forecast) at its end."""
        i, n = 0, len(transitions)
        for ev in events:
            while i < n and transitions[i].offset == ev.offset:
                effect(transitions[i], ev.offset)
                i += 1
            self.event(ev)
        while i < n:
            effect(transitions[i], events[-1].offset)
            i += 1

    def event(self, ev: Event) -> None:
        if type(ev) is KvScaleWarning and not ev.deprecated:
            self._kv.append(ev)
            return
        self._close_fold()
        self._write(f"log.{ev.type}", event_fields(ev), log=True)

    def close(self) -> None:
        self._close_fold()

    def _close_fold(self) -> None:
        kv = self._kv
        if not kv:
            return
        self._kv = []
        run = self._run
        if run.emit == "none":
            return  # written before
        if run.emit == "missing" and run.written is not None:
            written = run.written
            kv = [ev for ev in kv if self._ordinal((_KV, ev.offset)) not in written]
            if not kv:
                return
        if len(kv) == 1:
            fields = event_fields(kv[0])
            name = _KV
        else:
            fields = folded(kv)
            name = FOLDED_AS[_KV]
        if run.emit == "missing" and run.written is None:
            fields["replay"] = True
        self._eventlog.emit_fields(name, fields)

    def _write(self, name: str, fields: dict[str, Any], *, log: bool) -> None:
        run = self._run
        if run.emit == "none":
            if log:
                return
            fields["replay"] = True
        elif run.emit == "missing":
            key = self._ordinal((name, fields["offset"]))
            if run.written is None:
                fields["replay"] = True
            elif key in run.written:
                return
        self._eventlog.emit_fields(name, fields)


_NAMES: Final[dict[type, tuple[str, ...]]] = {}


def event_fields(ev: Event) -> dict[str, Any]:
    """A log event's line: `to_dict` without the type and the fields that are None (compiled
    here: a load writes thousands of bar updates a second while a backlog is read)."""
    out: dict[str, Any] = {}
    cls = type(ev)
    names = _NAMES.get(cls)
    if names is None:  # (per class, held here: `field_names` is an interpreted call)
        names = _NAMES[cls] = field_names(cls)
    for name in names:
        value = getattr(ev, name)
        if value is not None:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def folded(kv: list[KvScaleWarning]) -> dict[str, Any]:
    """One line for k/v scale warnings back to back: the first record's place, stamp, process
    and names, the last one's place and stamp, the sums: records per layer (layer order), scales
    and processes (order of first appearance), and every record's offset and time."""
    first, last = kv[0], kv[-1]
    layers: dict[int, int] = {}
    scales: dict[str, None] = {}
    procs: dict[tuple[str | None, int | None], None] = {}
    offsets: list[int] = []
    stamps: list[float | None] = []
    for ev in kv:  # (one pass, each field read once: a load folds thousands a second)
        layer = ev.layer
        if layer is not None:
            layers[layer] = layers.get(layer, 0) + 1
        # (a key set again keeps its place: the order of first appearance, one lookup each)
        scales[ev.scale] = None
        procs[(ev.process, ev.pid)] = None
        offsets.append(ev.offset)
        stamps.append(ev.ts)
    fields: dict[str, Any] = {
        "offset": first.offset,
        "ts": first.ts,
        "process": first.process,
        "pid": first.pid,
        "count": len(kv),
        "last_offset": last.offset,
        "last_ts": last.ts,
        "scales": list(scales),
        "layers": [[layer, n] for layer, n in sorted(layers.items())],
        "processes": [[p, pid] for p, pid in procs],
        "checkpoint_name": first.checkpoint_name,
        "model_name": first.model_name,
        "offsets": offsets,
        "record_ts": stamps,
    }
    return {k: v for k, v in fields.items() if v is not None}
