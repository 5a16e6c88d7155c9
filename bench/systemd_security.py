"""systemd's own exposure score for each loadwatch unit, with what is left exposed.

`python bench/systemd_security.py [UNIT ...]` runs `systemd-analyze security --offline=true` on
the units in systemd/ (or the ones named) and prints, per unit, the overall score (0 = locked
down, 10 = fully exposed), systemd's rating, and every check that still adds exposure. The watch
unit's goal is <= 2.5; the exit status is 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNITS = (ROOT / "systemd" / "loadwatch.service", ROOT / "systemd" / "loadwatch-supervise.service")
GOALS = {"loadwatch.service": 2.5}
_OVERALL = re.compile(r"Overall exposure level for \S+: ([0-9.]+) (\w+)")


@dataclass(frozen=True)
class Exposure:
    unit: str
    score: float
    rating: str
    exposed: tuple[tuple[str, float], ...]  # (check, exposure it adds), largest first


def analyze(unit: Path) -> Exposure:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise SystemExit("systemd-analyze not found: install systemd (scripts/ensure-tools.sh)")
    base = [tool, "security", "--offline=true", "--no-pager"]
    text = subprocess.run(
        [*base, str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    found = _OVERALL.search(text.stdout + text.stderr)
    if found is None:
        raise SystemExit(f"{unit.name}: no score in systemd-analyze output: {text.stderr.strip()}")
    items = subprocess.run(
        [*base, "--json=short", str(unit)], capture_output=True, text=True, check=False, timeout=60
    )
    exposed = []
    for item in json.loads(items.stdout or "[]"):
        weight = item.get("exposure")
        if item.get("set") is False and weight:
            exposed.append((str(item["name"]), float(weight)))
    exposed.sort(key=lambda pair: (-pair[1], pair[0]))
    return Exposure(unit.name, float(found.group(1)), found.group(2), tuple(exposed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("units", nargs="*", type=Path, default=list(UNITS))
    args = parser.parse_args(argv)
    missed = False
    for unit in args.units:
        result = analyze(unit)
        goal = GOALS.get(result.unit)
        verdict = ""
        if goal is not None:
            ok = result.score <= goal
            missed |= not ok
            verdict = f"  goal <= {goal}: {'met' if ok else 'MISSED'}"
        print(f"{result.unit}: {result.score:.1f} {result.rating}{verdict}")
        for name, weight in result.exposed:
            print(f"    {weight:.1f}  {name}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
