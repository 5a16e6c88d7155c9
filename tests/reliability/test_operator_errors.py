"""A careless operator's configuration, through the real command line.

- A NUL byte in `state_dir`, `events_file` or `[log] path` (TOML's `\\u0000`; argv cannot hold
  one): one line, exit 78, no traceback; before, a traceback and exit 1, or a daemon that
  followed nothing for ever.
- A missing TLS certificate or key, one that is no certificate, a missing or empty token file,
  an invalid IP in `[http] listen`: one line, exit 78 (a configuration error the unit does not
  restart for), not 69. The `--listen` flag is checked by the CLI's parser: exit 64 (usage).
- `--model-dir /nonexistent`: one `daemon.problem` line that says what is off without it.
- Two daemons on one state directory: the second exits 75 with one line; the first goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.exporters.test_http import make_cert
from tests.reliability.proc import REPO, DaemonProc, wait_for

EX_CONFIG = 78
EX_TEMPFAIL = 75


def _run(args: list[str], timeout_s: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadwatch.daemon.cli", "run", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _one_line(out: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == code, (out.returncode, out.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("loadwatch"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("key", ["state_dir", "events_file", "log"])
def test_nul_byte_in_a_path_is_a_config_error(tmp_path: Path, key: str) -> None:
    paths = {"state_dir": tmp_path / "st", "events_file": tmp_path / "ev.jsonl"}
    log = tmp_path / "vllm.log"
    log.write_text("")
    body = {k: f"'{v}'" for k, v in paths.items()}
    log_value = f"'{log}'"
    if key == "log":
        log_value = f'"{log}\\u0000x"'
    else:
        body[key] = f'"{paths[key]}\\u0000x"'
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f"state_dir = {body['state_dir']}\nevents_file = {body['events_file']}\n"
        f"[log]\npath = {log_value}\n[gpu]\nsource = 'none'\n[http]\nlisten = '127.0.0.1:0'\n"
    )
    _one_line(_run(["--config", str(cfg)]), EX_CONFIG, "NUL byte")


def _http_case(tmp_path: Path, case: str) -> list[str]:
    log = tmp_path / "vllm.log"
    log.write_text("")
    base = ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none"]
    cert, key = make_cert(tmp_path)
    http = "[http]\nlisten = '127.0.0.1:0'\n"
    if case == "bad listen ip":
        http = "[http]\nlisten = '999.1.2.3:0'\n"
    if case == "missing cert":
        http += f"tls_cert = '{tmp_path / 'nope.pem'}'\ntls_key = '{key}'\n"
    elif case == "missing key":
        http += f"tls_cert = '{cert}'\ntls_key = '{tmp_path / 'nope.key'}'\n"
    elif case == "not a cert":
        junk = tmp_path / "junk.pem"
        junk.write_text("not a certificate\n")
        http += f"tls_cert = '{junk}'\ntls_key = '{key}'\n"
    elif case == "missing token":
        http += f"bearer_token_file = '{tmp_path / 'nope'}'\n"
    elif case == "empty token":
        (tmp_path / "token").write_text("\n \n")
        http += f"bearer_token_file = '{tmp_path / 'token'}'\n"
    cfg = tmp_path / "c.toml"
    cfg.write_text(http)
    return [*base, "--config", str(cfg)]


@pytest.mark.parametrize(
    ("case", "word"),
    [
        ("missing cert", "nope.pem"),
        ("missing key", "nope.key"),
        ("not a cert", "junk.pem"),
        ("missing token", "bearer_token_file"),
        ("empty token", "empty"),
        ("bad listen ip", "999.1.2.3"),
    ],
)
def test_http_setting_that_cannot_work_is_a_config_error(
    tmp_path: Path, case: str, word: str
) -> None:
    _one_line(_run(_http_case(tmp_path, case)), EX_CONFIG, word)


def test_bad_listen_ip_on_the_command_line_is_a_usage_error(tmp_path: Path) -> None:
    """The flag is checked by the CLI's parser, as every flag's value: exit 64 (usage)."""
    out = _run(["--log", str(tmp_path / "v.log"), "--gpu", "none", "--listen", "1.2.3:0"])
    _one_line(out, 64, "not an IP address", "1.2.3")


def test_model_dir_that_is_not_there_is_said(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    missing = tmp_path / "no-such-model"
    d = DaemonProc(
        ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none",
         "--listen", "127.0.0.1:0", "--model-dir", str(missing)],
        tmp_path / "out.jsonl",
    )  # fmt: skip
    d.wait_listening()
    try:

        def said() -> list[str]:
            problems = [e for e in d.events() if e.get("event") == "daemon.problem"]
            return [e["error"] for e in problems if str(missing) in e["error"]]

        wait_for(said, "the model directory's problem line", 5)  # (it may follow `listening`)
    finally:
        assert d.stop() == 0
    (line,) = said()  # and no second one, in the daemon's whole run
    assert "No such file" in line and "byte progress" in line


def test_second_daemon_on_one_state_dir_exits_75(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    args = ["--log", str(log), "--state-dir", str(tmp_path / "st"), "--gpu", "none"]
    first = DaemonProc([*args, "--listen", "127.0.0.1:0"], tmp_path / "first.jsonl")
    first.wait_listening()
    try:
        out = _run([*args, "--listen", "127.0.0.1:0"])
        _one_line(out, EX_TEMPFAIL, "another loadwatch", f"(pid {first.pid})", str(tmp_path / "st"))
        assert first.proc.poll() is None
        wait_for(lambda: first.get("/healthz")[0] == 200, "the first still serving")
    finally:
        assert first.stop() == 0
    # the lock goes with its holder: the next daemon starts
    again = DaemonProc([*args, "--listen", "127.0.0.1:0"], tmp_path / "again.jsonl")
    again.wait_listening()
    assert again.stop() == 0


def test_a_stop_asked_for_while_starting_is_a_clean_stop(tmp_path: Path) -> None:
    """SIGTERM the moment the daemon holds its state directory (its pid in the lock), long
    before it listens: it is kept, and the daemon stops as asked (exit 0, `daemon.stopped`), not
    killed by the default handler half-way through its start."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    state = tmp_path / "st"
    args = ["--log", str(log), "--state-dir", str(state), "--gpu", "none"]
    for n in range(3):
        out = tmp_path / f"run{n}.jsonl"
        d = DaemonProc([*args, "--listen", "127.0.0.1:0"], out)

        def holds_the_lock(d: DaemonProc = d) -> bool:
            try:
                return (state / "lock").read_text().strip() == str(d.pid)
            except OSError:
                return False

        wait_for(holds_the_lock, "the daemon holding its state directory", timeout_s=20)
        assert d.stop() == 0, d.stderr()
        assert "daemon.stopped" in [e.get("event") for e in d.events()]


