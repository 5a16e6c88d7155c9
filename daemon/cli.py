"""`loadwatch`: the command line.

    loadwatch run --log PATH                     watch a vLLM log (GPUs polled when NVML is there)
    loadwatch run --config FILE                  watch or supervise, as the file says
    loadwatch run [options] -- vllm serve ...    supervise vLLM with that command
    loadwatch status [--url U] [--watch] [--json]
    loadwatch analyze LOG [--model-dir DIR] [--json]
    loadwatch events LOG                         the parsed events, one JSON object per line
    loadwatch preflight (MODEL_DIR [--tensor-parallel-size N ...] | -- vllm serve ...) [--json]
              [--kv-cache-dtype X] [--gpu-cc 12.0] [--gpu-memory-gib G | --gpu-model NAME]
    loadwatch patch-model MODEL_DIR (--drop-fp8-kv-cache | --revert [--force]) [--dry-run]
    loadwatch alerts --runbook-base-url URL [--rules FILE] [--output FILE]
    loadwatch demo [--scenario S] [--speed X] [--real] [--keep] [--remedy-fp8 patch|flag]

Expected problems end in one line on stderr and a non-zero exit code, never a traceback:
64 usage (argparse's errors too), 65 bad input data, 66 input missing, 69 a service is down,
73 cannot create output, 74 I/O error, 75 the state directory is locked, 77 permission denied,
78 configuration error.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from loadwatch.daemon.sources.model.modelfiles import ModelFileError
from loadwatch.daemon.tools.plan_args import add_plan_flags
from loadwatch.daemon.tuning import tune_process

EX_USAGE = 64
EX_DATAERR = 65
EX_NOINPUT = 66
EX_CANTCREAT = 73
EX_IOERR = 74
EX_CONFIG = 78


class UsageError(Exception):
    """A problem with what the user asked for: one line, exit 64."""


def fail(message: str, code: int) -> int:
    from loadwatch.exporters.terminal.clean import print_error

    print_error(message)
    return code


EXIT_CODES = """exit codes:
  0   success (analyze: the load became ready; preflight: it fits)
  1   analyze: the load failed; preflight: it will fail
  2   analyze: incomplete; preflight: warnings
  64  usage error          65  bad input data     66  input missing
  69  a service is down    73  cannot create output  74  I/O error
  75  another daemon holds the state directory     77  permission denied
  78  configuration error  130 interrupted"""

EXAMPLES = """examples:
  loadwatch run --log /var/log/vllm/vllm.log --model-dir /models/Kimi-K2.5-NVFP4
  loadwatch run --config /etc/loadwatch/loadwatch.toml
  loadwatch run --model-dir /models/M -- vllm serve /models/M --tensor-parallel-size 8
  loadwatch status --watch
  loadwatch analyze vllm.log --json
  loadwatch preflight /models/Kimi-K2.5-NVFP4 --gpu-cc 12.0
  loadwatch patch-model /models/Kimi-K2.5-NVFP4 --drop-fp8-kv-cache --dry-run"""


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Epilogs keep their lines; every option with a default shows it, once: a help text that
    says its default itself (one that depends on something else) is left as written, and an
    unset option (None) shows no default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "(default" in text:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, with the conventions of the rest of the command: usage errors exit 64, on
    stderr, in one line that says what is wrong and where to look."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(EX_USAGE)


class _Version(argparse.Action):
    """`--version`, the number looked up when asked for: importlib.metadata costs a start tens
    of milliseconds."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        print(f"loadwatch {_version()}")
        parser.exit()


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("loadwatch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number above 0")
    return value


