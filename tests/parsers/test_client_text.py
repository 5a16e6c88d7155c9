"""Text a client of vLLM chose is never read as vLLM's own word.

vLLM logs request ids (the `X-Request-Id` header), model names a request asked for, sampling
parameters (a client's stop strings), the request's JSON keys and its path. Whatever a client
puts there, including any message of the grammar, a process prefix or a whole log line, the
record is one `ClientText` event and nothing else; messages the grammar knows count only at the
start of a message.

The record shapes are vLLM 0.32's own, from its source (the format string, file and level named
at each) and from the real runs in tests/fixtures/real-v0.32-*.log; only the client's part
varies. A client cannot put a line break into these records (HTTP header values cannot hold one;
vLLM prints prompts and stop strings with repr()), so the text drawn here holds none.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadwatch.parsers import EventStream, split_records
from loadwatch.parsers.events import ClientText, Event
from tests.conftest import FIXTURES
from tests.parsers.golden import REF_TS, scanned

# {X}: the client's text. Headers as real vLLM 0.32 prints them (tests/fixtures/real-v0.32-*).
SHAPES: dict[str, str] = {
    # v1/engine/async_llm.py:578 `logger.info("Added request %s.", request.request_id)`; the id
    # is `cmpl-{X-Request-Id}-0-{suffix}` (real-v0.32-deepseek-kvscales.log line 151)
    "request_added": "(APIServer pid=20348) INFO 11-30 06:35:55 [async_llm.py:578] "
    "Added request cmpl-{X}-0-97ebe120.",
    # serve/utils/request_logger.py:65 `Received request %s: params: %s, lora_request: %s.`:
    # the stop strings are the client's (real-v0.32-deepseek-kvscales.log line 150)
    "request_received": "(APIServer pid=20348) INFO 11-30 06:35:55 [request_logger.py:65] "
    "Received request cmpl-{X}-0: params: SamplingParams(n=1, temperature=0.0, stop=[{X!r}], "
    "max_tokens=4), lora_request: None.",
    # openai/chat_completion/serving.py:274 `logger.error("Error with model %s",
    # error_check_ret)`, the ErrorResponse naming the model the request asked for
    "model_error": "(APIServer pid=20348) ERROR 11-30 06:35:55 [serving.py:274] Error with "
    "model error=ErrorInfo(message='The model `{X}` does not exist.', type='NotFoundError', "
    "param='model', code=404)",
    # serve/engine/protocol.py:73 `The following fields were present in the request but
    # ignored: %s`, the request's own keys
    "request_fields_ignored": "(APIServer pid=20348) WARNING 11-30 06:35:55 [protocol.py:73] "
    "The following fields were present in the request but ignored: {{{X!r}}}",
    # v1/engine/async_llm.py:922 `Aborted request(s) %s.`
    "request_aborted": "(APIServer pid=20348) INFO 11-30 06:35:55 [async_llm.py:922] "
    "Aborted request(s) cmpl-{X}-0.",
    # serve/exception_handling/handlers/exception.py:17 with --log-error-stack
    "request_error": "(APIServer pid=20348) ERROR 11-30 06:35:55 [exception.py:17] "
    "Exception caught. Request id: {X}",
    # uvicorn's access line behind the API server's prefix (tp1-enginecore.log line 28): the
    # path as the client sent it
    "access": '(APIServer pid=700) INFO:     127.0.0.1:40312 - "POST /v1/{X} HTTP/1.1" 404 '
    "Not Found",
}

# Every line of every real log the tests hold: vLLM's messages with their prefixes and headers,
# each catalog pattern among them, as a client would paste them.
_REAL_LINES = sorted(
    {
        line.replace("\r", " ")
        for path in sorted(Path(FIXTURES).glob("*.log"))
        for line in path.read_text(encoding="utf-8", errors="replace").split("\n")
        if line.strip()
    }
)
# The attacks a red team made on real vLLM, and the grammar's own milestones and failures.
_ATTACKS = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
    "x vLLM API server version 6.6.6",
    "x Starting vLLM API server 0 on http://127.0.0.1:18999/",
    "Starting to load model /m",
    "NCCL error: unhandled system error",
    "max_model_len",
    "(Worker_TP0 pid=1) WARNING 11-30 06:35:55 [weight_utils.py:1] Found k_scale in the "
    "checkpoint (e.g. model.layers.0.self_attn.k_scale), but not found the expected name in the "
    "model (e.g. model.layers.0.self_attn.attn.k_scale). k_scale is not loaded.",
    "(APIServer pid=4242) ",
    "Application startup complete.",
    "EngineCore encountered a fatal error.",
    "Traceback (most recent call last):",
    "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.00it/s]",
]
_piece = st.one_of(
    st.sampled_from(_REAL_LINES),
    st.sampled_from(_ATTACKS),
    st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=40),
)
client_texts = st.lists(_piece, min_size=1, max_size=4).map(" ".join)

# Started and serving: the mode in which clients exist (and the one that reads the fewest
# messages; the start-up mode is checked as well).
_SERVING = (
    b"(APIServer pid=20348) INFO 11-30 06:35:40 [api_server.py:1] vLLM API server version 0.32.0\n"
    b"(APIServer pid=20348) INFO 11-30 06:35:54 [launcher.py:46] Application startup complete.\n"
)


def _record(shape: str, text: str) -> str:
    return SHAPES[shape].format(X=text)


def _after(prelude: bytes, record: str) -> list[Event]:
    """The events of `record` alone, read after `prelude`, by the record-by-record parse and by
    the chunk scanner (its C search where built); the two must agree."""
    data = prelude + record.encode() + b"\n"
    n = len(EventStream(ref_ts=REF_TS).feed_all(split_records(prelude)))
    whole = EventStream(ref_ts=REF_TS).feed_all(split_records(data))
    assert scanned(data, 1 << 16) == whole
    return whole[n:]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(SHAPES)), text=client_texts, serving=st.booleans())
def test_client_text_is_one_client_text_event_whatever_it_holds(
    shape: str, text: str, serving: bool
) -> None:
    """At most one event (a record holding no word of the grammar is not even looked at), and
    that one says only that a client's text was there."""
    events = _after(_SERVING if serving else b"", _record(shape, text))
    assert len(events) <= 1, events
    assert all(isinstance(e, ClientText) and e.kind == shape for e in events), events


