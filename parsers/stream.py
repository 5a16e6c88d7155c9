"""What the chunk scanner (scan.py) asks of a grammar's event stream: `Stream`, which a grammar's
stream subclasses (parsers/vllm/stream.py's `EventStream`). A class, not a protocol: compiled,
the scanner's calls for each record it hands over go straight to the subclass's methods."""

from __future__ import annotations

from typing import Any


class Stream:
    """The records' events in order, with what spans records (a traceback, a bar's owner)."""

    # What the stream reads for now (the scan plans are per mode: grammar.py's `Grammar.plans`)
    mode: str

    @property
    def in_traceback(self) -> bool:
        """A traceback is open: every record must be seen, not only the candidates."""
        raise NotImplementedError

    def feed_text(self, text: str, offset: int, candidate: bool = False) -> list[Any]:
        """The events of one record (`candidate`: it holds a needle of the current mode)."""
        raise NotImplementedError

    def quiet(self, stamp: bytes | str) -> None:
        """Candidates proven to yield nothing were skipped; `stamp`: the last one's time."""
        raise NotImplementedError

    def plain(self, text: str) -> None:
        """A record with no needle of the current mode, outside any traceback."""
        raise NotImplementedError

    def forget_pending(self) -> None:
        """Records were skipped unseen: what the stream held for the next one names nothing."""
        raise NotImplementedError

    def flush(self) -> list[Any]:
        """The events held back (a traceback not closed yet) at the end of the input."""
        raise NotImplementedError

    def set_reference(self, ts: float) -> None:
        """The daemon's clock, for the year of stamps that have none."""
        raise NotImplementedError
