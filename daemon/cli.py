"""`loadwatch`: the command line.

    loadwatch run --log PATH                     watch a vLLM log (GPUs polled when NVML is there)
    loadwatch run --config FILE                  watch or supervise, as the file says
    loadwatch run [options] -- vllm serve ...    supervise vLLM with that command
    loadwatch status [--url U] [--watch] [--json]
    loadwatch analyze LOG [--model-dir DIR] [--json]
    loadwatch events LOG                         the parsed events, one JSON object per line
    loadwatch preflight MODEL_DIR [--kv-cache-dtype X] [--gpu-cc 12.0] [--json]
    loadwatch patch-model MODEL_DIR (--drop-fp8-kv-cache | --revert) [--dry-run]
    loadwatch demo [--scenario S] [--speed X] [--real]

Expected problems end in one line on stderr and a non-zero exit code, never a traceback:
64 usage, 65 bad input data, 66 input missing, 73 cannot create output, 74 I/O error,
78 configuration error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

EX_USAGE = 64
EX_DATAERR = 65
EX_NOINPUT = 66
EX_CANTCREAT = 73
EX_IOERR = 74
EX_CONFIG = 78


class UsageError(Exception):
    """A problem with what the user asked for: one line, exit 64."""


def fail(message: str, code: int) -> int:
    print(f"loadwatch: {message}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="loadwatch",
        description="Watch a large model load into vLLM and keep the server alive.",
    )
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon (watch a log, or supervise vLLM)")
    run.add_argument("--config", type=Path, help="TOML configuration file")
    run.add_argument("--log", type=Path, help="the vLLM log to follow (supervise mode writes it)")
    run.add_argument("--state-dir", type=Path, help="where checkpoints live")
    run.add_argument("--listen", help="HOST:PORT for /metrics, /status, /healthz, /readyz")
    run.add_argument("--gpu", choices=("nvml", "simulated", "none"), help="GPU source")
    run.add_argument("--events-file", type=Path, help="also write the event log to this file")
    run.add_argument("--model-dir", type=Path, help="the checkpoint directory (byte progress)")
    run.add_argument("vllm", nargs=argparse.REMAINDER, help="-- then the vLLM command to supervise")

    st = sub.add_parser("status", help="show a running daemon's status")
    st.add_argument("--url", default="http://127.0.0.1:9321", help="the daemon's address")
    st.add_argument("--watch", action="store_true", help="refresh until interrupted")
    st.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    st.add_argument("--json", action="store_true", help="print /status as JSON")

    an = sub.add_parser("analyze", help="post-mortem of a vLLM log")
    an.add_argument("log", type=Path)
    an.add_argument("--model-dir", type=Path)
    an.add_argument("--json", action="store_true")
    an.add_argument("--max-record-bytes", type=int, default=65536)

    ev = sub.add_parser("events", help="print the parsed events of a log as JSON lines")
    ev.add_argument("log", type=Path)
    ev.add_argument("--max-record-bytes", type=int, default=65536)

    pf = sub.add_parser("preflight", help="check a model directory before starting vLLM")
    pf.add_argument("model_dir", type=Path)
    pf.add_argument("--kv-cache-dtype")
    pf.add_argument("--gpu-cc", help="compute capability, e.g. 12.0 (default: read by NVML)")
    pf.add_argument("--json", action="store_true")

    pm = sub.add_parser("patch-model", help="drop the FP8 KV-cache declaration, or revert it")
    pm.add_argument("model_dir", type=Path)
    what = pm.add_mutually_exclusive_group(required=True)
    what.add_argument("--drop-fp8-kv-cache", action="store_true")
    what.add_argument("--revert", action="store_true")
    pm.add_argument("--dry-run", action="store_true")

    demo = sub.add_parser("demo", help="a simulated Kimi-K2.5 load, supervised, in about a minute")
    demo.add_argument(
        "--scenario",
        default="success",
        choices=("success", "stall", "oom", "crash-loop", "fp8-kv-on-sm120"),
    )
    demo.add_argument("--speed", type=float, default=15.0, help="how much faster than real time")
    demo.add_argument("--real", action="store_true", help="real vLLM on the CPU with a tiny model")
    demo.add_argument("--listen", default="127.0.0.1:9321")
    demo.add_argument("--no-screen", action="store_true", help="no live screen (logs only)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        return fail(str(exc), EX_USAGE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command is None:
        _parser().print_help()
        return EX_USAGE
    if args.command == "run":
        from loadwatch.daemon.app import run_command

        return run_command(args)
    if args.command == "status":
        from loadwatch.exporters.terminal.watch import status_command

        return status_command(
            args.url, watch=args.watch, as_json=args.json, interval_s=args.interval
        )
    if args.command == "analyze":
        from loadwatch.daemon.tools.analyze import analyze_command

        return analyze_command(
            args.log,
            model_dir=args.model_dir,
            as_json=args.json,
            max_record_bytes=args.max_record_bytes,
        )
    if args.command == "events":
        from loadwatch.daemon.tools.analyze import events_command

        return events_command(args.log, max_record_bytes=args.max_record_bytes)
    if args.command == "preflight":
        return _preflight(args)
    if args.command == "patch-model":
        from loadwatch.daemon.tools.patch import patch_model_cli

        text, code = patch_model_cli(
            str(args.model_dir),
            drop_fp8=args.drop_fp8_kv_cache,
            revert=args.revert,
            dry_run=args.dry_run,
        )
        print(text, file=sys.stdout if code == 0 else sys.stderr)
        return code
    if args.command == "demo":
        from loadwatch.daemon.tools.demo import demo_command

        return demo_command(args)
    raise UsageError(f"unknown command {args.command!r}")


def _preflight(args: argparse.Namespace) -> int:
    import json

    from loadwatch.daemon.tools.preflight import parse_gpu_cc, preflight_cli

    cc: tuple[int, int] | None = None
    if args.gpu_cc:
        try:
            cc = parse_gpu_cc(args.gpu_cc)
        except ValueError as exc:
            raise UsageError(f"--gpu-cc: {exc}") from None
    else:
        cc = _nvml_cc()
    text, doc, code = preflight_cli(args.model_dir, args.kv_cache_dtype, cc)
    print(json.dumps(doc, indent=2) if args.json else text)
    return code


def _nvml_cc() -> tuple[int, int] | None:
    """The first GPU's compute capability, when NVML answers."""
    from loadwatch.daemon.sources.gpu.nvml import NvmlSource

    src = NvmlSource(xid_events=False, logger=lambda line: None)
    try:
        reading = src.poll()
        return next((s.compute_capability for s in reading.samples if s.compute_capability), None)
    finally:
        src.close()


if __name__ == "__main__":
    sys.exit(main())
