"""A daemon that starts on the log of a vLLM that was ready and has since been killed (SIGKILL
leaves no line): the log read back says ready, nothing serves. /readyz must never say 200, and
the session must end (`vanished`) once /health fails at its loopback URL and no process has the
pid the log names. The same log with vLLM still answering is ready once /health says so.

The real daemon in watch mode on a real vLLM 0.32 log (tests/fixtures/real-v0.32-llama.log up
to `Application startup complete.`), its `(APIServer pid=N)` prefix given the pid of a real
process of this test that was killed; its URL a loopback port nothing listens on, or a real
loopback HTTP server that answers `/health`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.daemon.harness import running
from tests.daemon.test_vllm_watch import INTERVAL_S, Server, VllmRoutes, run_log, watch_config
from tests.helpers import wait_for
from tests.realvllm.vllmproc import free_port

LOGGED_PID = "21820"  # the API server's pid in the recorded run (its prefixes, uvicorn's line)


def killed_pid() -> int:
    """The pid of a process that ran here and was killed (SIGKILL): no process has it now."""
    proc = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    proc.kill()
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("interval_s", [INTERVAL_S, 60.0])
def test_a_dead_vllms_log_is_never_ready_and_its_session_ends_vanished(
    tmp_path: Path, interval_s: float
) -> None:
    """With a probe interval of a minute too: a session read back ready is probed again at
    once, not an interval later."""
    pid = killed_pid()
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the server died with vLLM
    log = run_log(url).replace(LOGGED_PID, str(pid))
    answers: list[int] = []
    with running(watch_config(tmp_path, log, health_interval_s=interval_s)) as d:

        def failed() -> bool:
            answers.append(d.get("/readyz")[0])  # every answer until then
            return bool(d.status()["phase"] == "failed")

        wait_for(failed, "the session failed", 20, every_s=0.01)
        s = d.status()["session"]
        assert s["phase"] == "failed" and s["failure_kind"] == "vanished", s
        assert s["server_pid"] == pid
        assert 200 not in answers and len(answers) > 3, answers
        moves = [e for e in d.events() if e.get("event") == "transition.phase"]
        assert moves[-1]["phase_to"] == "failed" and moves[-1]["failure_kind"] == "vanished"
        assert f"vLLM process {pid} is not running here and /health fails" in moves[-1]["reason"]
        assert d.metrics()['loadwatch_session_failure{kind="vanished"}'] == 1.0


def test_the_same_log_with_vllm_answering_is_ready_after_a_live_answer(tmp_path: Path) -> None:
    server = Server(VllmRoutes)
    try:
        log = run_log(server.url).replace(LOGGED_PID, str(killed_pid()))
        with running(watch_config(tmp_path, log)) as d:
            d.wait(lambda: d.get("/readyz")[0] == 200, "ready")
            assert server.paths().count("/health") >= 1  # (a live answer came first)
            assert d.status()["session"]["phase"] == "ready"
    finally:
        server.stop()