def _listen(text: str) -> str:
    from loadwatch.daemon.config import ConfigError, parse_listen

    try:
        parse_listen(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None
    return text


def _kv_dtype(text: str) -> str:
    from loadwatch.parsers.vllm.argv import KV_CACHE_DTYPES

    if text not in KV_CACHE_DTYPES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a KV-cache dtype vLLM accepts ({', '.join(KV_CACHE_DTYPES)})"
        )
    return text


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="loadwatch",
        description="Watch a large model load into vLLM and keep the server alive.",
        epilog=f"{EXAMPLES}\n\n{EXIT_CODES}",
        formatter_class=_Help,
    )
    ap.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, help: str, epilog: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=help, epilog=epilog or None, formatter_class=_Help
        )

    run = command(
        "run",
        "run the daemon (watch a log, or supervise vLLM)",
        "examples:\n  loadwatch run --log /var/log/vllm/vllm.log\n"
        "  loadwatch run --config /etc/loadwatch/loadwatch.toml\n"
        "  loadwatch run --model-dir /models/M -- vllm serve /models/M\n\n"
        "Flags override the config file: -- COMMAND replaces [vllm] argv, and the file's other\n"
        "[vllm] keys apply to it. A bad config exits 78 with one line naming the key.",
    )
    run.add_argument("--config", type=Path, metavar="FILE", help="TOML configuration file")
    run.add_argument(
        "--log", type=Path, metavar="PATH", help="the vLLM log to follow (supervise mode writes it)"
    )
    run.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where checkpoints live (default: /var/lib/loadwatch; without --config, for a "
        "user who cannot write /var/lib: ~/.local/state/loadwatch)",
    )
    run.add_argument(
        "--listen",
        type=_listen,
        metavar="HOST:PORT",
        help="address for /metrics, /status, /healthz, /readyz (default: 127.0.0.1:9321)",
    )
    run.add_argument(
        "--gpu", choices=("nvml", "simulated", "none"), help="GPU source (default: nvml)"
    )
    run.add_argument(
        "--gpu-devices",
        metavar="LIST",
        help="only these GPUs: indices or GPU-/MIG- UUIDs, comma-separated ([gpu] devices)",
    )
    run.add_argument(
        "--events-file", type=Path, metavar="FILE", help="also write the event log to this file"
    )
    run.add_argument(
        "--model-dir",
        type=Path,
        metavar="DIR",
        help="the checkpoint directory (shard sizes for byte progress, KV-cache dtype)",
    )
    run.add_argument(
        "vllm", nargs=argparse.REMAINDER, help="-- then the vLLM command to supervise ([vllm] argv)"
    )

    st = command(
        "status",
        "show a running daemon's status",
        "examples:\n  loadwatch status\n  loadwatch status --url 10.0.0.5:9321 --watch\n"
        "  loadwatch status --json | jq .phase\n"
        "  loadwatch status --url node0:9321 --url node1:9321 --url node2:9321 --watch\n\n"
        "With --watch on a terminal the screen redraws in place (q or Ctrl-C quits);\n"
        "on a pipe it writes one plain frame per interval.",
    )
    st.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="the daemon's address (http:// or https://; HOST:PORT alone means http); given "
        "more than once, one line per node of a deployment (default: http://127.0.0.1:9321)",
    )
    st.add_argument("--watch", action="store_true", help="refresh until interrupted")
    st.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes"
    )
    st.add_argument("--json", action="store_true", help="print /status as JSON")

    an = command(
        "analyze",
        "post-mortem of a vLLM log",
        "examples:\n  loadwatch analyze /var/log/vllm/vllm.log\n"
        "  loadwatch analyze vllm.log.2.gz --json\n  kubectl logs POD | loadwatch analyze -\n\n"
        "exit codes: 0 ready, 1 failed, 2 incomplete, 64 usage, 65 bad data, 66 no such log",
    )
    an.add_argument("log", type=Path, metavar="LOG", help="the log (plain or .gz)")
    an.add_argument(
        "--model-dir", type=Path, metavar="DIR", help="the checkpoint directory, for the verdicts"
    )
    an.add_argument("--json", action="store_true", help="the report as JSON (docs/analyze.md)")
    an.add_argument(
        "--max-record-bytes",
        type=int,
        default=65536,
        metavar="N",
        help="a longer record is cut to this many bytes",
    )

    ev = command(
        "events",
        "print the parsed events of a log as JSON lines",
        "example:\n  loadwatch events vllm.log | jq -c 'select(.type==\"failure\")'",
    )
    ev.add_argument("log", type=Path, metavar="LOG", help="the log (plain or .gz)")
    ev.add_argument(
        "--max-record-bytes",
        type=int,
        default=65536,
        metavar="N",
        help="a longer record is cut to this many bytes",
    )

    pf = command(
        "preflight",
        "check a model directory before starting vLLM",
        "examples:\n  loadwatch preflight /models/Kimi-K2.5-NVFP4 --gpu-cc 12.0\n"
        "  loadwatch preflight --gpu-model H100 -- vllm serve /models/M --max-model-len 131072\n"
        "With a command it prints the command it would run: supervise mode's remedies.\n\n"
        "exit codes: 0 ok, 1 will fail, 2 warnings, 64 usage, 65 a file of the directory that\n"
        "loadwatch will not read (not a regular file, over its size cap, nested too deep, a\n"
        "number out of range, a link out of the directory), 66 no such directory",
    )
    pf.add_argument("target", nargs="+", metavar="MODEL_DIR | -- COMMAND", help="what to check")
    pf.add_argument(
        "--kv-cache-dtype",
        type=_kv_dtype,
        metavar="DTYPE",
        help="the --kv-cache-dtype vLLM will be started with (default: auto)",
    )
    pf.add_argument(
        "--gpu-cc",
        metavar="X.Y",
        help="compute capability, e.g. 12.0 (default: --gpu-model's, else read by NVML)",
    )
    add_plan_flags(pf, _positive)
    pf.add_argument("--json", action="store_true", help="the report as JSON")

    pm = command(
        "patch-model",
        "drop the FP8 KV-cache declaration, or revert it",
        "examples:\n  loadwatch patch-model /models/M --drop-fp8-kv-cache --dry-run\n"
        "  loadwatch patch-model /models/M --drop-fp8-kv-cache\n"
        "  loadwatch patch-model /models/M --revert\n\n"
        "Writes are atomic, with byte-exact backups that --revert puts back; --revert refuses\n"
        "(exit 1) when a file changed after the patch, unless --force. A Hugging Face cache\n"
        "snapshot (snapshots/HASH) is patched in place of its links; no blob is written.",
    )
    pm.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="the checkpoint directory")
    what = pm.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--drop-fp8-kv-cache",
        action="store_true",
        help="remove kv_cache_quant_algo / kv_cache_scheme (the KV cache becomes bf16)",
    )
    what.add_argument("--revert", action="store_true", help="put the backed-up files back")
    pm.add_argument("--dry-run", action="store_true", help="print the diff and write nothing")
    pm.add_argument(
        "--force",
        action="store_true",
        help="with --revert: put the originals back even over edits made after the patch",
    )
    add_plan_flags(pm, _positive)  # what the patch does to the memory plan

    al = command(
        "alerts",
        "print the Prometheus alert rules with the runbooks' base URL set",
        "examples:\n"
        "  loadwatch alerts --runbook-base-url https://wiki.example.com/loadwatch \\\n"
        "      --output /etc/prometheus/rules/loadwatch.yml\n"
        "  loadwatch alerts --runbook-base-url file:///opt/loadwatch/share/docs\n\n"
        "Each alert's runbook_url becomes URL/runbook.md#<alert>.",
    )
    al.add_argument(
        "--runbook-base-url",
        required=True,
        metavar="URL",
        help="where docs/runbook.md is published (http, https or file URL)",
    )
    al.add_argument(
        "--rules",
        type=Path,
        metavar="FILE",
        help="the alert rules to fill in (default: the installed prometheus/alerts.yml)",
    )
    al.add_argument(
        "--output", type=Path, metavar="FILE", help="write here, atomically (default: stdout)"
    )

    inst = command(
        "install-files",
        "write the ops files that came with the package (units, alerts, dashboard, manifests)",
        "examples:\n  loadwatch install-files /opt/loadwatch/share\n\n"
        "DIR gets systemd/, prometheus/, grafana/, k8s/ and docs/. A file edited since is kept\n"
        "(exit 73) unless --force.",
    )
    inst.add_argument("dir", type=Path, metavar="DIR", help="where to write them")
    inst.add_argument("--force", action="store_true", help="overwrite files that differ")

    demo = command(
        "demo",
        "a simulated Kimi-K2.5 load, supervised: two starts, in about two minutes",
        "examples:\n  loadwatch demo\n  loadwatch demo --scenario oom --speed 30\n"
        "  loadwatch demo --real --keep\n\n"
        "The exit code is the post-mortem's verdict: 0 ready, 1 failed, 2 incomplete.",
    )
    demo.add_argument(
        "--scenario",
        default="success",
        choices=("success", "stall", "oom", "crash-loop", "fp8-kv-on-sm120"),
        help="what the simulated load does",
    )
    demo.add_argument(
        "--speed", type=_positive, default=15.0, metavar="X", help="how much faster than real time"
    )
    demo.add_argument("--real", action="store_true", help="real vLLM on the CPU with a tiny model")
    demo.add_argument(
        "--listen",
        type=_listen,
        default="127.0.0.1:9321",
        metavar="HOST:PORT",
        help="where the demo's daemon serves /metrics and /status",
    )
    fp8 = "fp8-kv-on-sm120: patch the checkpoint (put back at the end) or --kv-cache-dtype bfloat16"
    demo.add_argument("--remedy-fp8", choices=("patch", "flag"), default="patch", help=fp8)
    demo.add_argument("--no-screen", action="store_true", help="no live screen (logs only)")
    demo.add_argument(
        "--keep", action="store_true", help="keep the demo's directory (log, events, model)"
    )
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    tune_process()  # (for reading backlogs: tuning.py)
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        return fail(str(exc), EX_USAGE)
    except ModelFileError as exc:  # a checkpoint's file out of bounds (sources/model/modelfiles)
        return fail(str(exc), EX_DATAERR)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command is None:
        _parser().print_help(sys.stderr)
        return EX_USAGE
    if args.command == "run":
        from loadwatch.daemon.app import run_command

        return run_command(args)
    if args.command == "status":
        from loadwatch.exporters.terminal.watch import status_command

        urls = args.url or ["http://127.0.0.1:9321"]
        if len(urls) > 1:
            from loadwatch.exporters.terminal.fleet import fleet_command

            return fleet_command(
                urls, watch=args.watch, as_json=args.json, interval_s=args.interval
            )
        return status_command(
            urls[0], watch=args.watch, as_json=args.json, interval_s=args.interval
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
    if args.command in ("preflight", "patch-model"):
        from loadwatch.daemon.tools.plan_commands import patch_model_command, preflight_command

        return (preflight_command if args.command == "preflight" else patch_model_command)(args)
    if args.command == "alerts":
        from loadwatch.daemon.tools.alerts import alerts_command

        return alerts_command(args.runbook_base_url, args.rules, args.output)
    if args.command == "install-files":
        from loadwatch.daemon.tools.install_files import install_files_command

        return install_files_command(args.dir, force=args.force)
    if args.command == "demo":
        from loadwatch.daemon.tools.demo import demo_command

        return demo_command(args)
    raise UsageError(f"unknown command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
