"""A failure whose text names a setting without being about it: vLLM 0.32's ZMQ IPC socket path
under a TMPDIR too long for sockaddr_un (tests/fixtures/real-v0.32-zmq-ipc-path-too-long.log, a
real run), the path a sweep's directory that reads `max_model_len`. It is no `max_model_len`
failure, so that remedy does not fire; the ladder says why nothing in the command helps."""

from __future__ import annotations

from pathlib import Path

from loadwatch.daemon.supervise.remedies import Failed, Settings, propose
from loadwatch.parsers import Failure
from loadwatch.parsers.vllm.catalog import classify
from tests.conftest import FIXTURES
from tests.parsers.golden import events_of
from tests.supervisor.test_remedies import Script, ladder, mml, supervise

LOG = FIXTURES / "real-v0.32-zmq-ipc-path-too-long.log"


def failures() -> list[Failure]:
    return [e for e in events_of(LOG.read_bytes()) if isinstance(e, Failure)]


def test_the_ipc_path_error_is_not_a_max_model_len_failure() -> None:
    (failure,) = failures()
    assert failure.exc_type == "zmq.error.ZMQError"
    assert "max_model_len" in failure.message  # (in the path)
    assert failure.kind == "other"
    assert classify(failure.exc_type, failure.message) == "other"


def test_the_max_model_len_remedy_does_not_fire_and_the_ladder_says_why(tmp_path: Path) -> None:
    (failure,) = failures()
    failed = Failed(failure.kind, "config", failure.message)
    assert propose("max_model_len", failed, ("vllm", "serve", "/m"), Settings()) is None
    script = Script(failed, failed)
    _sup, _rec, ops = supervise(tmp_path, ladder(tmp_path, script), [1, 1], crash_loop_starts=2)
    assert [mml(a) for a, _, _ in ops.spawned] == ["4096", "4096"]
    (none,) = [d for d in script.lines if d["event"] == "vllm.remedy"]
    assert none["remedy"] is None and none["outcome"] == "none" and none["kind"] == "other"
    assert "ZMQ IPC socket path is longer than the OS allows" in none["reason"]
    assert "shorter TMPDIR" in none["reason"]
