#!/usr/bin/env bash
# Create .venv and (re)install loadwatch with its test extras when the package's file list or
# pyproject.toml changed. A strict editable install links each file, so a new module needs this;
# the compiled parts are built then (parsers/_scan.c, and the modules pyproject.toml lists under
# [tool.loadwatch] compiled: their .so shadows the .py), so their sources count too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# VENV and EXTRAS choose the environment: the default is the test one; `make demo` asks for a
# runtime-only one (EXTRAS=, VENV=.venv-run): what an operator's install has, nothing more.
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS-[test]}
stamp=$VENV/.installed
compiled=$("$PY" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["loadwatch"]["compiled"])')
# shellcheck disable=SC2086  # (the list: paths without spaces)
want=$( { cat pyproject.toml setup.py parsers/*.c $compiled; find daemon parsers exporters -name '*.py' -o -name '*.pyi' -o -name 'py.typed' -o -name '*.toml' | sort; find systemd prometheus grafana k8s docs -type f | sort; } | sha1sum | cut -d' ' -f1)
# A compiled module older than its source (a checkout, an edit undone) is built again too, and
# the build of a module no longer listed goes (its .so would shadow its .py): tests/conftest.py
# refuses to test either.
fresh=1
for so in $(find daemon parsers exporters -name '*.cpython-*.so' ! -name '_scan.*'); do
  case " $compiled " in *" ${so%%.cpython-*}.py "*) ;; *) rm -f "$so"; fresh=0 ;; esac
done
for py in $compiled; do
  for so in "${py%.py}".cpython-*.so; do
    if [ -e "$so" ] && [ "$py" -nt "$so" ]; then fresh=0; fi
  done
done
if [ "$fresh" = 1 ] && [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# The C scanner needs a C compiler and Python's headers. Without them the install still works
# (scan.py falls back to Python), but the tests insist on the C build: get them when root.
inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if ! command -v cc >/dev/null 2>&1 || [ ! -f "$inc/Python.h" ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    pkgs=(gcc libc6-dev)
    [ -f "$inc/Python.h" ] || pkgs+=("python3-dev")
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  else
    echo "no C compiler or Python.h: the C scanner is not built (install gcc and python3-dev)" >&2
  fi
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".$EXTRAS" \
  --config-settings editable_mode=strict
echo "$want" > "$stamp"
