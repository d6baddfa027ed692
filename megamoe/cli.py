"""The front door: ``megamoe info | simulate | bench | validate | sweep``; each subcommand imports its
room lazily (``megamoe simulate`` needs neither torch nor a GPU)."""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__


def make_console():
    """A rich console; wide enough for our tables when the output is a file or a pipe."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


def _assumptions(name: str) -> int:
    """``megamoe info --assumptions PROFILE``: the profile's numbers flagged as assumptions."""
    from rich.table import Table

    from megamoe.simulator.hardware import ProfileError, assumptions

    try:
        rows = assumptions(name)
    except ProfileError as exc:
        print(f"megamoe info: {exc}", file=sys.stderr)
        return 2
    table = Table(title=f"{name}: {len(rows)} numbers taken as assumptions (no measurement behind them)")
    for col in ("key", "value", "unit", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        v = r["value"]
        table.add_row(r["path"], f"{v:g}" if isinstance(v, (int, float)) else str(v), r["unit"], r["source"])
    make_console().print(table)
    return 0


def _profile_json(name: str) -> int:
    """``megamoe info --system PROFILE --json``: the profile as a JSON file ``--system`` loads back."""
    import json

    from megamoe.simulator.hardware import ProfileError, load_profile

    try:
        data = load_profile(name).data
    except ProfileError as exc:
        print(f"megamoe info: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(data, indent=1))
    return 0


def _info(args: argparse.Namespace) -> int:
    from rich.table import Table

    from megamoe.reference import PRESETS, MoEConfig

    if args.json and not args.system:
        print("megamoe info: error: --json prints a profile: give --system NAME (e.g. --system gb200-nvl72 --json "
              "> my-rack.json)", file=sys.stderr)
        return 2
    if args.system:
        return _profile_json(args.system)
    if args.assumptions is not None:
        return _assumptions(args.assumptions)
    console = make_console()
    console.print(f"[bold]megamoe[/bold] {__version__}  (python {sys.version.split()[0]})")
    versions = []
    for mod in ("numpy", "simpy", "networkx", "numba", "torch", "triton"):
        try:
            versions.append(f"{mod} {importlib.import_module(mod).__version__}")
        except Exception:  # noqa: BLE001 - any import failure means "not available"
            versions.append(f"{mod} -")
    console.print("  ".join(versions))
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            console.print(f"GPU: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
        else:
            console.print("GPU: none (Triton kernels run only under TRITON_INTERPRET=1)")
    except ImportError:
        console.print("GPU: torch not installed")
    table = Table(title="Model presets (one MoE layer)")
    for col in ("preset", "E", "K", "H", "I", "shared", "router", "activation", "GFLOP/token"):
        table.add_column(col, justify="right" if col not in ("preset", "router", "activation") else "left")
    for name in PRESETS:
        c = MoEConfig.preset(name)
        shared = f"{c.num_shared_experts}x{c.shared_intermediate_size // c.num_shared_experts}" if c.num_shared_experts else "-"
        table.add_row(name, str(c.num_experts), str(c.top_k), str(c.hidden_size), str(c.intermediate_size), shared,
                      c.router, c.activation, f"{c.flops_per_token() / 1e9:.3f}")
    console.print(table)
    try:
        from megamoe.simulator.hardware import list_profiles

        console.print("Hardware profiles: " + ", ".join(list_profiles()))
    except ImportError:
        pass
    return 0


def _delegate(module: str, what: str):
    """Load ``module`` (which has ``add_arguments(parser)`` and ``run(args)``), or explain why not."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        print(f"megamoe {what}: cannot load {module}: {exc}", file=sys.stderr)
        return None


SUBCOMMANDS = {
    # name: (module with add_arguments/run, one-line help)
    "simulate": ("megamoe.simulator.cli", "predict one MoE layer's time on a rack (SimPy model)"),
    "bench": ("megamoe.kernels.bench", "time the Triton kernels against the floor and PyTorch (needs a GPU)"),
    "validate": ("megamoe.validate", "run the kernel and the simulator on the same plan and compare"),
    "sweep": ("megamoe.sweep", "sweep simulator options over a grid on Dask, into Parquet, resumable"),
    "calibrate": ("megamoe.calibrate", "measure the cost model's numbers with microbenchmarks (needs a GPU)"),
    "compile": ("megamoe.compile", "compile the kernels ahead into Triton's disk cache, per model, T and backend "
                "(needs a GPU)"),
    "configure": ("megamoe.tune_tables", "write the cost model's launch-config tables for a profile (no GPU)"),
    "tune": ("megamoe.tune", "time the config candidates on this GPU; keep those that beat the model's choice"),
}


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the subcommand named ``load`` imports its room for its options."""
    parser = argparse.ArgumentParser(
        prog="megamoe", description="Design, predict and validate fused MoE megakernels for rack-scale GPU systems."
    )
    parser.add_argument("--version", action="version", version=f"megamoe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="versions, GPU, model presets and hardware profiles")
    p.add_argument("--assumptions", metavar="PROFILE", help="list the profile's numbers flagged as assumptions "
                   "(name or JSON file), with their sources")
    p.add_argument("--system", metavar="PROFILE", help="with --json: print the profile (name or JSON file) as JSON, "
                   "to edit and give back to --system, e.g. megamoe info --system gb200-nvl72 --json > my-rack.json")
    p.add_argument("--json", action="store_true", help="with --system: print the profile as JSON")
    p.set_defaults(func=_info)
    for name, (module, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(module=module, what=name)
        if name == load:
            mod = _delegate(module, name)
            if mod is not None:
                mod.add_arguments(p)
    return parser


#: The inputs that set a command's size, named when it runs out of memory.
SIZE_INPUTS = {"simulate": "--tokens-per-gpu, --slots or the --model's sizes",
               "sweep": "fewer grid points, --tokens-per-gpu or --slots",
               "validate": "--tokens, or the T of the --from-bench / --report rows",
               "bench": "--tokens", "calibrate": "--budget", "tune": "--presets or --tokens"}


def user_cache_dir() -> Path:
    """megamoe's cache folder: $XDG_CACHE_HOME/megamoe, else ~/.cache/megamoe."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "megamoe"


def _ours(exc: BaseException) -> bool:
    """Whether ``exc`` is one of the project's own input errors (ProfileError, TraceError,
    ConfigError, InputError, KernelInputError, ...): a ValueError defined in a megamoe module."""
    return isinstance(exc, ValueError) and any(
        c.__module__.startswith("megamoe.") for c in type(exc).__mro__ if issubclass(c, ValueError))


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand. The project's input errors, a failed allocation and Ctrl-C end in one line
    on stderr (exit code 2, 2 and 130) instead of a traceback; anything else is a bug and shows one."""
    from . import deadline

    deadline.mark_command_start()  # a --budget counts from here
    try:
        return _main(argv)
    finally:
        deadline.clear_command_start()


def _main(argv: Sequence[str] | None) -> int:
    one_shot = argv is None  # the process's own command line: it ends with this command
    argv = list(sys.argv[1:] if argv is None else argv)
    # numba's compiled kernels go to the user's cache, not the installed source tree (read when numba loads)
    os.environ.setdefault("NUMBA_CACHE_DIR", str(user_cache_dir() / "numba"))
    if one_shot:  # the modules the command imports live until exit: no cyclic collection while importing
        gc.disable()  # them, and none walks them later (gc.freeze); about 0.1 s of a ``megamoe simulate``
    parser = build_parser(load=argv[0] if argv and argv[0] in SUBCOMMANDS else None)
    if one_shot:
        gc.freeze()
        gc.enable()
    args = parser.parse_args(argv)
    if getattr(args, "command", None) is None:
        parser.print_help()
        return 0
    what = getattr(args, "what", args.command)
    try:
        from . import guards

        guards.check(what, args)
        if hasattr(args, "func"):
            return args.func(args)
        mod = _delegate(args.module, args.what)
        if mod is None:
            return 2
        rc = int(mod.run(args) or 0)
        if rc == 2 and what in ("bench", "calibrate") and guards.cuda_missing():
            print(f"megamoe {what}: {guards.CPU_ALTERNATIVES}", file=sys.stderr)
        return rc
    except KeyboardInterrupt:
        print(f"megamoe {what}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (``| head``): stop writing, quietly, as a Unix tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except MemoryError:
        print(f"megamoe {what}: error: out of memory; try a smaller size ({SIZE_INPUTS.get(what, 'smaller inputs')})",
              file=sys.stderr)
        return 2
    except RecursionError:
        print(f"megamoe {what}: error: an input is nested too deeply to read (JSON or TOML nesting)", file=sys.stderr)
        return 2
    except Exception as exc:
        if not _ours(exc):
            raise
        print(f"megamoe {what}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
