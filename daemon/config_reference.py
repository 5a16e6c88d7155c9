"""The configuration reference (docs/config.md), generated from the code that reads the config.

`keys()` runs the real reader with every table present and collects what its getters ask for
(config_table.SCHEMA); `DOCS` says what each key means. A key the reader takes that `DOCS` does not
describe, or a `DOCS` entry the reader no longer takes, fails the test that also compares
docs/config.md with `render()`. Regenerate with:

    python -m loadwatch.daemon.config_reference > docs/config.md
"""

from __future__ import annotations

import sys
from typing import Any

from loadwatch.daemon import config
from loadwatch.daemon.config_table import SCHEMA, Key

TABLES = ("", "log", "http", "gpu", "forecast", "model", "events", "vllm")

INTRO = {
    "": "Top-level keys.",
    "log": "The vLLM log to follow (watch mode), or the one the supervisor writes.",
    "http": "The endpoints: `/metrics`, `/status`, `/healthz`, `/readyz`, `/livez`.",
    "gpu": "The GPUs, through NVML.",
    "forecast": "When a load counts as stalled or failed, and its budget.",
    "model": "The checkpoint, for byte progress, the memory forecast and the KV-cache verdict.",
    "events": "The event log.",
    "vllm": "Supervise mode: present, loadwatch runs vLLM itself.",
}

