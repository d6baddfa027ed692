"""``megamoe compile``: fill Triton's disk cache before serving, so that no first call of a (backend, T)
pays for its compiles.

For each model (a preset, a megamoe config JSON or a HF config.json), T (default: the tuned buckets,
kernels.configs.T_BUCKETS; ranges A-B allowed), dtype (bf16, fp8, fp8-act) and backend (multi, megakernel),
one ``moe_forward`` call runs on random weights on the GPU. The calls go to processes of their own, one per
(model, tuned bucket of T), up to ``--procs`` at once within the GPU's free memory (megamoe.warm, the
machinery of ``megamoe validate``'s compile-ahead). Each call ends ok, error, crashed, hung, timeout or not
reached; the command exits 1 if any did not end ok. Some launch sizes follow T's exact value, not its bucket
(docs/kernels.md, "Cold start"): give ``--tokens`` every T you serve.

    megamoe compile --models qwen3-30b-a3b,deepseek-v3
    megamoe compile --models path/to/config.json --dtype bf16,fp8 --tokens 1-64,512 --backends megakernel
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .guards import MAX_BENCH_T, InputError

BACKENDS = ("multi", "megakernel")
#: token counts one command takes at most (each is one call per dtype and backend)
MAX_TOKENS = 2048


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", required=True, help="comma-separated presets, megamoe config JSON files or HF "
                   "config.json files")
    p.add_argument("--tokens", default=None, help="comma-separated token counts T and ranges A-B (default: the "
                   "tuned buckets 1,8,64,512,4096,16384)")
    p.add_argument("--dtype", default="bf16", help="comma-separated weight formats: bf16, fp8 (e4m3 weights), "
                   "fp8-act (e4m3 weights and activations); default bf16")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated of multi, megakernel (default "
                   "both: backend='auto' picks one of them)")
    p.add_argument("--procs", type=int, default=None, help="processes at once (default: the CPU cores)")
    p.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole compile (default 1800)")
    p.add_argument("--item-timeout", type=float, default=600.0, help="seconds one call may take (default 600)")
    p.add_argument("--cache-dir", default=None, help="Triton's cache folder to fill (default: TRITON_CACHE_DIR, "
                   "else Triton's own, ~/.triton/cache)")
    p.add_argument("--work-dir", default=None, help="folder for the jobs' files and logs (default: a new "
                   "temporary folder)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")


def _comma(text: str) -> list[str]:
    return [v.strip() for v in str(text).split(",") if v.strip()]


def parse_models(text: str) -> list:
    """[(name, MoEConfig)] of a comma-separated list of presets and config files: each layer once, names unique."""
    from .reference import MoEConfig

    out: list = []
    for spec in _comma(text):
        cfg = MoEConfig.load(spec)  # ConfigError names the bad preset or file
        if any(c == cfg for _, c in out):
            continue  # the same layer twice: once is enough
        name = spec if spec == cfg.name else (cfg.name or Path(spec).stem)
        while any(n == name for n, _ in out):
            name += "+"
        out.append((name, cfg))
    if not out:
        raise InputError(f"--models {text!r}: give at least one preset or config file")
    return out


def parse_tokens(text: str | None) -> list[int]:
    """The token counts of ``--tokens``: whole numbers in [1, MAX_BENCH_T] and ranges A-B (both ends
    included), at most MAX_TOKENS in all; the tuned buckets when None."""
    if text is None:
        from .kernels.configs import T_BUCKETS

        return list(T_BUCKETS)
    ts: set[int] = set()
    for v in _comma(text):
        lo, _, hi = v.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise InputError(f"--tokens {text!r}: must be comma-separated whole numbers or ranges A-B") from None
        if not 1 <= a <= b <= MAX_BENCH_T:
            raise InputError(f"--tokens {text!r}: {v!r}: each T must be in [1, {MAX_BENCH_T:,}], a range's start "
                             "at most its end")
        if b - a + len(ts) >= MAX_TOKENS:
            raise InputError(f"--tokens {text!r}: more than {MAX_TOKENS} token counts")
        ts.update(range(a, b + 1))
    if not ts:
        raise InputError(f"--tokens {text!r}: give at least one T")
    return sorted(ts)


def parse_choice(flag: str, text: str, allowed) -> list[str]:
    """A comma-separated subset of ``allowed``, in ``allowed``'s order."""
    got = _comma(text)
    bad = [v for v in got if v not in allowed]
    if bad or not got:
        raise InputError(f"{flag} {text!r}: give a comma-separated subset of {','.join(allowed)}"
                         + (f"; unknown: {','.join(bad)}" if bad else ""))
    return [v for v in allowed if v in got]


def plan_jobs(models, tokens, dtypes, backends, bytes_of: Callable) -> list:
    """warm.Jobs of (dtype, backend, T) items: one per model and tuned bucket of the T (kernels.configs.bucket_of:
    the T of a bucket share most kernels, so one process compiles them once), T ascending; largest memory
    first, then largest T. ``bytes_of(cfg, T, dtypes)`` estimates a job process's GPU memory."""
    from .kernels.configs import bucket_of
    from .warm import Job

    jobs = []
    for name, cfg in models:
        groups: dict[int, list[int]] = {}
        for T in sorted(tokens):
            groups.setdefault(bucket_of(T), []).append(T)
        for ts in groups.values():
            items = tuple((d, b, T) for T in ts for d in dtypes for b in backends)
            jobs.append(Job(name, ts[-1], items, float(bytes_of(cfg, ts[-1], dtypes)), task="compile",
                            model=json.dumps(cfg.to_dict(), sort_keys=True)))
    return sorted(jobs, key=lambda j: (-j.bytes, -j.T))


