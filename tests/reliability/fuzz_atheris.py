"""The atheris (libFuzzer) harness over the fuzz targets: coverage-guided, bytes in.

    .venv/bin/python -m tests.reliability.fuzz_atheris [libFuzzer flags] [CORPUS_DIR...]

The first byte picks the target (even: the parser, odd: the follower), the next ones its
settings; the rest is the log. Any exception is a crash: libFuzzer stops and saves the input.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["loadwatch"]):
    from tests.reliability.fuzz_targets import follow_target, parse_target

# the follower target's files; the test gives a directory it removes afterwards
WORKDIR = Path(os.environ.get("LOADWATCH_FUZZ_DIR") or tempfile.mkdtemp(prefix="loadwatch-fuzz-"))
COUNT = [0]


def one_input(data: bytes) -> None:
    if len(data) < 3:
        return
    COUNT[0] += 1
    if data[0] % 2 == 0:
        parse_target(data[2:], 1 + data[1] * 4)
    else:
        body = data[3:]
        cuts = list(body[-8:]) if len(body) > 8 else []
        follow_target(body, [c * 17 for c in cuts], 1 + data[1] % 64, WORKDIR, COUNT[0])


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
