"""Secrets spelled every way vLLM's parser accepts them, and the log copy supervise mode writes.

vLLM's `FlexibleArgumentParser` (vllm/utils/argparse_utils.py) turns `_` into `-` in a flag's
name, takes a value after `=` or in the next argument(s) (`--api-key` nargs `+`, `--hf-token`
nargs `?`), and argparse takes an unambiguous prefix (`--api-k`, `--hf-t`). The real daemon
supervises a stand-in vLLM started with `--api_key A1 A2`, `--hf_tok=H` and a 3-character key,
which prints them back as older vLLM builds do in `non-default args:`; none of them is in
/status, the console or the event log file (the short one: not in any argv shown). The copy of
vLLM's output (the supervise-mode log) keeps them, as vLLM wrote it, and is mode 0600.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from loadwatch.daemon.supervise.logsink import RotatingLog
from loadwatch.parsers.vllm.argv_secrets import MASK, Redactor
from tests.reliability.proc import DaemonProc, wait_for

KEY1 = "sk-UNDERSCORE0key0one0abcdef012345"
KEY2 = "sk-SECOND0key0of0the0nargs0plus0list"
HF = "hf_ABBREVIATED0token0zyxwvut98765"
SHORT = "k3y"

CHILD = """
import sys, time
p = "(APIServer pid=1) "
out = sys.stdout
out.write(p + "INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.6.3\\n")
out.write(p + "INFO 11-30 10:00:00 [utils.py:1] non-default args: {'api_key': ['%s', '%s'], "
          "'hf_token': '%s'}\\n" % (sys.argv[2], sys.argv[3], sys.argv[4].split("=", 1)[1]))
out.write(p + "WARNING 11-30 10:00:01 [hub.py:1] token %s refused\\n" % sys.argv[4].split("=", 1)[1])
out.flush()
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("argv", "secrets"),
    [
        (["--api-key", "A1xx"], ["A1xx"]),
        (["--api_key", "A1xx", "A2xx", "--port", "1"], ["A1xx", "A2xx"]),
        (["--api-k=A1xx"], ["A1xx"]),
        (["--hf_token=H1xx"], ["H1xx"]),
        (["--hf-tok", "H1xx", "m"], ["H1xx"]),  # nargs "?": one value, the rest is not its
        (["--hf-token", "--port", "1"], []),  # a bare --hf-token: the cached login
        (["--ssl-keyfile", "/k.pem"], []),  # a real flag of its own, not a prefix of a secret
        (["--api-server-count", "2"], []),
        (["--api-key.x", "1"], []),  # a JSON key of vLLM's, not a flag
    ],
)
def test_secret_flags_as_vllms_parser_reads_them(argv: list[str], secrets: list[str]) -> None:
    red = Redactor()
    red.learn(argv)
    shown = red.argv(argv)
    for s in secrets:
        assert s not in " ".join(shown) and red.text(f"x {s} y") == f"x {MASK} y"
    assert len(shown) == len(argv)
    plain = [a for a in argv if not any(s in a for s in secrets)]
    assert [a for a in shown if MASK not in a] == plain
    assert sum(MASK in a for a in shown) == len(secrets)


def test_short_secret_masked_in_argv_by_its_place() -> None:
    red = Redactor()
    argv = ["vllm", "--api-key", SHORT, "--model", "m"]
    red.learn(argv)
    assert red.argv(argv) == ["vllm", "--api-key", MASK, "--model", "m"]
    assert red.value({"session": {"argv": argv}}) == {"session": {"argv": red.argv(argv)}}
    assert red.text("keys k3y") == "keys k3y"  # too short to mask in free text (documented)


def test_supervised_secret_spellings_stay_inside(tmp_path: Path) -> None:
    argv = [
        sys.executable, "-c", CHILD, "--api_key", KEY1, KEY2, f"--hf_tok={HF}",
        "--api-key", SHORT, "--model", "/models/m",
    ]  # fmt: skip
    cfg = tmp_path / "loadwatch.toml"
    cfg.write_text(
        f"state_dir = '{tmp_path / 'st'}'\nevents_file = '{tmp_path / 'events.jsonl'}'\n"
        "[log]\npoll_interval_s = 0.05\n[http]\nlisten = '127.0.0.1:0'\n[gpu]\nsource = 'none'\n"
        f"[vllm]\nargv = {json.dumps(argv)}\nrestart = 'never'\npreflight = 'off'\n"
        "stop_grace_s = 1.0\n"
    )
    d = DaemonProc(["--config", str(cfg)], tmp_path / "out.jsonl")
    d.wait_listening()
    vllm_log = tmp_path / "st" / "vllm.log"
    try:
        wait_for(lambda: d.status()["session"]["warnings_total"] >= 1, "the echo read")
        status = json.dumps(d.status())
    finally:
        assert d.stop() == 0
    text = vllm_log.read_text()
    assert KEY1 in text and HF in text  # the copy is vLLM's output as it wrote it...
    assert stat.S_IMODE(vllm_log.stat().st_mode) == 0o600  # ...readable by the daemon's user only
    places = {
        "/status": status,
        "console": (tmp_path / "out.jsonl").read_text(),
        "event log file": (tmp_path / "events.jsonl").read_text(),
    }
    for where, written in places.items():
        for secret in (KEY1, KEY2, HF):
            assert secret[:12] not in written and secret[-12:] not in written, (where, secret)
    started = next(e for e in d.events() if e.get("event") == "vllm.started")
    assert SHORT not in started["argv"] and started["argv"][-3] == MASK
    assert f'"{SHORT}"' not in status


def test_vllm_log_copy_is_0600_even_when_it_was_wider(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "v.log"
        path.write_bytes(b"old\n")
        path.chmod(0o644)  # left by an older loadwatch (0640) or made by hand
        log = RotatingLog(str(path), max_bytes=8, backups=2)
        log.write(b"abcdef\nghijkl\n")
        log.close()
    finally:
        os.umask(old)
    for p in (path, tmp_path / "v.log.1"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
