#!/usr/bin/env bash
# Create .venv and (re)install loadwatch with its test extras when the package's file list or
# pyproject.toml changed. A strict editable install links each file, so a new module needs this;
# the C part (parsers/_scan.c) is compiled then, so its source counts too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# VENV and EXTRAS choose the environment: the default is the test one; `make demo` asks for a
# runtime-only one (EXTRAS=, VENV=.venv-run): what an operator's install has, nothing more.
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS-[test]}
stamp=$VENV/.installed
want=$( { cat pyproject.toml setup.py parsers/*.c; find daemon parsers exporters -name '*.py' -o -name '*.pyi' -o -name 'py.typed' -o -name '*.toml' | sort; find systemd prometheus grafana k8s docs -type f | sort; } | sha1sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
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
