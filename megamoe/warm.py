"""Compile ahead, for ``megamoe validate`` and ``megamoe compile``: each job runs its items' kernels once
in a process of its own (``python -m megamoe.warm JOB.json``), up to ``procs`` at once within the GPU's free
memory, so that Triton's disk cache holds them before anything is timed or served. A job's task (TASKS)
says what an item is: "validate", a grid configuration's (routing, backend) at the job's T; "compile", a
(dtype, backend, T) call of ``moe_forward``. An item ends "ok", "error: ...", "crashed (exit N)",
"hung: ...", "timeout: ..." or "not reached"."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .grid import Configuration

MAX_PARTS = 2  # a job's items go to a new process at most this many times
TASKS = ("validate", "compile")


@dataclass(frozen=True)
class Job:
    preset: str  # the model's name (a preset's, or a config file's model for "compile")
    T: int  # "compile": its items' largest T
    pairs: tuple  # the items in run order: ((routing, backend), ...), or ((dtype, backend, T), ...) for "compile"
    bytes: float  # GPU memory its process needs, estimated
    part: int = 0  # > 0: the rest of a job whose process was killed
    task: str = "validate"  # one of TASKS
    model: str = ""  # "compile": the layer's MoEConfig as JSON (MoEConfig.to_dict)

    @property
    def name(self) -> str:
        safe = "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in self.preset)
        return f"{safe}_T{self.T}" + (f"_part{self.part}" if self.part else "")

    def keys(self) -> list[str]:
        return [item_key(self.task, self.preset, self.T, p) for p in self.pairs]


def item_key(task: str, preset: str, T: int, item) -> str:
    """An item's name: "preset/T=8/uniform/multi" (validate) or "preset/T=8/bf16/multi" (compile, its own T)."""
    if task == "compile":
        return f"{preset}/T={item[2]}/{item[0]}/{item[1]}"
    return Configuration(preset, T, item[0], item[1]).key


def plan_jobs(configs, bytes_of: Callable[[str, int], float]) -> list[Job]:
    """One job per (preset, T) of ``configs`` (grid.Configuration), largest memory first, then
    largest T (the slowest compiles); ``bytes_of(preset, T)`` estimates a job's GPU memory."""
    pairs: dict[tuple, list] = {}
    for c in configs:
        pairs.setdefault((c.preset, c.T), []).append((c.routing, c.backend))
    jobs = [Job(p, T, tuple(v), float(bytes_of(p, T))) for (p, T), v in pairs.items()]
    return sorted(jobs, key=lambda j: (-j.bytes, -j.T))


@dataclass
class _Running:
    job: Job
    proc: subprocess.Popen
    status_path: Path
    log: object
    started: float
    seen: int = 0  # status lines read so far
    current: str | None = None  # the configuration started and not ended
    current_since: float = 0.0
    done: list = field(default_factory=list)


def worker_argv(job_path: Path) -> list[str]:
    return [sys.executable, "-m", "megamoe.warm", str(job_path)]


def _kill(proc: subprocess.Popen) -> None:
    """Kill the job's process group (it was started in a session of its own) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_jobs(jobs: list[Job], *, folder: Path, layer_kind: str, seed: int, procs: int | None,
             memory_bytes: float, deadline: float, config_timeout_s: float, log: Callable[[str], None] = print,
             argv: Callable[[Path], list[str]] = worker_argv, poll_s: float = 0.25,
             env: dict | None = None, item_lines: bool = False) -> dict[str, str]:
    """Run the jobs until all end or ``deadline`` (time.monotonic) passes -> {item key: status} (also in
    ``folder/warm_status.json`` with each finished item's seconds and Triton compiles, beside the jobs'
    files and logs). ``env``: variables set for the job processes (e.g. TRITON_CACHE_DIR); ``item_lines``: a
    log line per item that ends, besides those of each job's start and end."""
    t0 = time.monotonic()
    s = _Scheduler(jobs, Path(folder), layer_kind, seed, max(1, procs or os.cpu_count() or 1), memory_bytes,
                   config_timeout_s, log, argv, env, item_lines)
    log(f"{len(jobs)} jobs ({len(s.status)} items) on up to {s.procs} processes and "
        f"{memory_bytes / 1e9:.0f} GB of GPU memory")
    try:
        while s.queue or s.running:
            now = time.monotonic()
            s.watch(now, deadline)
            if now > deadline:
                if s.queue:
                    log(f"deadline: {len(s.queue)} job(s) not started")
                break
            s.fill()
            time.sleep(poll_s)
    finally:  # an exception or a signal (SIGTERM) in the loop: no job process outlives it
        for r in list(s.running.values()):
            _kill(r.proc)
            s.end(r, "killed: the compile-ahead ended")
    counts: dict[str, int] = {}
    for v in s.status.values():
        kind = v.split(":")[0].split(" (")[0]  # "ok", "error", "crashed", "hung", "timeout", "not reached"
        counts[kind] = counts.get(kind, 0) + 1
    (s.folder / "warm_status.json").write_text(json.dumps({"seconds": round(time.monotonic() - t0, 1),
                                                            "counts": counts, "status": s.status,
                                                            "details": s.details}, indent=1))
    return s.status