DOCS: dict[str, str] = {
    "state_dir": "where checkpoints, the emit mark and the start history (`starts.json`, what "
    "the last starts that got ready took; to clear it, delete it while loadwatch is stopped) "
    "and, in supervise mode, the crash loop under way (`crash_loop.json`: its first failure "
    "and remedies, until a start gets ready) live: `/var/lib/loadwatch`, or, for `loadwatch run` without `--config` by a user who "
    "cannot write `/var/lib`, `~/.local/state/loadwatch`; one daemon per directory (a second "
    "exits 75)",
    "events_file": "also write the event log (one JSON object per line, every event) to this "
    "file; `SIGHUP` reopens it for logrotate",
    "sessions_kept": "earlier vLLM sessions kept in `/status` and the state",
    "[log] path": "the vLLM log (required in watch mode; supervise mode writes it)",
    "[log] mode": "how changes are noticed: inotify, polling (network or shared storage), or "
    "inotify with polling as fallback",
    "[log] poll_interval_s": "how often the file is checked when polling",
    "[log] coalesce_ms": "with inotify, how long after a change the file is read, so the "
    "appends of that time cost one read (0: at once); while reads keep finding data, the next "
    "is this long after the last, and a rotation or a new file is read at once",
    "[log] grammar": "the grammar the log is read with: a folder under `parsers/` (vLLM's is "
    "the one there is)",
    "[log] max_record_bytes": "a longer record (line) is cut to this many bytes and counted",
    "[log] input": "where vLLM's lines come from: a plain `file`, the kubelet's CRI log "
    "(`cri`, `/var/log/pods`), docker's json-file (`docker`), a unit's `journal`; `auto`: the "
    "journal when `journal_unit` is set, else by the path and first line",
    "[log] format": "the older name for a file's kind, still read: `plain` is input `file`, "
    "`cri` and `docker` the same; it must agree with `input` when both are given",
    "[log] journal_unit": "read this systemd unit's journal instead of a file (`vllm.service`), "
    "through `journalctl -o json --follow`, each entry once across restarts (by cursor); "
    "not with `path`",
    "[log] journal_file": "with `journal_unit`: a journal file to read (another host's, a copy)",
    "[log] journal_directory": "with `journal_unit`: a journal directory to read",
    "[http] listen": "`HOST:PORT` for every endpoint (default `127.0.0.1:9321`: loopback "
    "unless configured)",
    "[http] probe_listen": "`HOST:PORT` serving the probe routes alone (`/healthz`, `/readyz`, "
    "`/livez`) without credentials, for a kubelet when auth is on",
    "[http] tls_cert": "PEM certificate: serve HTTPS (goes with `tls_key`)",
    "[http] tls_key": "PEM private key for `tls_cert`",
    "[http] bearer_token_file": "a file holding the bearer token every request must carry",
    "[http] basic_auth_user": "basic-auth user (goes with `basic_auth_password_file`)",
    "[http] basic_auth_password_file": "a file holding the basic-auth password",
    "[http] publish_interval_s": "counters that only grow (lines read, GPU readings) are "
    "rendered when a scrape asks for them, at most this often (seconds); a transition, "
    "failure, stall or change of readiness at once; a scrape never sees older data",
    "[http] max_connections": "connections served at once; more are closed at once",
    "[http] request_timeout_s": "a client that has not sent its request in this time is dropped",
    "[gpu] source": "`nvml` (real GPUs), `simulated` (tests, the demo) or `none`",
    "[gpu] poll_interval_s": "seconds between GPU polls",
    "[gpu] deadline_s": "a poll that takes longer is abandoned and counted as an error",
    "[gpu] simulated_count": "GPUs of the simulated source",
    "[gpu] devices": "the GPUs this loadwatch watches: indices, `GPU-` or `MIG-` UUIDs (default: "
    "the supervised `CUDA_VISIBLE_DEVICES`, else every GPU)",
    "[forecast] stall_factor": "a load is stalled after this many times the usual time per "
    "shard without progress...",
    "[forecast] stall_floor_s": "...and never before this many seconds",
    "[forecast] quiet_stall_s": "outside the weights bar a load is stalled after this many "
    "seconds in which the log showed no step of the load (a milestone, a bar, a warning) and "
    "vLLM read no bytes: before the bar (model init) and after the weights (`torch.compile`, "
    "CUDA graph capture, the KV-cache profile, which can be silent for many minutes on a large "
    "model); raise it for a longer compile",
    "[forecast] load_budget_s": "the time a load may take; exported for the over-budget alert",
    "[forecast] failure_hold_s": "seconds a fatal failure is held before the session fails, so "
    "the echoes of one crash (`EngineCore failed to start.` before the traceback that says why) "
    "are read first and the failure is said once, of its root cause; the process's end decides "
    "sooner; `0`: at the first fatal line",
    "[model] dir": "the checkpoint directory (shard sizes, `config.json`, the KV-cache "
    "declaration)",
    "[model] kv_cache_dtype": "the `--kv-cache-dtype` vLLM runs with, when loadwatch cannot read "
    "it from the argv or the log",
    "[model] allowed_roots": "directories under which the model directory the log's engine "
    "config names (`model='/path'`) may be read, when `dir` is unset: the log is text vLLM's "
    "clients partly choose, so the path alone never decides what is read; a path outside is not "
    "read and the model stays unknown, said once: a `daemon.problem` line, or with no roots a "
    "`model.not_read` line (default: `dir`; in supervise mode the model path of `[vllm] argv`; "
    "in watch mode none)",
    "[events] stdout": "what stdout (the journal under systemd) gets: `transitions` (what the "
    "daemon decided, and failures), `all`, or `none`; the events file always gets all",
    "[vllm] argv": "the vLLM command, as a list (never a shell line); `loadwatch run --config "
    "FILE -- COMMAND` replaces it, and the table's other keys apply to that command",
    "[vllm] env": "environment variables for vLLM",
    "[vllm] inherit_env": "start vLLM with loadwatch's environment (plus `env`)",
    "[vllm] cwd": "vLLM's working directory",
    "[vllm] restart": "when a vLLM that exited is started again",
    "[vllm] backoff_initial_s": "the first restart's delay; it doubles with each failure",
    "[vllm] backoff_max_s": "the longest delay between restarts",
    "[vllm] crash_loop_starts": "this many starts within `crash_loop_window_s` is a crash loop: "
    "the supervisor gives up (`fatal`)",
    "[vllm] crash_loop_window_s": "the window of `crash_loop_starts`",
    "[vllm] stop_grace_s": "SIGTERM, then this long, then SIGKILL for the whole process tree",
    "[vllm] stall_policy": "on a stalled load: alert only, or restart vLLM",
    "[vllm] stall_restart_after_s": 'with `stall_policy = "restart"`: stalled this long restarts',
    "[vllm] preflight": "the check before a start (FP8 KV cache on SM120, memory): warn, refuse "
    "to start, or skip",
    "[vllm] remedies": "remedies tried, in this order, when a start fails for a known reason "
    "(none by default): `max_model_len` starts again with the largest `--max-model-len` vLLM "
    "said would fit (when its error names none, the largest the memory plan says fits), after "
    "`kv_cache_too_small` or `max_model_len`; `gpu_memory_utilization` "
    "with `--gpu-memory-utilization` lower by `remedy_gpu_memory_step` (from 0.9 when not given, "
    "at or below vLLM's default; never below 0.5), after `cuda_oom` in the KV-cache profiling or the CUDA-graph capture "
    "(an OOM while loading weights has no remedy); `fp8_kv_unsupported` keeps the KV cache in "
    "the model dtype after the attention backend refused the FP8 one (`remedy_fp8` says how), "
    "unless the memory plan says `--max-model-len` does not fit it (twice the bytes per token "
    "of FP8); its line shows the KV tokens per GPU with each; `enforce_eager` (only when listed) "
    "ends a start stalled in `torch_compile` or `graph_capture` (the daemon's stall detection, "
    "whatever `stall_policy` says) and starts again with `--enforce-eager`. Each is applied at "
    "most once "
    "per crash loop, announced by a `vllm.remedy` line with the change as a diff of the command, "
    "and reverted when the next start fails again; the crash-loop rule applies as ever. With "
    '`preflight = "refuse"` a start the preflight refuses is judged the same way before vLLM '
    "runs (its memory plan predicts vLLM's own error, estimate included), and the preflight "
    "checks the command the next start runs",
    "[vllm] remedy_min_model_len": "the `max_model_len` remedy never starts vLLM with a "
    "`--max-model-len` below this (a shorter context is rarely worth serving; default 2048)",
    "[vllm] remedy_gpu_memory_step": "how much the `gpu_memory_utilization` remedy lowers "
    "`--gpu-memory-utilization`",
    "[vllm] remedy_fp8": "how the `fp8_kv_unsupported` remedy keeps the KV cache in the model "
    "dtype: `flag` starts vLLM with `--kv-cache-dtype bfloat16` (no file changes; vLLM's `auto` "
    "takes the checkpoint's FP8 declaration since 2025-12); `patch` drops the checkpoint's FP8 KV "
    "declaration from its config files as `loadwatch patch-model --drop-fp8-kv-cache` does "
    "(originals kept beside them; put back byte for byte when the start fails again, or by "
    "`patch-model --revert`)",
    "[vllm] log_max_bytes": "the captured log is rotated at this size",
    "[vllm] log_keep": "rotated logs kept",
    "[vllm] output": "where vLLM's output goes: `file` (the log, `[log] path`) or `file+stdout` "
    "(also loadwatch's stdout, line by line between the event lines, for `kubectl logs` and a "
    "cluster's log pipeline: docs/kubernetes.md). On stdout each line is whole and as vLLM "
    "wrote it, but for secrets loadwatch knows (masked) and lines that start with `{` (kept off: "
    "there, only the event lines, JSON objects with an `event` key, do); lines a full pipe "
    "cannot take are dropped, never waited for",
    "[vllm] health_url": "vLLM's `/health`, `http` or `https` (default: from `--host`/`--port` "
    "in argv, or in watch mode the first URL the session's log printed, `0.0.0.0` meaning "
    "loopback); a `[vllm]` table without argv may hold this and the keys below for watch mode. "
    "Every probe goes to this one host and port, follows no redirect (a 3xx is a failed probe) "
    "and no proxy from the environment",
    "[vllm] allowed_hosts": "hosts besides loopback that the URL in the log may name (the log "
    "holds text vLLM's clients choose): without them, or `health_url`, a logged URL that is not "
    "`http` to loopback is not probed and is said in one `daemon.problem` line",
    "[vllm] health_interval_s": "seconds between `/health` probes once the API server is up: "
    "a server that stops answering is not ready within two",
    "[vllm] servable": "ready only once, after `/health` answered, one completion of one token "
    "(the served model from `/v1/models`) succeeded; its failure is `completion_failed`",
    "[vllm] servable_prompt": "the servable check's prompt",
    "[vllm] servable_timeout_s": "how long the servable check's requests may take",
    "[vllm] user": "watch mode: the user vLLM runs as (a name, or a uid, which needs no name "
    "here). A pid the log names is taken for vLLM's (its argv read, its exit a stop) only when "
    "that process runs as this user and is vLLM by its command line (`vllm serve`, `python -m "
    "vllm.entrypoints...`, `VLLM::...`) or was spawned by one; else one `daemon.problem` line. "
    "Default: the owner of the log file, as the vLLM that writes a log owns it; set it when "
    "another writes the file (systemd's `StandardOutput=file:`, a container runtime: root) or "
    "for `journal_unit`. Not with argv",
    "[vllm] api_key_file": "a file holding the API key vLLM asks for (its `--api-key`), sent by "
    "the servable check as `Authorization: Bearer`; read once at start, never shown (default: "
    "the supervised argv's `--api-key`)",
}

