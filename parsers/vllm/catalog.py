"""The catalog: every message loadwatch knows, as data.

The entries for a load as it goes are in catalog_load.py, what an entry is and the builders it
names in builders.py; this module adds the stall hints and failures, and says how an exception
line is classified. Everything the parser reads of the catalog is read from here.

An entry is (id, needles, pattern, builder, severity). `needles` are plain substrings one of which
every matching message contains; the union of all needles is the pre-filter that keeps the common,
uninteresting record almost free. Patterns are searched in the message body (prefix and header
removed) and are written to stay linear on hostile input.
"""

from __future__ import annotations

import re
from typing import Any

from loadwatch.parsers.entries import (
    ANY_LOGGER,
    BARE,
    FAILURE,
    MESSAGE,
    SEC,
    WARNING,
    Builder,
    Entry,
    Head,
    Level,
    rx,
)
from loadwatch.parsers.events import CONSEQUENCE_KINDS, ClientTextKind, Event, Failure, FailureKind
from loadwatch.parsers.traceback import CUT_TRACEBACK, EXCEPTION_LINE
from loadwatch.parsers.vllm.builders import bar_unit as bar_unit
from loadwatch.parsers.vllm.builders import (
    stall,
)
from loadwatch.parsers.vllm.catalog_load import LOAD
from loadwatch.parsers.vllm.catalog_serve import SERVE


def _failure(kind: FailureKind | None, engine_fatal: bool = False) -> Builder:
    def build(m: re.Match[str], head: Head, ctx: dict[str, Any]) -> Event:
        message = head.body.strip()
        exc = EXCEPTION_LINE.match(message)
        exc_type = exc["exc"] if exc else None
        text = exc["msg"] if exc and exc["msg"] is not None else message
        return failure(
            kind=kind or classify(exc_type, text),
            message=text[:2000],
            exc_type=exc_type,
            first_line=message[:500],
            last_offset=ctx["offset"],
            engine_fatal=engine_fatal,
            **ctx,
        )

    return build