@pytest.mark.parametrize("file_argv", [None, ["vllm", "serve", "/models/from-the-file"]])
def test_the_command_lines_vllm_argv_overrides_the_files(
    tmp_path: Path, file_argv: list[str] | None
) -> None:
    """`run --config FILE -- COMMAND`: the command replaces `[vllm] argv` (or stands in for a
    table that has none), and the file's other `[vllm]` keys still apply (`restart = "never"`:
    the exit ends supervision, no backoff)."""
    argv_line = "" if file_argv is None else f"argv = {json.dumps(file_argv)}\n"
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\n[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[vllm]\n{argv_line}restart = 'never'\npreflight = 'off'\nstop_grace_s = 1.0\n"
    )
    child = [sys.executable, "-c", "import sys; sys.exit(3)"]
    d = DaemonProc(["--config", str(cfg), "--", *child], tmp_path / "out.jsonl")
    try:
        d.wait_listening()

        def named(event: str) -> list[dict[str, object]]:
            return [e for e in d.events() if e.get("event") == event]

        wait_for(lambda: named("vllm.supervisor_done"), "supervision to end after the exit")
        assert [e["argv"] for e in named("vllm.started")] == [child]
        assert named("vllm.backoff") == []
    finally:
        assert d.stop() == 0, d.stderr()


def test_a_command_line_vllm_argv_and_a_journal_unit_conflict(tmp_path: Path) -> None:
    """What truly conflicts is still refused: supervise mode writes vLLM's log itself."""
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text("[log]\njournal_unit = 'vllm.service'\n[vllm]\nrestart = 'never'\n")
    out = _run(["--config", str(cfg), "--state-dir", str(tmp_path / "st"), "--", "vllm", "serve"])
    _one_line(out, EX_CONFIG, "[log] journal_unit", "supervise mode")