DEFAULT_SHOWN = {
    "state_dir": "see meaning",
    "[http] listen": "`127.0.0.1:9321`",
    "[model] allowed_roots": "see meaning",
}


def keys() -> list[Key]:
    """Every key the reader takes, in its order, each table read once."""
    found: list[Key] = []
    token = SCHEMA.set(found)
    try:
        config.parse_config({"vllm": {"argv": ["vllm", "serve", "MODEL"]}})
    finally:
        SCHEMA.reset(token)
    seen: set[str] = set()
    out = []
    for k in found:
        if k.ref not in seen:
            seen.add(k.ref)
            out.append(k)
    return out


def _default(k: Key) -> str:
    if k.ref in DEFAULT_SHOWN:
        return DEFAULT_SHOWN[k.ref]
    v: Any = k.default
    if v is None or v == () or v == {}:
        return "unset"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, float) and v.is_integer():
        return f"`{int(v)}`" if abs(v) < 1e15 else f"`{v:g}`"
    return f"`{v}`"


def render() -> str:
    ks = keys()
    lines = [
        "# Configuration reference",
        "",
        "Every key `loadwatch run --config FILE` reads (TOML), generated from the code that reads",
        "them (`python -m loadwatch.daemon.config_reference > docs/config.md`; a test fails when",
        "this page and the code differ). An unknown key, a wrong type or a value out of range is",
        "an error: one line naming the key, exit 78. Flags (`--log`, `--listen`, ...) override",
        "the file. Examples: `systemd/loadwatch.toml.example` (watch mode) and",
        "`systemd/loadwatch-supervise.toml.example` (supervise mode).",
    ]
    for table in TABLES:
        rows = [k for k in ks if k.table == table]
        if not rows:
            continue
        lines += ["", f"## {'[' + table + ']' if table else 'Top level'}", "", INTRO[table], ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for k in rows:
            lines.append(f"| `{k.name}` | {k.kind} | {_default(k)} | {DOCS.get(k.ref, '')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