# -- text a client of vLLM chose ---------------------------------------------------------
# vLLM logs what its clients send: request ids (the `X-Request-Id` header, the `request_id`
# field), prompts and sampling parameters, the model name a request asked for, the request's
# own JSON keys, the request path. A record of one of these shapes is set aside before any
# entry is tried, whatever it holds and whichever logger printed it: it is counted
# (`ClientText`) and never read for a milestone, a failure, a warning, a URL, a pid or a path,
# nor cut at a process prefix inside it. The one statement of that class: (kind, record levels,
# the start of the message, the loggers and versions it was read from).
CLIENT_TEXT: tuple[tuple[ClientTextKind, frozenset[Level], re.Pattern[str]], ...] = (
    # logger.py (0.5-0.10), entrypoints/serve/utils/request_logger.py (0.11-): `Received
    # request cmpl-5f2: prompt: '...'`, `... : params: SamplingParams(...)`; DEBUG `Request ID
    # details: prompt: ...` and `Request ID JSON body: ...` (2025-)
    # anthropic/serving.py (2026, DEBUG): `Received messages request {...}`, `Convert to
    # OpenAI request {...}`
    (
        "request_received",
        MESSAGE,
        rx(
            r"Received (?:messages )?request \S|Request \S{1,400}+ (?:details|JSON body): "
            r"|Convert to OpenAI request "
        ),
    ),
    # v1/engine/async_llm.py (0.8-, with --enable-log-requests): `Added request cmpl-...-0.`,
    # `Aborted request cmpl-....`; V0 engine/async_llm_engine.py: `Finished request ...`
    ("request_added", MESSAGE, rx(r"Added request \S")),
    ("request_aborted", MESSAGE, rx(r"Aborted request(?:s|\(s\))? \S")),
    ("request_finished", MESSAGE, rx(r"Finished request \S")),
    # logger.py / request_logger.py with --enable-log-outputs: `Generated response ID: output:`
    ("response_generated", MESSAGE, rx(r"Generated response \S")),
    # openai/serving_engine.py (0.6-), serving.py (2026): an unknown model name, at ERROR, on
    # every such request with default flags: `Error with model error=ErrorInfo(message='The
    # model `...` does not exist.', ...)`
    ("model_error", FAILURE | MESSAGE | WARNING, rx(r"Error with model ")),
    # A request's error with its id first (generate/base/serving.py 2026, at ERROR: `Request ID
    # failed with an internal error during generation`; v1/engine/async_llm.py 2026-01 on, at
    # INFO with --enable-log-requests: `Request ID failed due to ExcType: message.`), and the
    # API server's exception
    # handlers with --log-error-stack (serve/exception_handling/handlers/*.py 2026: `Exception
    # caught. Request id: ID`, `HTTPException caught. ...`, `RequestValidationError caught. ...`,
    # `Engine Exception caught. ...`): a traceback of the request's own error may follow, which
    # the state holds as a warning while vLLM serves (daemon/state/fold_log.py `_fatal`)
    (
        "request_error",
        FAILURE | MESSAGE | WARNING,
        rx(
            r"Request \S{1,400}+ failed (?:with|due to) "
            r"|(?:Engine |HTTP)?(?:Exception|RequestValidationError) caught\. Request id: "
        ),
    ),
    # openai/protocol.py, serve/engine/protocol.py: the request's unknown JSON keys, at WARNING
    (
        "request_fields_ignored",
        WARNING,
        rx(r"The following fields were present in the request but ignored"),
    ),
    # uvicorn's access line (its own `INFO:     ` head, or vLLM's header with uvicorn's
    # h11_impl.py / httptools_impl.py): `127.0.0.1:40312 - "POST /v1/chat/completions HTTP/1.1"
    # 200 OK`, the path as the client sent it
    ("access", MESSAGE | WARNING, rx(r"[^\s\"]{1,300}+ - \"")),
)
CLIENT_TEXT_NEEDLES: tuple[str, ...] = (
    "Received request ",
    "Received messages request ",
    "Convert to OpenAI request ",
    "Request ",
    "Exception caught.",
    "HTTPException caught.",
    "Engine Exception caught.",
    "RequestValidationError caught.",
    "Added request",
    "Aborted request",
    "Finished request ",
    "Generated response ",
    "Error with model ",
    "The following fields were present",
)


def client_text(body: str, level: Level) -> ClientTextKind | None:
    """The client-text class a message belongs to, or None: vLLM's own words."""
    if not body.startswith(CLIENT_TEXT_NEEDLES) and body.find(' - "', 0, 320) < 0:
        return None
    for kind, levels, pattern in CLIENT_TEXT:
        if level in levels and pattern.match(body) is not None:
            return kind
    return None


# `torch.OutOfMemoryError: `, `RuntimeError: `: the head of an exception line.
EXCEPTION_HEAD = r"(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Z][A-Za-z0-9_]{0,80}+: "