class _Scheduler:
    """run_jobs' state: the queue, the running processes, each item's status and details."""

    def __init__(self, jobs, folder: Path, layer_kind: str, seed: int, procs: int, memory_bytes: float,
                 config_timeout_s: float, log, argv, env=None, item_lines: bool = False):
        self.folder, self.layer_kind, self.seed, self.procs = folder, layer_kind, seed, procs
        self.memory, self.timeout, self.log, self.argv = memory_bytes, config_timeout_s, log, argv
        self.env = None if not env else {**os.environ, **env}
        folder.mkdir(parents=True, exist_ok=True)
        self.status = {k: "not reached" for j in jobs for k in j.keys()}
        self.details: dict[str, dict] = {}  # key -> {"s": seconds, "compiles": [[kernel, s, digest, key parts], ...], "specs" (compile jobs): {digest: specialization}} of an item that ended
        self.item_lines = item_lines
        self.queue = list(jobs)
        self.running: dict[str, _Running] = {}

    def start(self, job: Job) -> None:
        status_path = self.folder / f"{job.name}.status.jsonl"
        status_path.write_text("")
        job_path = self.folder / f"{job.name}.json"
        job_path.write_text(json.dumps({"preset": job.preset, "T": job.T, "pairs": [list(p) for p in job.pairs],
                                        "seed": self.seed, "layer": self.layer_kind, "status": str(status_path),
                                        "task": job.task, "model": job.model}))
        fh = (self.folder / f"{job.name}.log").open("w")
        proc = subprocess.Popen(self.argv(job_path), stdout=fh, stderr=subprocess.STDOUT, cwd=os.getcwd(),
                                start_new_session=True, env=self.env)
        self.running[job.name] = _Running(job, proc, status_path, fh, time.monotonic())
        self.log(f"start {job.name}: {len(job.pairs)} items, ~{job.bytes / 1e9:.0f} GB")

    def fill(self) -> None:
        """Start queued jobs, in order, while a core is free and the memory holds them (at least one)."""
        while self.queue and len(self.running) < self.procs:
            used = sum(r.job.bytes for r in self.running.values())
            pick = next((j for j in self.queue if used + j.bytes <= self.memory), None)
            if pick is None and not self.running:
                pick = self.queue[0]  # one job alone even if the estimate says it does not fit
            if pick is None:
                return
            self.queue.remove(pick)
            self.start(pick)

    def read(self, r: _Running) -> None:
        lines = r.status_path.read_text().splitlines()
        for line in lines[r.seen:]:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:  # a line being written: read it next time
                break
            r.seen += 1
            key, what = ev.get("key"), ev.get("event")
            if what == "start":
                r.current, r.current_since = key, time.monotonic()
            elif what in ("ok", "error") and key in self.status:
                self.status[key] = "ok" if what == "ok" else f"error: {ev.get('error', '?')}"[:300]
                self.details[key] = {k: ev[k] for k in ("s", "compiles", "specs") if k in ev}
                r.done.append(key)
                if self.item_lines:
                    n = len(ev.get("compiles") or [])
                    self.log(f"{self.status[key][:120]}: {key} in {ev.get('s', '?')} s, {n} kernels compiled or loaded")
                r.current = None

    def watch(self, now: float, deadline: float) -> None:
        """Each running job: done, crashed, hung (killed, the rest requeued) or past the deadline (killed)."""
        for r in list(self.running.values()):
            self.read(r)
            rc = r.proc.poll()
            if rc is not None:
                self.read(r)
                if r.current is not None:
                    self.status[r.current] = f"crashed (exit {rc})"
                self.end(r, f"exit {rc}")
                if rc != 0:
                    self.requeue(r)
            elif r.current is not None and now - r.current_since > self.timeout:
                _kill(r.proc)
                self.status[r.current] = f"hung: no result after {self.timeout:.0f} s"
                self.end(r, f"killed: {r.current} hung")
                self.requeue(r)
            elif now > deadline:
                _kill(r.proc)
                if r.current is not None:
                    self.status[r.current] = "timeout: the compile-ahead's deadline came during it"
                self.end(r, "killed at the deadline")

    def end(self, r: _Running, why: str) -> None:
        r.log.close()
        del self.running[r.job.name]
        ok = sum(self.status[k] == "ok" for k in r.job.keys())
        self.log(f"end {r.job.name} ({why}): {ok}/{len(r.job.pairs)} ok in {time.monotonic() - r.started:.0f} s")

    def requeue(self, r: _Running) -> None:
        """The items a killed or failed process did not reach, in a new process (twice at most)."""
        rest = tuple(p for p, k in zip(r.job.pairs, r.job.keys()) if self.status[k] == "not reached")
        if rest and r.job.part < MAX_PARTS:
            self.queue.insert(0, Job(r.job.preset, r.job.T, rest, r.job.bytes, r.job.part + 1, r.job.task,
                                     r.job.model))