def job_bytes(layer_bytes: Callable, cfg, T: int, dtypes) -> float:
    """GPU memory of a compile process: ``layer_bytes(cfg, T)`` (layers.CudaLayer.job_bytes: bf16 weights,
    one forward's buffers, the context) plus the weights' FP8 copy where an FP8 dtype is asked."""
    from .reference.sizes import expert_bytes, shared_bytes

    fp8 = any(d != "bf16" for d in dtypes)
    return float(layer_bytes(cfg, T)) + (cfg.num_experts * expert_bytes(cfg, "fp8_e4m3")
                                         + shared_bytes(cfg, "fp8_e4m3") if fp8 else 0.0)


def gpu_free_bytes() -> float | None:
    """The first CUDA GPU's free memory, bytes; None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return float(torch.cuda.mem_get_info()[0])


def compile_ahead(jobs: list, *, budget_s: float, item_timeout_s: float, procs: int | None, memory_bytes: float,
                  folder: Path, seed: int = 0, cache_dir: str | None = None, log: Callable[[str], None] = print,
                  argv: Callable | None = None, layer_kind: str = "cuda") -> dict:
    """Run the jobs (warm.run_jobs) -> {"status": {key: status}, "details": {key: {"s", "compiles"}},
    "seconds": wall, "failed": [keys not ok]}. ``layer_kind`` "interpreter": the calls run on the CPU
    under TRITON_INTERPRET=1 (they compile nothing; the machinery is what runs)."""
    from . import warm

    t0 = time.monotonic()
    env = {"TRITON_CACHE_DIR": str(Path(cache_dir).resolve())} if cache_dir else None
    status = warm.run_jobs(jobs, folder=folder, layer_kind=layer_kind, seed=seed, procs=procs, memory_bytes=memory_bytes,
                           deadline=t0 + budget_s, config_timeout_s=item_timeout_s,
                           log=lambda s: log(f"[{time.monotonic() - t0:6.1f} s] {s}"),
                           argv=argv or warm.worker_argv, env=env, item_lines=True)
    saved = json.loads((Path(folder) / "warm_status.json").read_text())
    return {"status": status, "details": saved.get("details", {}), "seconds": round(time.monotonic() - t0, 1),
            "failed": [k for k, v in status.items() if v != "ok"]}


def print_result(result: dict, out=None) -> None:
    """One line per item (status, seconds, kernels compiled), then the totals (to ``out``, else stdout)."""
    out = out or sys.stdout
    for key, st in result["status"].items():
        d = result["details"].get(key, {})
        kernels = d.get("compiles") or []
        took = f"{d['s']:7.1f} s" if "s" in d else " " * 9
        print(f"{key:48s} {st[:90]:10s} {took}  {len(kernels)} kernels"
              + (f" ({sum(k[1] for k in kernels):.1f} s)" if kernels else ""), file=out)
    ok = sum(v == "ok" for v in result["status"].values())
    print(f"megamoe compile: {ok}/{len(result['status'])} ok in {result['seconds']:.1f} s", file=out, flush=True)


def run(args: argparse.Namespace, *, free_bytes: Callable[[], float | None] = gpu_free_bytes,
        argv: Callable | None = None) -> int:
    models = parse_models(args.models)
    tokens = parse_tokens(args.tokens)
    try:
        from .kernels.ceilings import DTYPES
    except ImportError as exc:
        print(f"megamoe compile: needs torch and triton on a CUDA GPU (pip install -e '.[gpu]'): {exc}",
              file=sys.stderr)
        return 2
    dtypes = parse_choice("--dtype", args.dtype, tuple(DTYPES))
    backends = parse_choice("--backends", args.backends, BACKENDS)
    for flag, v in (("--procs", args.procs), ("--budget", args.budget), ("--item-timeout", args.item_timeout)):
        if v is not None and not v > 0:
            raise InputError(f"{flag} {v}: must be > 0")
    free = free_bytes()
    if free is None:
        print("megamoe compile needs a CUDA GPU; found none", file=sys.stderr)
        return 2
    from .layers import CudaLayer

    layer = CudaLayer()
    jobs = plan_jobs(models, tokens, dtypes, backends, lambda cfg, T, dts: job_bytes(layer.job_bytes, cfg, T, dts))
    folder = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="megamoe-compile-"))
    cache = args.cache_dir or os.environ.get("TRITON_CACHE_DIR") or "Triton's default (~/.triton/cache)"
    n = sum(len(j.pairs) for j in jobs)
    print(f"megamoe compile: {n} calls ({len(models)} models x {len(tokens)} T x {len(dtypes)} dtypes x "
          f"{len(backends)} backends) into {cache}; jobs and logs in {folder}", flush=True)
    result = compile_ahead(jobs, budget_s=args.budget, item_timeout_s=args.item_timeout, procs=args.procs,
                           memory_bytes=0.9 * free, folder=folder, seed=args.seed, cache_dir=args.cache_dir,
                           log=lambda s: print(s, flush=True), argv=argv)
    print_result(result)
    if result["failed"]:
        print(f"megamoe compile: {len(result['failed'])} not ok; their logs are in {folder}", file=sys.stderr)
        return 1
    return 0
