"""A user's prompt (or the model's answer) echoed by vLLM's request logging is only counted.

The records are vLLM's own request-logging formats with a hostile prompt in them:
- `Received request ID: prompt: '...', params: ...` at INFO, as vLLM 0.6 wrote it
  (tests/fixtures/v0-old-header.log, line 38, whose header and request line are kept);
- `Request ID details: prompt: '...', ...` at DEBUG and `Generated response ID: output: '...'`
  at INFO, vLLM 0.32's formats (vllm/entrypoints/serve/utils/request_logger.py, log_inputs and
  log_outputs, in the vLLM installed here).
The hostile text is a real k/v-scale warning (tests/fixtures/real-v0.32-deepseek-kvscales.log,
line 50, without its header). The same text as the warning vLLM prints is an event (the control);
inside an echo it is only a `client_text` event, through `loadwatch events` (the chunk scanner and
the stream).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.reliability.proc import REPO

FIXTURES = REPO / "tests" / "fixtures"
WARNING_LINE = (FIXTURES / "real-v0.32-deepseek-kvscales.log").read_bytes().decode().split("\n")[49]
WARNING_TEXT = WARNING_LINE.split("] ", 1)[1]  # "Found k_scale in the checkpoint (e.g. ..."
START = (
    (FIXTURES / "v0-old-header.log").read_bytes().decode().split("\n")[:12]
)  # a v0 start, loading

ECHOES = [
    f"INFO 11-05 09:59:10 logger.py:37] Received request cmpl-5f2: prompt: '{WARNING_TEXT}', "
    "params: SamplingParams(n=1, temperature=0.7, max_tokens=64), prompt_token_ids: [1, 2], "
    "lora_request: None, prompt_adapter_request: None.",
    f"(APIServer pid=20348) DEBUG 11-30 06:35:55 [request_logger.py:55] Request cmpl-a9-0 "
    f"details: prompt: 'x\\n{WARNING_TEXT}', prompt_token_ids: [1], prompt_embeds shape: None.",
    f"(APIServer pid=20348) INFO 11-30 06:35:56 [request_logger.py:108] Generated response "
    f"cmpl-a9-0: output: '{WARNING_TEXT}', finish_reason: stop",
]


def _events(tmp_path: Path, lines: list[str]) -> list[dict[str, object]]:
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "events", str(log)],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [json.loads(x) for x in out.stdout.splitlines()]


def test_echoed_prompt_is_no_event(tmp_path: Path) -> None:
    control = _events(tmp_path, [*START, WARNING_LINE])
    assert [e["type"] for e in control].count("kv_scale_warning") == 1  # the text alone is one
    quiet = _events(tmp_path, START)
    echoed = _events(tmp_path, [*START, *ECHOES])
    # each echo is counted as a client's text, and is nothing else
    assert [e["type"] for e in echoed if e["type"] != "client_text"] == [e["type"] for e in quiet]
    assert [e.get("kind") for e in echoed if e["type"] == "client_text"] == [
        "request_received",
        "request_received",
        "response_generated",
    ]
