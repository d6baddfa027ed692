"""Checks of the command line's inputs before a command does any work: each bad input is refused
with one line (``InputError``; the CLI prints ``megamoe COMMAND: error: ...`` and exits 2)."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

#: Largest JSON, TOML or JSONL input read whole, bytes.
MAX_INPUT_BYTES = 256 * 2**20
#: Most tokens of one measured layer ``--from-bench`` predicts (megamoe bench measures up to 16384).
MAX_BENCH_T = 2**20


class InputError(ValueError):
    """A command-line value is refused before any work; the message names it and what is allowed."""


def _shown(value) -> str:
    return repr(str(value))


def check_text_file(flag: str, value, *, parse_json: bool = False, folder_ok: bool = False) -> None:
    """Refuse ``value`` (given to ``flag``) when it exists but is not a readable text file (a folder
    unless ``folder_ok``, a device, binary, too large) or, with ``parse_json``, nests too deep."""
    if value is None:
        return
    if not str(value).strip():
        raise InputError(f"{flag} {_shown(value)}: empty; give a name or a file path")
    p = Path(value)
    if not p.exists():
        return
    if p.is_dir():
        if folder_ok:
            return
        raise InputError(f"{flag} {_shown(value)} is a folder; give a file")
    if not p.is_file():
        raise InputError(f"{flag} {_shown(value)} is not a regular file (a device or a pipe); give a file")
    size = p.stat().st_size
    if size > MAX_INPUT_BYTES:
        raise InputError(f"{flag} {_shown(value)} is {size / 2**20:,.0f} MiB; an input file may have at most "
                         f"{MAX_INPUT_BYTES // 2**20} MiB")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\0" in text:
        raise InputError(f"{flag} {_shown(value)} is not a text file (binary or not UTF-8)")
    if parse_json:
        try:
            json.loads(text)
        except RecursionError:
            raise InputError(f"{flag} {_shown(value)}: JSON nested too deeply to read "
                             "(a profile or config nests a few levels)") from None
        except ValueError:
            pass  # not JSON: the loader says where


def check_writable(flag: str, value, *, folder: bool | None) -> None:
    """Refuse an output path that cannot be made: ``folder`` True wants a folder (an existing file
    is refused), False a file (an existing folder is refused), None either."""
    if value is None:
        return
    if not str(value).strip():
        raise InputError(f"{flag} {_shown(value)}: empty; give a path")
    p = Path(value)
    if folder is True and p.exists() and not p.is_dir():
        raise InputError(f"{flag} {_shown(value)} is a file; give a folder")
    if folder is False and p.is_dir():
        raise InputError(f"{flag} {_shown(value)} is a folder; give a file name")
    top = p if p.exists() else p.parent
    while not top.exists():
        top = top.parent
    if not top.is_dir():
        raise InputError(f"{flag} {_shown(value)} cannot be made: {str(top)!r} is not a folder")
    if not os.access(top, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {_shown(value)} cannot be written: no write permission in {str(top)!r}")


def _comma(value) -> list[str]:
    return [v.strip() for v in str(value).split(",")] if value is not None else []


def _positive(flag: str, value) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise InputError(f"{flag} {value}: must be a positive number")


def check_validate(args: argparse.Namespace) -> None:
    """``megamoe validate``'s options, on any machine, before it looks for a GPU."""
    from .validate import BACKENDS, ROUTINGS

    if args.report and args.from_bench:
        raise InputError("--report rebuilds a report from stored validation rows and --from-bench predicts bench "
                         "rows: give one of them")
    check_text_file("--report", args.report, folder_ok=True)
    check_text_file("--from-bench", args.from_bench)
    check_bench_sizes(args.from_bench)
    check_text_file("--counts-from", args.counts_from, folder_ok=True)
    for flag in ("--profile", "--repredict", "--system"):
        check_text_file(flag, getattr(args, flag[2:].replace("-", "_")), parse_json=True)
    for flag, given, allowed in (("--routings", args.routings, ROUTINGS), ("--backends", args.backends, BACKENDS)):
        bad = [r for r in _comma(given) if r not in allowed]
        if bad or not any(_comma(given)):
            raise InputError(f"{flag} {given!r}: give a comma-separated subset of {','.join(allowed)}")
    _positive("--budget", args.budget)
    _positive("--config-timeout", args.config_timeout)
    if not args.idle_before >= 0:
        raise InputError(f"--idle-before {args.idle_before}: must be >= 0 seconds")
    for flag, v in (("--reps", args.reps), ("--warm-procs", args.warm_procs)):
        if v is not None and v < 1:
            raise InputError(f"{flag} {v}: must be >= 1")
    # --report and the GPU run (or --scale) write a folder; --from-bench and the CPU run append to a JSONL file
    folder = True if args.report else (False if args.from_bench else None)
    if folder is None and args.out is not None and Path(args.out).is_dir() and not args.scale:
        from .validate import _has_cuda

        folder = True if _has_cuda() else False
    check_writable("--out", args.out, folder=folder)


def check_bench_sizes(path) -> None:
    """Refuse a ``--from-bench`` row whose T no single GPU's layer holds, naming the file and line."""
    if path is None or not Path(path).is_file():
        return
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            r = json.loads(line)
        except (ValueError, RecursionError):
            continue  # the command names lines that are not JSON
        T = r.get("T") if isinstance(r, dict) else None
        if isinstance(T, (int, float)) and not isinstance(T, bool) and T > MAX_BENCH_T:
            raise InputError(f"--from-bench {path}:{n}: T={T:,} tokens; a measured layer has at most "
                             f"{MAX_BENCH_T:,}")


def check_simulate(args: argparse.Namespace) -> None:
    check_text_file("--model", args.model, parse_json=True, folder_ok=True)  # the loaders name a folder
    check_text_file("--system", args.system, parse_json=True, folder_ok=True)


def check_sweep(args: argparse.Namespace) -> None:
    check_text_file("SPEC", args.spec)
    for flag in ("model", "system"):
        for v in _comma(getattr(args, flag, None)):
            check_text_file(f"--{flag}", v, parse_json=True)
    if not args.best:
        check_writable("--out", args.out, folder=True)


def check_info(args: argparse.Namespace) -> None:
    if args.assumptions is not None:
        check_text_file("--assumptions", args.assumptions, parse_json=True)
    if args.system is not None:
        check_text_file("--system", args.system, parse_json=True)


CHECKS = {"validate": check_validate, "simulate": check_simulate, "sweep": check_sweep, "info": check_info}


def check(command: str, args: argparse.Namespace) -> None:
    """Raise ``InputError`` for the first refused value of ``command``'s arguments."""
    fn = CHECKS.get(command)
    if fn is not None:
        fn(args)


#: What a machine without a GPU can run instead of a command that needs one.
CPU_ALTERNATIVES = ("on a CPU: `megamoe simulate` (a layer's time on a rack), `megamoe sweep` (grids of it), "
                    "`megamoe validate` (the kernels under the Triton interpreter against the reference, with "
                    "predictions), `megamoe validate --report DIR` or `--from-bench FILE` (stored measurements "
                    "against the model)")


def cuda_missing() -> bool:
    """True when torch is loaded and sees no CUDA device (the GPU commands have imported it)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return not torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken CUDA install is "no GPU" too
        return True
