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
"""

from __future__ import annotations

from typing import Any

from loadwatch.daemon.sources.log.emitmark import Ordinals
from loadwatch.daemon.sources.log.source import Notice, Run
from loadwatch.daemon.state.snapshot import Transition
from loadwatch.exporters.eventlog import EventLog
from loadwatch.parsers import Event
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


class RunEffects:
    """Writes the effects of one run, each exactly once (see the module doc)."""

    def __init__(self, eventlog: EventLog, run: Run) -> None:
        self._eventlog = eventlog
        self._run = run
        self._ordinal = Ordinals()

    def transition(self, t: Transition, offset: int) -> None:
        fields = t.to_dict()
        kind = fields.pop("transition")
        fields.setdefault("offset", offset)  # (as the fold notes it)
        self._write(f"transition.{kind}", fields, log=False)

    def event(self, ev: Event) -> None:
        fields = {k: v for k, v in ev.to_dict().items() if v is not None and k != "type"}
        self._write(f"log.{ev.type}", fields, log=True)

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
        self._eventlog.emit(name, **fields)
