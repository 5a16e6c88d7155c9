"""What `loadwatch analyze --json` does not import. Its start is most of its time on a short log
(and a share of it on a long one: a tool run beside mtail on a log of 200,000 lines spends a
quarter of its time starting), and the start was mostly imports: these are the modules it
imported for nothing, from two milliseconds to tens. The console's, the text report's and the
version's are imported where they are used, asyncio (and the ssl it brings) by the daemon's
loop alone; the daemon's configuration (and tomllib) by the daemon, statistics by an ETA learned
from past starts, socket by a journald stream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NOT_FOR_JSON = (
    "rich",
    "structlog",
    "pygments",
    "importlib.metadata",
    "asyncio",
    "ssl",
    "loadwatch.daemon.config",
    "tomllib",
    "statistics",
    "socket",
)

PROBE = """
import json, sys
from loadwatch.daemon.cli import main
code = main(["analyze", "--json", sys.argv[1]])
sys.stdout.flush()
mods = sorted(m for m in sys.modules if m in NOT or m.split(".")[0] in NOT)
print(json.dumps({"code": code, "modules": mods}), file=sys.stderr)
"""


def _imported(*argv: str) -> tuple[dict[str, object], str]:
    probe = f"NOT = {NOT_FOR_JSON!r}\n{PROBE}"
    out = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60
    )
    return json.loads(out.stderr.strip().splitlines()[-1]), out.stdout


def test_analyze_json_imports_no_console_library() -> None:
    # a real vLLM 0.32 start, analysed whole: the report's path is taken, not a shortcut
    got, stdout = _imported(str(FIXTURES / "real-v0.32-llama.log"))
    assert got["code"] == 0 and json.loads(stdout)["verdict"]["status"] == "ready"
    assert got["modules"] == [], got


def test_the_text_report_still_gets_its_console() -> None:
    """The same modules imported where they are used: the text report draws with rich."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadwatch.daemon.cli",
            "analyze",
            str(FIXTURES / "real-v0.32-llama.log"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stderr) == (0, "")
    assert "1 session" in out.stdout and "Verdict: ready" in out.stdout
