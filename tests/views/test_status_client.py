"""`loadwatch status` against a server that does not play fair (real loopback servers that
dribble, flood, nest or send the wrong types): one clear line and a non-zero exit for a document
it cannot use, `unknown` for a value of the wrong type, and never a hang or a traceback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadwatch.exporters.terminal.fleet import fleet_command, node_line
from loadwatch.exporters.terminal.plan_line import plan_line
from loadwatch.exporters.terminal.watch import status_command

from .rawhttp import answer_bytes, dribble, hold, json_answer, raw_server
from .test_status import _json, mid_load


def valid_doc() -> dict[str, Any]:
    state, now, _ = mid_load()
    doc: dict[str, Any] = state.snapshot(now + 3).to_dict()
    return doc


def run(url: str, capsys: pytest.CaptureFixture[str], **kw: Any) -> tuple[int, str, str, float]:
    args: dict[str, Any] = {"watch": False, "as_json": False, "interval_s": 1.0, "timeout_s": 0.5}
    args.update(kw)
    start = time.monotonic()
    code = status_command(url, **args)
    took = time.monotonic() - start
    out, err = capsys.readouterr()
    return code, out, err, took


def one_line(err: str, *needles: str) -> None:
    assert err.startswith("loadwatch: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


@pytest.mark.parametrize(
    "answer",
    [
        # the head at once, then the body a byte at a time: no read ever waits 0.5 s
        dribble(HEAD, b" "),
        # the head itself a byte at a time
        dribble(b"HTTP/1.1 200 OK\r\n", b"X"),
    ],
    ids=["slow-body", "slow-head"],
)
def test_a_dribbling_server_meets_one_deadline(
    answer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with raw_server(answer) as srv:
        code, out, err, took = run(srv.url, capsys)
    assert (code, out) == (69, "")
    one_line(err, "timed out")
    assert took < 2.5, took  # the whole read, not each recv, is bounded


def test_a_declared_huge_body_is_refused_unread(capsys: pytest.CaptureFixture[str]) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n"
    )
    with raw_server(hold(head + b'{"schema": 1, ')) as srv:
        code, out, err, took = run(srv.url, capsys)
    assert (code, out) == (65, "")
    one_line(err, "larger than")
    assert took < 0.4, took  # said at once, not after the deadline


def test_a_streamed_huge_body_is_cut_at_the_cap(capsys: pytest.CaptureFixture[str]) -> None:
    body = b'{"schema": 1, "phase": "ready", "pad": "' + b"a" * (17 << 20) + b'"}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    with raw_server(answer_bytes(head + body)) as srv:  # no length: the body ends at close
        code, out, err, _ = run(srv.url, capsys, timeout_s=10)
    assert (code, out) == (65, "")
    one_line(err, "larger than")


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    "body",
    [
        _nested(100_000),  # deeper than Python's recursion limit
        b'{"schema": 1, "phase": "ready", "session": {"progress": ' + _nested(200) + b"}}",
    ],
    ids=["100000-deep", "200-deep-inside-a-status"],
)
def test_deep_json_is_a_bad_document(body: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    with raw_server(json_answer(body)) as srv:
        code, out, err, _ = run(srv.url, capsys)
    assert (code, out) == (65, "")
    one_line(err, "nested")


def test_a_valid_document(capsys: pytest.CaptureFixture[str]) -> None:
    with raw_server(json_answer(json.dumps(valid_doc()).encode())) as srv:
        code, out, err, _ = run(srv.url, capsys)
    assert (code, err) == (0, "")
    assert "LOADING WEIGHTS" in out and "60/119 shards" in out and "vLLM 0.15.1" in out


def _wrong_types() -> Iterator[tuple[str, bytes]]:
    """Documents that parse but lie: each as JSON text (NaN and 1e999 are not JSON values
    json.dumps writes on purpose, so some are spliced in as text)."""
    doc = valid_doc()
    s = doc["session"]
    p = s["progress"]

    def text(d: dict[str, Any]) -> bytes:
        return json.dumps(d).encode()

    def variant(**changes: Any) -> dict[str, Any]:
        d = json.loads(json.dumps(doc))
        for path, value in changes.items():
            node = d
            keys = path.split("__")
            for k in keys[:-1]:
                node = node[k]
            node[keys[-1]] = value
        return d

    yield (
        "strings-for-numbers",
        text(
            variant(
                session__progress__shards_done="60",
                session__progress__shards_total="119",
                session__progress__ratio="0.5",
                at="now",
                gpus=[{"index": "0", "memory_used_bytes": "1", "memory_total_bytes": "2"}],
            )
        ),
    )
    yield (
        "negative-counts",
        text(
            variant(
                session__progress__shards_done=-5,
                session__progress__shards_total=-119,
                session__progress__bytes_total=-1,
                restarts=-3,
                session__warnings_total=-6,
                model={"path": "/models/m", "shards": -4, "total_bytes": -1},
            )
        ),
    )
    yield (
        "nan-and-1e999",
        text(variant(at=1.5, session__progress__ratio=2.5, restarts=7.25))
        .replace(b'"at": 1.5', b'"at": NaN')
        .replace(b'"ratio": 2.5', b'"ratio": 1e999')
        .replace(b'"restarts": 7.25', b'"restarts": -Infinity'),
    )
    yield (
        "huge-numbers",
        text(
            variant(
                memory_plan={
                    "verdict": "fits",
                    "planned_tokens_low": 1.5,
                    "planned_tokens_high": 2.5,
                    "actual_tokens": 5,
                    "actual_available_bytes": 10**400,
                    "kv_bytes_per_token": 3.5,
                },
            )
        )
        .replace(b'"planned_tokens_low": 1.5', b'"planned_tokens_low": 1e999')
        .replace(b'"planned_tokens_high": 2.5', b'"planned_tokens_high": 1e999')
        .replace(b'"kv_bytes_per_token": 3.5', b'"kv_bytes_per_token": NaN'),
    )
    yield (
        "containers-for-scalars",
        text(
            variant(
                session__progress={"eta": [1, 2], "shards_total": {"x": 1}},
                session__version=["0.15.1"],
                session__failures={"kind": "x"},
                gpus={"0": {}},
                supervisor=["started"],
                memory_plan=[1],
            )
        ),
    )
    assert p and s  # the variants above change a real document


WRONG = list(_wrong_types())


@pytest.mark.parametrize(("name", "body"), WRONG, ids=[n for n, _ in WRONG])
def test_wrong_types_show_as_unknown(
    name: str, body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    with raw_server(json_answer(body)) as srv:
        code, out, err, _ = run(srv.url, capsys)
        assert (code, err) == (0, ""), err
        assert "loadwatch" in out and "Traceback" not in out
        for lie in ("-119", "-5/", "-3", "-6:", "inf", "nan", "1e999", "10000000000"):
            assert lie not in out.lower(), (lie, out)
        # --json gives the document as JSON that any reader takes: no NaN, no Infinity
        code, out, err, _ = run(srv.url, capsys, as_json=True)
        assert (code, err) == (0, "")
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))


def test_the_fleet_view_takes_wrong_types(capsys: pytest.CaptureFixture[str]) -> None:
    lies = {
        "schema": 1,
        "phase": ["ready"],
        "node": {
            "ready": "no",
            "role": "head",
            "progress": [0.5],
        },
    }
    more = {
        "schema": 1,
        "phase": "loading_weights",
        "node": {
            "role": {"role": ["head"], "node_rank": "0", "ranks": {"a": 1}},
            "progress": {"ratio": "0.5", "eta_s": "soon", "eta_low_s": -1, "eta_high_s": None},
        },
    }
    with (
        raw_server(json_answer(json.dumps(lies).encode())) as a,
        raw_server(json_answer(json.dumps(more).encode())) as b,
    ):
        code = fleet_command([a.url, b.url], watch=False, as_json=False, interval_s=1.0)
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    lines = out.splitlines()
    assert len(lines) == 4 and lines[-1].startswith("2 nodes, 2 answering")
    assert "soon" not in out and "['head']" not in out and "{'a'" not in out


_NUMBERS = st.floats() | st.integers() | st.just(10**400) | st.just(-(10**400))
_VALUES = _NUMBERS | _json


@settings(max_examples=100, deadline=None)
@given(
    plan=st.dictionaries(
        st.sampled_from(
            [
                "verdict",
                "planned_tokens_low",
                "planned_tokens_high",
                "kv_bytes_per_token",
                "actual_tokens",
                "actual_available_bytes",
                "actual_vs_plan",
            ]
        ),
        _VALUES,
    ),
    node=st.dictionaries(st.sampled_from(["ready", "role", "progress"]), _VALUES),
    role=st.dictionaries(st.sampled_from(["role", "node_rank", "ranks"]), _VALUES),
    progress=st.dictionaries(
        st.sampled_from(["ratio", "eta_s", "eta_low_s", "eta_high_s", "stalled", "io_ratio"]),
        _VALUES,
    ),
)
def test_any_plan_and_node_render(
    plan: dict[str, Any], node: dict[str, Any], role: dict[str, Any], progress: dict[str, Any]
) -> None:
    plan_line(plan)  # never raises, whatever the numbers
    node_line("u", {"schema": 1, "phase": "x", "node": node}, None)
    node_line("u", {"schema": 1, "phase": "x", "node": {"role": role, "progress": progress}}, None)


@pytest.mark.parametrize("path", ["/é", "/a b", "/a%20b"])
def test_a_path_is_sent_encoded(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    with raw_server(json_answer(b"{}")) as srv:
        code, out, err, _ = run(srv.url + path, capsys)
        assert srv.requests == 1  # it was asked, and answered
    assert (code, out) == (65, "")
    one_line(err, "not a loadwatch status document")
