"""A follower in its own process, so that a test can stop it (SIGSTOP) in the middle of a read.

Run as ``python -m tests.follower.reader LOG OUT``: it follows LOG with 64-byte reads (the cap,
and the size of every `pread`), says
"ready", and on each line from stdin does one `read()` and answers with a JSON line
``{"bytes": ..., "truncations": ...}`` (what that read delivered and the truncations it saw).
Everything delivered is appended to OUT, checked chunk by chunk by the Collector.
"""

from __future__ import annotations

import json
import sys

from loadwatch.daemon.sources.log.follower import LogFollower
from tests.follower.helpers import Collector


def main() -> None:
    log, out = sys.argv[1], sys.argv[2]
    f = LogFollower(log, cap_bytes=64, max_read_bytes=64 << 20, read_bytes=64)
    col = Collector(f)
    col.read()
    print("ready", flush=True)
    for _ in sys.stdin:
        before, n = f.health().truncations_total, len(col.data)
        col.read()
        with open(out, "ab") as w:
            w.write(col.data[n:])
        doc = {"bytes": len(col.data) - n, "truncations": f.health().truncations_total - before}
        print(json.dumps(doc), flush=True)
    f.close(checkpoint=False)


if __name__ == "__main__":
    main()