# --------------------------------------------------------------------------- the job's process
def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (no orphan job holds the GPU's memory)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def triton_compiles(specs: dict | None = None):
    """Yields a list to which each Triton kernel specialization first launched in the block appends
    [kernel name, seconds, specialization digest, key parts] (compiled, or loaded from the disk cache):
    Triton's JIT compile hooks. The digest (16 hex digits of the SHA-256 of Triton's serialized
    specialization: argument types, divisibility, constexprs, options; None where the hook gives none)
    tells two processes' specializations of a kernel apart; ``specs``, if given, gets {digest: the
    serialized specialization} to see how. The key parts are what else Triton's disk-cache key is made
    of (``_key_parts``), so that a cache miss with the same specialization can say which differs."""
    out: list = []
    try:
        from triton import knobs

        rt = knobs.runtime
        saved = rt.jit_cache_hook, rt.jit_post_compile_hook
    except (ImportError, AttributeError):  # a Triton without the hooks: nothing is recorded
        yield out
        return
    began: list[float] = []

    def before(**kw):
        began.append(time.monotonic())
        return False  # False: compile it

    def after(**kw):
        fn = kw.get("fn")
        data = (kw.get("compile") or {}).get("specialization_data")
        digest = hashlib.sha256(data.encode()).hexdigest()[:16] if isinstance(data, str) else None
        if specs is not None and digest is not None:
            specs[digest] = data
        out.append([getattr(fn, "name", "?"), round(time.monotonic() - (began.pop() if began else time.monotonic()), 2),
                    digest, _key_parts(kw)])
        return False

    rt.jit_cache_hook, rt.jit_post_compile_hook = before, after
    try:
        yield out
    finally:
        rt.jit_cache_hook, rt.jit_post_compile_hook = saved


def _key_parts(kw: dict) -> dict:
    """What Triton's disk-cache key holds besides the specialization (triton/compiler/compiler.py,
    ``get_cache_key``), from a post-compile hook's arguments, each part as 16 hex digits of a SHA-256:
    ``hash`` the key itself (the cache folder's name), ``source`` the kernel's ``cache_key`` (its code
    and the JIT functions and constexpr globals it uses), ``constants`` the constexpr values as the
    key prints them; ``env`` the cache-invalidating environment variables themselves. A part Triton
    does not give is left out."""
    def h(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    parts: dict = {}
    jf = getattr(kw.get("fn"), "jit_function", None)
    comp = kw.get("compile") or {}
    try:
        parts["hash"] = jf.device_caches[comp["device"]][0][kw["key"]].hash[:16]
    except Exception:  # noqa: BLE001 - another Triton's layout: the part is left out
        pass
    try:
        parts["source"] = h(jf.cache_key)
        parts["constants"] = h("-".join(v.cache_key if hasattr(v, "cache_key") else str(v)
                                        for _, v in sorted(comp["constants"].items())))
    except Exception:  # noqa: BLE001
        pass
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        parts["env"] = dict(sorted(get_cache_invalidating_env_vars().items()))
    except Exception:  # noqa: BLE001
        pass
    return parts


def _validate_job(job: dict, emit) -> int:
    """Run a "validate" job's grid configurations once each, routing first as the measuring process does."""
    from .layers import make_layer

    layer = make_layer(job["layer"])
    T, seed = int(job["T"]), int(job["seed"])
    cfg = layer.config(job["preset"])
    w = None
    inputs: dict = {}
    for routing, backend in job["pairs"]:
        key = item_key("validate", job["preset"], T, (routing, backend))
        emit(key=key, event="start")
        t = time.monotonic()
        try:
            with triton_compiles() as compiled:
                if w is None:
                    w = layer.weights(cfg, seed)
                if routing not in inputs:
                    xs, ws = layer.inputs(cfg, w, T, routing, seed, 1)
                    layer.routing(xs[0], ws, cfg)  # the measuring process routes first: the same kernels
                    inputs[routing] = (xs, ws)
                xs, ws = inputs[routing]
                layer.forward(xs[0], ws, cfg, backend)
                layer.sync()
            emit(key=key, event="ok", s=round(time.monotonic() - t, 2), compiles=compiled)
        except Exception as exc:  # noqa: BLE001 - recorded; the measuring process tries again
            emit(key=key, event="error", error=f"{type(exc).__name__}: {exc}"[:300], s=round(time.monotonic() - t, 2))
            if not layer.alive():
                print(f"warm: the CUDA context was lost at {key}; ending this job", file=sys.stderr, flush=True)
                return 3
    return 0


def _compile_job(job: dict, emit) -> int:
    """Run a "compile" job's (dtype, backend, T) items: one ``moe_forward`` call each on random weights of
    the job's layer (on the GPU; the "interpreter" layer: float32 on the CPU)."""
    from .layers import make_layer
    from .reference import MoEConfig

    layer = make_layer(job["layer"])
    seed = int(job["seed"])
    cfg = MoEConfig.from_dict(json.loads(job["model"]))
    held: dict = {}
    for dtype, backend, T in job["pairs"]:
        key = item_key("compile", job["preset"], T, (dtype, backend, T))
        emit(key=key, event="start")
        t = time.monotonic()
        try:
            specs: dict = {}
            with triton_compiles(specs) as compiled:
                _compile_call(layer, cfg, T, seed, dtype, backend, held)
                layer.sync()
            emit(key=key, event="ok", s=round(time.monotonic() - t, 2), compiles=compiled, specs=specs)
        except Exception as exc:  # noqa: BLE001 - recorded, and the job goes on
            emit(key=key, event="error", error=f"{type(exc).__name__}: {exc}"[:300], s=round(time.monotonic() - t, 2))
            if not layer.alive():
                print(f"compile: the CUDA context was lost at {key}; ending this job", file=sys.stderr, flush=True)
                return 3
    return 0


def _compile_call(layer, cfg, T: int, seed: int, dtype: str, backend: str, held: dict) -> None:
    """One ``moe_forward`` of ``cfg`` at T in ``dtype`` (kernels.ceilings.DTYPES) by ``backend``; ``held``
    keeps the weights (their FP8 copy made once from them) and the last T's x between a job's items."""
    import torch

    from .kernels import moe_forward
    from .kernels.ceilings import DTYPES
    from .kernels.fp8_weights import to_fp8

    fp8 = DTYPES[dtype]
    if "w" not in held:
        held["w"] = layer.weights(cfg, seed)
    if held.get("T") != T:
        gen = torch.Generator(device=layer.device).manual_seed(seed + T)
        held["x"] = torch.randn((T, cfg.hidden_size), generator=gen, device=layer.device, dtype=layer.dtype)
        held["T"] = T
    if fp8 is not None and "w8" not in held:
        held["w8"] = to_fp8(held["w"])
    w = held["w" if fp8 is None else "w8"]
    moe_forward(held["x"], w, cfg, backend=backend, fp8_activations=None if fp8 is None else fp8 == "weights+act")


def main(argv: list[str] | None = None) -> int:
    """Run one job file's items once each (``python -m megamoe.warm JOB.json``)."""
    argv = sys.argv[1:] if argv is None else argv
    _die_with_parent()
    job = json.loads(Path(argv[0]).read_text())
    with Path(job["status"]).open("a") as status:

        def emit(**ev) -> None:
            status.write(json.dumps(ev) + "\n")
            status.flush()

        task = job.get("task", "validate")
        if task not in TASKS:
            print(f"warm: the job's task must be one of {TASKS}, got {task!r}", file=sys.stderr, flush=True)
            return 2
        return (_compile_job if task == "compile" else _validate_job)(job, emit)


if __name__ == "__main__":  # pragma: no cover - run as a process by run_jobs
    sys.exit(main())