CATALOG: tuple[Entry, ...] = (
    *LOAD,
    *SERVE,
    # -- stall hints -----------------------------------------------------------------------
    Entry(
        "stall.shm_broadcast",
        ("No available",),
        rx(r"No available (?:shared memory broadcast )?block found in " + SEC + r" seconds?"),
        stall,
        "warning",
        levels=frozenset({"INFO", "DEBUG", "WARNING"}),
        serving=True,
        loggers=("shm_broadcast.py",),
    ),
    # -- failures --------------------------------------------------------------------------
    Entry(
        "fail.engine_core_start",
        ("failed to start",),
        rx(r"(?:EngineCore|WorkerProc|Engine process|Engine core) failed to start"),
        _failure("engine_init_failed"),
        "error",
        levels=FAILURE,
        loggers=ANY_LOGGER,
    ),
    Entry(
        "fail.engine_fatal",
        ("encountered a fatal error", "hit an exception", "died unexpectedly", "died, exit code"),
        # also as the message of the EngineDeadError every waiting request is failed with
        rx(
            r"(?:(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+EngineDeadError: )?"
            r"(?:EngineCore encountered a fatal error|WorkerProc hit an exception"
            r"|Worker proc \S{1,80}+ died unexpectedly|Worker \S{1,80}+ pid \d{1,10}+ died, exit code)"
        ),
        _failure("worker_died", engine_fatal=True),
        "error",
        levels=FAILURE,
        loggers=ANY_LOGGER,
    ),
    Entry(
        "fail.error_executing",
        ("This might cause deadlock",),
        rx(r"Error executing method '?(?P<m>\w{1,80}+)'?\. This might cause deadlock"),
        _failure("other"),
        "error",
        levels=FAILURE,
        loggers=ANY_LOGGER,
    ),
    Entry(
        "fail.classified",
        (
            "out of memory",
            "not enough GPU memory",
            "No available memory for the cache blocks",
            "KV cache is needed",
            "stored in KV cache",
            "max_model_len",
            "NCCL error",
            "FP8 Triton MLA",
            "with FP8 KV cache not yet supported",
            "No valid attention backend",
            "Engine core initialization failed",
            "Timed out waiting for engine",
            "Did not receive response from front-end",
        ),
        # At the start of the message, or in the message of an exception line that starts it
        # (vLLM repeats its header on every line of a logged traceback: `ERROR ... [core.py:700]
        # ValueError: No available memory for the cache blocks. ...`).
        rx(
            r"(?:" + EXCEPTION_HEAD + r"[^\r\n]{0,4000}?)?"
            r"(?:CUDA out of memory|out of memory|Failed to load model - not enough GPU memory"
            r"|not enough GPU memory|No available memory for the cache"
            r"|KV cache is needed|stored in KV cache|max_model_len|NCCL error|FP8 Triton MLA"
            r"|FP8 KV cache not yet supported|No valid attention backend"
            r"|Engine core initialization failed|Timed out waiting for engines?"
            r"|Did not receive response from front-end)"
        ),
        _failure(None),
        "error",
        levels=FAILURE,
        loggers=ANY_LOGGER,
    ),
)


# A bare exception line outside any traceback whose head was seen (a log cut, a paste): the
# worker's root cause can stand alone like this (`RuntimeError: CUDA error: invalid argument`).
CATALOG = (
    *CATALOG,
    Entry(
        "fail.bare_exception",
        ("Error: ",),
        rx(r"^(?:[A-Za-z_][A-Za-z0-9_]{0,80}+\.){0,8}+[A-Z][A-Za-z0-9_]{0,80}Error: \S"),
        _failure(None),
        "error",
        levels=BARE,
        loggers=ANY_LOGGER,
    ),
    # vLLM's own CUDA checks (csrc, custom all-reduce) print `Failed: Cuda error FILE:LINE 'msg'`
    # on stderr and the worker dies: the root cause the dead worker's echoes point at.
    Entry(
        "fail.cuda_check",
        ("Failed: Cuda error",),
        rx(r"^Failed: Cuda error \S{1,400}+ '[^'\r\n]{1,400}+'"),
        _failure(None),
        "error",
        levels=BARE,
        loggers=ANY_LOGGER,
    ),
)

# `torch.OutOfMemoryError: CUDA out of memory...`, `RuntimeError: ...`, `KeyboardInterrupt`.
# The last name gives back characters for its ending (Error, ...): not possessive there, which
# costs at most 80 steps back, once, since the pattern is anchored.
# pyzmq's bind of an IPC socket whose path is longer than sockaddr_un.sun_path allows
# (zmq/backend/cython/_zmq.py `Socket.bind`): vLLM puts its sockets under TMPDIR
# (vllm/utils/network_utils.py `get_open_zmq_ipc_path`), so a long TMPDIR fails every start.
# The path is the operator's text and may name anything (`.../max_model_len-512/...`): it is
# read for no other kind.
_IPC_PATH_TOO_LONG = rx(r"ipc path \"[^\"\r\n]{0,4000}+\" is longer than \d{1,9}+ characters")

