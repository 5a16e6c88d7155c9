"""The one part of the build pyproject.toml cannot say: what is compiled, left out on request.

`python -m build` makes the platform wheel, with two compiled parts, both optional (without a C
compiler the build goes on with the Python they are made from; the daemon's `daemon.started`
line says what runs: `scanner`, `compiled`):
- the chunk scanner's candidate search, from parsers/_scan.c;
- the modules every log record goes through (`[tool.loadwatch] compiled` in pyproject.toml),
  compiled by mypyc from their own Python source: the same statements, run without the
  interpreter's per-bytecode work, about one and a half times as fast on a load's log.
`LOADWATCH_PURE=1 python -m build --wheel` makes the pure-Python wheel (py3-none-any), which
installs anywhere without a compiler.
"""

import os
import shlex
import shutil
import sys
import sysconfig
import tomllib
from pathlib import Path

from setuptools import Extension, setup

PURE = os.environ.get("LOADWATCH_PURE", "") not in ("", "0")
ROOT = Path(__file__).resolve().parent


def have_compiler() -> bool:
    """Whether the C compiler the build would call (`CC`, else Python's own) is there: without
    one, mypyc's analysis of the listed modules (half a minute) would be for nothing."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(cc)
    return bool(words) and shutil.which(words[0]) is not None


def compiled_modules() -> list[Extension]:
    """mypyc's extensions for the listed modules, or none (no mypyc, or a pure build)."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("mypyc is not installed: the record path runs as Python", file=sys.stderr)
        return []
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["loadwatch"]["compiled"]
    # mypyc names a module by its path: compile it where that path is the installed name
    # (the repository's folders are the package's subpackages, package-dir in pyproject.toml).
    stage = ROOT / "build" / "mypyc-src"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "loadwatch").mkdir(parents=True)
    (stage / "loadwatch" / "__init__.py").write_text("")
    for top in ("daemon", "parsers", "exporters"):
        (stage / "loadwatch" / top).symlink_to(ROOT / top, target_is_directory=True)
    here = os.getcwd()
    os.chdir(stage)
    try:
        exts = mypycify(
            [
                "--config-file",
                str(ROOT / "pyproject.toml"),
                # (an isolated build has none of the dependencies: what they give is Any)
                "--ignore-missing-imports",
                # The listed modules are checked; those they import only read (`make lint`
                # checks every module with the dependencies there: here a class of one that
                # subclasses rich's Console would subclass Any)
                "--follow-imports=silent",
                *[f"loadwatch/{m}" for m in listed],
            ],
            opt_level="3",
            target_dir=str(ROOT / "build" / "mypyc"),
        )
    finally:
        os.chdir(here)
    for ext in exts:
        ext.optional = True  # (a compile that fails leaves that module's Python in place)
    return exts


COMPILE = not PURE and have_compiler()
if not PURE and not COMPILE:
    print("no C compiler: the scanner and the record path run as Python", file=sys.stderr)
ext_modules = (
    [
        Extension("loadwatch.parsers._scan", sources=["parsers/_scan.c"], optional=True),
        *compiled_modules(),
    ]
    if COMPILE
    else []
)
setup(ext_modules=ext_modules)
