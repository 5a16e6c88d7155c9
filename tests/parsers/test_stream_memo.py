"""The stream's memo of messages read before (`EventStream._plans`) changes no event: every real
log here, fed as it is and then twice again (its messages then read before, as the tensor-parallel
workers' copies of one warning are: the second time makes the memo, the third uses it), gives what a
stream that never remembers gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadwatch.parsers.events import Event
from loadwatch.parsers.scan import split_records
from loadwatch.parsers.vllm.stream import EventStream
from tests.parsers.test_client_text import SHAPES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = sorted(FIXTURES.glob("*.log"))


class Forgetful(dict):  # type: ignore[type-arg]
    """A memo that keeps nothing."""

    def __setitem__(self, key: object, value: object) -> None:
        return None


def events(data: bytes, remember: bool) -> list[Event]:
    stream = EventStream(ref_ts=1.8e9)
    if not remember:
        stream._plans = Forgetful()
    out: list[Event] = []
    for rec in split_records(data * 3):
        out += stream.feed(rec)
    return out + stream.flush()


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_the_memo_changes_no_event(log: Path) -> None:
    data = log.read_bytes()
    assert events(data, remember=True) == events(data, remember=False)


def test_the_memo_is_used() -> None:
    stream = EventStream(ref_ts=1.8e9)
    for rec in split_records((FIXTURES / "real-v0.32-deepseek-kvscales.log").read_bytes() * 2):
        stream.feed(rec)
    assert len(stream._plans) > 10  # (the comparison above is about something)


def test_a_message_read_before_is_still_the_client_text_it_goes_on() -> None:
    """A request id with a line break (real-v0.32-client-text.log line 112): the next record has
    the client-text record's header and is more of the client's text, even when the same text
    after the prefix was read before as vLLM's own error (from another process), and remembered."""
    header = "ERROR 11-30 06:35:55 [exception.py:17] "
    own = f"(APIServer pid=1) {header}RuntimeError: boom"
    client = SHAPES["request_error"].format(X="cmpl-a")
    more = f"(APIServer pid=20348) {header}RuntimeError: boom"
    data = "\n".join([own, own, own, client, more, own]).encode() + b"\n"
    assert events(data, remember=True) == events(data, remember=False)
    stream = EventStream(ref_ts=1.8e9)
    got = [stream.feed(rec) for rec in split_records(data)]
    assert [type(e).__name__ for e in got[2]] == ["LogError"]  # (read from the memo)
    assert [type(e).__name__ for e in got[4]] in ([], ["ClientText"])  # the client's text


def test_a_message_read_before_takes_the_lone_prefix_before_it() -> None:
    """A record without a prefix after a prefix alone in its record (as before a `\\r` bar) is
    that process's, whether its message was read before or not."""
    line = (FIXTURES / "real-v0.32-deepseek-kvscales.log").read_bytes().split(b"\n")
    warning = next(x for x in line if b"Found k_scale" in x)
    prefix, bare = warning.split(b") ", 1)
    data = b"\n".join([bare, bare, prefix + b") \r" + bare, bare]) + b"\n"
    assert events(data, remember=True) == events(data, remember=False)
    stream = EventStream(ref_ts=1.8e9)
    got = [stream.feed(rec) for rec in split_records(data)]
    assert [e.process for e in got[3]] == ["Worker"]  # (read from the memo)
    assert [e.process for e in got[4]] == [None]


def test_a_message_read_before_under_another_header() -> None:
    """The memo is keyed by a record's message after its header: the same warning under a later
    second, another level, another logger, a header of another shape or an impossible date gives
    what a stream that never remembers gives, and its time is its own header's."""
    lines = (FIXTURES / "real-v0.32-deepseek-kvscales.log").read_text().split("\n")
    warning = next(x for x in lines if "Found k_scale" in x)  # 06:35:45, weight_utils.py:1697
    variants = [
        warning,
        warning,
        warning.replace("06:35:45", "06:35:47"),  # another second
        warning.replace("(Worker pid=20551)", "(Worker pid=20552)"),  # another process
        warning.replace("WARNING 11-30", "INFO 11-30"),  # another level
        warning.replace("weight_utils.py:1697", "other.py:9"),  # another logger
        warning.replace("weight_utils.py:1697", "w6m.py:1697"),  # not of the common shape
        warning.replace("11-30 06:35:45", "02-30 06:35:45"),  # a date no year has
        warning.replace("06:35:45", "06:35:48"),
    ]
    data = "\n".join(variants).encode() + b"\n"
    assert events(data, remember=True) == events(data, remember=False)
    stream = EventStream(ref_ts=1.8e9)
    got = [stream.feed(rec) for rec in split_records(data)]
    assert len(stream._plans) == 1  # (the comparison above is about the memo)
    first, later = got[0][0].ts, got[8][0].ts
    assert first is not None and later == first + 3.0  # (from the memo, its own header's time)