# Ordered: the first that matches names the kind. More specific kinds come first.
_CLASSIFY: tuple[tuple[re.Pattern[str], FailureKind], ...] = (
    (_IPC_PATH_TOO_LONG, "other"),
    (
        rx(
            r"FP8 Triton MLA|TritonMLA(?: V1)? with FP8 KV cache not yet supported"
            r"|expected scalar type \w{1,40}+ but found Float8_e\dm\d"
            r"|No valid attention backend.{0,4000}?kv_cache_dtype not supported"
        ),
        "fp8_kv_unsupported",
    ),
    (rx(r"OutOfMemoryError|CUDA out of memory|out of memory|not enough GPU memory"), "cuda_oom"),
    (
        rx(
            r"No available memory for the cache blocks|KV cache is needed, which is larger than"
            r"|larger than the maximum number of tokens that can be stored in KV cache"
        ),
        "kv_cache_too_small",
    ),
    (rx(r"max_model_len|max model len|max_position_embeddings"), "max_model_len"),
    (rx(r"NCCL error|NCCL|DistBackendError"), "nccl"),
    # the engine did not come up in time (VLLM_ENGINE_READY_TIMEOUT_S), a DP handshake stalled
    (
        rx(
            r"Timed out waiting for engines?(?: core processes)? to (?:start|send)"
            r"|Did not receive response from front-end process"
        ),
        "startup_timeout",
    ),
    (
        rx(r"Engine core initialization failed|initialization failed|failed to start"),
        "engine_init_failed",
    ),
    (rx(r"EngineDeadError|died unexpectedly|died, exit code|fatal error"), "worker_died"),
)

# Messages that say something failed elsewhere, not what: echoes of a root cause (the state's
# failure grouping folds them into it).
CONSEQUENCE_MESSAGES: tuple[str, ...] = (
    CUT_TRACEBACK,
    "Error executing method",
    "got fatal signal from worker processes",
    "Got fatal signal from worker processes",
)
# EngineCore re-raising a worker's exception: `Worker failed with error 'X', please check the
# stack trace above for the root cause`; X is the root cause's message.
_WRAPPERS = (
    ("Worker failed with error '", "', please check"),
    ('Worker failed with error "', '", please check'),
)


def wrapped_cause(message: str) -> str | None:
    """The message a re-raising wrapper carries, if `message` is one."""
    text = " ".join(message.split())
    for head, tail in _WRAPPERS:
        if text.startswith(head):
            end = text.find(tail, len(head))
            if end > 0:
                return text[len(head) : end]
    return None


def failure(**fields: Any) -> Failure:
    """A failure as the vLLM grammar states it: whether it is a consequence of another, and
    the cause a wrapper carries. Every failure the grammar emits is made here."""
    kind, message = fields["kind"], fields["message"]
    consequence = kind in CONSEQUENCE_KINDS or (
        kind == "other" and message.startswith(CONSEQUENCE_MESSAGES)
    )
    return Failure(consequence=consequence, cause=wrapped_cause(message), **fields)


def classify(exc_type: str | None, message: str) -> FailureKind:
    text = message if exc_type is None else f"{exc_type}: {message}"
    text = text[:8000]
    for pattern, kind in _CLASSIFY:
        if pattern.search(text):
            return kind
    return "other"


def ipc_path_too_long(message: str) -> bool:
    """Whether a failure's message is pyzmq's refusal of a too-long IPC socket path."""
    return _IPC_PATH_TOO_LONG.search(message[:8000]) is not None


NEEDLES: tuple[str, ...] = tuple(sorted({n for e in CATALOG for n in e.needles}))


# The length vLLM says would fit, in the ValueError of a KV cache too small for --max-model-len:
# vLLM >= 0.6 (vllm/v1/core/kv_cache_utils.py, `_check_enough_kv_cache_memory`): "... Based on
# the available memory, the estimated maximum model length is 1568. Try increasing ..."; before
# (vllm/worker/worker.py, `raise_if_cache_size_invalid`): "The model's max seq len (4096) is
# larger than the maximum number of tokens that can be stored in KV cache (2048). Try ...".
_FITTING_LEN = (
    re.compile(r"estimated maximum model length is (\d{1,9})\b"),
    re.compile(r"maximum number of tokens that can be stored in KV cache \((\d{1,9})\)"),
)


def fitting_model_len(message: str) -> int | None:
    """The largest max-model-len the failure's message says would fit; None if it says none."""
    for pattern in _FITTING_LEN:
        m = pattern.search(message)
        if m is not None:
            return int(m.group(1))
    return None
