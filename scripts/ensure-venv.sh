#!/usr/bin/env bash
# Create .venv and (re)install loadwatch with its test extras when the package's file list or
# pyproject.toml changed. A strict editable install links each file, so a new module needs this;
# the C scanner (parsers/_scan.c) is compiled then, so its source counts too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
stamp=$VENV/.installed
want=$( { cat pyproject.toml parsers/*.c; find daemon parsers exporters -name '*.py' -o -name '*.pyi' -o -name 'py.typed' -o -name '*.toml' | sort; } | sha1sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' \
  --config-settings editable_mode=strict
echo "$want" > "$stamp"