def test_the_red_team_requests_are_client_text() -> None:
    """The three requests that failed a healthy server, reset its session and pointed the probes
    elsewhere (real vLLM 0.32 with --enable-log-requests)."""
    cases = {
        "model_error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
        "request_added": "x vLLM API server version 6.6.6",
        "request_received": "x Starting vLLM API server 0 on http://127.0.0.1:18999/",
    }
    for shape, text in cases.items():
        seen = ClientText(
            kind=shape,  # type: ignore[arg-type]
            offset=len(_SERVING),
            ts=_ts("06:35:55"),
            process="APIServer",
            pid=20348,
        )
        got = _after(_SERVING, _record(shape, text))
        # an ERROR record is always looked at; an INFO one only when it holds a word that
        # matters while serving
        assert got == [seen] if shape == "model_error" else got in ([], [seen]), got
        assert _after(b"", _record(shape, text)) in ([], [replace(seen, offset=0)])


def _ts(hms: str) -> float:
    stream = EventStream(ref_ts=REF_TS)
    return stream.years.stamp(f"11-30 {hms}")  # type: ignore[return-value]


def test_a_process_prefix_inside_client_text_starts_no_other_line() -> None:
    """A prompt holding `(Worker_TP0 pid=1) WARNING ... Found k_scale ...` is not cut there into
    a worker's warning (the record ends with the client's text: no line of another process can
    follow it on the same physical line)."""
    record = _record("request_received", _ATTACKS[6])
    for prelude in (b"", _SERVING):
        assert [type(e) for e in _after(prelude, record)] in ([], [ClientText])


def test_catalog_messages_count_only_at_the_start_of_a_message() -> None:
    """vLLM's own messages start its format strings; the same words later in a message are
    somebody else's text (a warning quoting a path, an error quoting a request)."""
    head = "(APIServer pid=20348) INFO 11-30 06:35:55 [api_server.py:1] "
    for body in (
        "note: Starting vLLM API server 0 on http://10.0.0.1:1/",
        "tenant says vLLM API server version 9.9.9",
        "x Starting to load model /etc...",
    ):
        assert _after(_SERVING, head + body) == [], body
        assert _after(b"", head + body) == [], body
    err = "(EngineCore pid=7) ERROR 11-30 06:35:55 [core.py:1] "
    # an error quoting the words is an unrated error, never a classified failure
    (quoted,) = _after(b"", err + "request said: CUDA out of memory")
    assert type(quoted).__name__ == "LogError"
    # the exception line of vLLM's own traceback, its header repeated, is read as before
    (oom,) = _after(
        b"", err + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    )
    assert type(oom).__name__ == "Failure" and oom.kind == "cuda_oom"  # type: ignore[attr-defined]


def test_a_real_serving_log_with_the_attacks_stays_one_session() -> None:
    """vLLM 0.32 itself, fed the requests a red team used (tests/fixtures/real-v0.32-client-text
    .source): after `Application startup complete` nothing but the shutdown is read as vLLM's
    own word; the lines of a request id with line breaks carry the request logger's header and
    are read as nothing."""
    data = (Path(FIXTURES) / "real-v0.32-client-text.log").read_bytes()
    events = EventStream(ref_ts=REF_TS).feed_all(split_records(data))
    ready = next(
        i for i, e in enumerate(events) if getattr(e, "kind", None) == "app_startup_complete"
    )
    before, after = events[: ready + 1], events[ready + 1 :]
    assert [e.kind for e in before if e.type == "milestone" and e.kind == "version"] == ["version"]  # type: ignore[attr-defined]
    stop = data.rindex(b"\n", 0, data.index(b"[shutdown] API server: shutdown triggered")) + 1
    serving = [e for e in after if e.offset < stop]
    kinds = sorted({e.kind for e in serving})  # type: ignore[attr-defined]
    assert {e.type for e in serving} == {"client_text"}, serving
    assert kinds == ["model_error", "request_added", "request_received"]
