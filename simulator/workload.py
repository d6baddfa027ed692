"""Workloads: routings of T tokens and what they mean per GPU, through the reference's dispatch plan.

Shape legend: T = G * Tg tokens (Tg per GPU), E experts, P slots, K top-k, G GPUs, B minibatches
per GPU (mb tokens each, the last may be shorter).

Routings (``parse_routing`` reads the string form the CLI takes):
    uniform            every token picks K distinct experts uniformly
    skewed[:R]         Zipf popularity over a seeded permutation of the experts, exponent calibrated
                       (``calibrate_zipf``) so that the expected by-expert imbalance (max-mean)/mean
                       is R; R defaults to 10.9, TensorRT-LLM's DeepSeek-R1 figure without load
                       balancing (moe-models.md). Where E/K - 1 (the imbalance of a hottest expert
                       in every token) does not leave room for 10.9, the default is clamped to
                       ``default_skew(E, K)`` and ``resolve_routing`` says so
    zipf:S             the same with the exponent S given
    hot:F[:N]          N hot experts (default 1), each in a fraction F of the tokens; the rest uniform
    trace:FILE         expert ids per token from a file (``load_trace``: npz key ``topk_idx`` or CSV)
    router             the reference router (``reference.route``) on random inputs and random router
                       weights (slow for big T: it multiplies [T, H] by [H, E])
Sampling K distinct experts from a popularity p is successive sampling without replacement
(vectorized rejection of repeats), which is the Plackett-Luce / Gumbel-top-k distribution.

``build_workload`` places the experts, maps every (token, expert) pair to a slot, and takes the
rows per slot and the token movement from ``reference.plan_dispatch`` and ``reference.rank_traffic``.
"""

from __future__ import annotations

import csv
import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit

from megamoe.reference import MoEConfig

from .placement import Placement, assign_slots, make_placement

ROUTINGS = ("uniform", "skewed", "zipf", "hot", "trace", "router")
DEFAULT_SKEW_IMBALANCE = 10.9  # TensorRT-LLM, DeepSeek-R1 EP32 on GB200, by expert, no load balancing
MAX_MINIBATCHES = 64
#: the workload build's peak memory per token-expert pair, bytes (the size guard's estimate)
BUILD_BYTES_PER_PAIR = 110
#: the workload build's time per token-expert pair, s (the size guard's estimate)
BUILD_S_PER_PAIR = 4.5e-7
#: the reference router's time per token x hidden x expert, s (the size guard's estimate)
ROUTER_S_PER_THE = 1.1e-10


class TraceError(ValueError):
    """A routing trace file has a bad key, line or value; the message names the file and where."""


# ---------------------------------------------------------------------------- routing specs
@dataclass(frozen=True)
class RoutingSpec:
    kind: str
    value: float | None = None  # skewed: target imbalance; zipf: exponent; hot: fraction
    count: int = 1  # hot: number of hot experts
    path: str | None = None  # trace file
    default: bool = False  # skewed: R was not given (10.9, clamped per model by resolve_routing)

    def describe(self) -> str:
        if self.kind == "trace":
            return f"trace:{self.path}"
        if self.kind == "hot":
            return f"hot:{self.value:g}:{self.count}"
        return self.kind if self.value is None else f"{self.kind}:{self.value:g}"


def parse_routing(text: str | RoutingSpec) -> RoutingSpec:
    """'uniform' | 'skewed[:R]' | 'zipf:S' | 'hot:F[:N]' | 'trace:FILE' | 'router'."""
    if isinstance(text, RoutingSpec):
        return text
    kind, _, rest = str(text).partition(":")
    if kind not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS} (e.g. skewed:10.9, hot:0.5:2), got {text!r}")
    if kind == "trace":
        if not rest:
            raise ValueError("routing 'trace' needs a file: trace:PATH")
        return RoutingSpec("trace", path=rest)
    if kind in ("uniform", "router"):
        if rest:
            raise ValueError(f"routing {kind!r} takes no parameter, got {text!r}")
        return RoutingSpec(kind)
    parts = rest.split(":") if rest else []
    try:
        nums = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"routing {text!r}: parameters must be numbers") from None
    if kind == "skewed":
        r = nums[0] if nums else DEFAULT_SKEW_IMBALANCE
        if len(nums) > 1 or not r >= 0 or not math.isfinite(r):
            raise ValueError(f"routing {text!r}: skewed[:R] takes one imbalance ratio R >= 0")
        return RoutingSpec("skewed", r, default=not nums)
    if kind == "zipf":
        if len(nums) != 1 or nums[0] < 0:
            raise ValueError(f"routing {text!r}: zipf:S takes one exponent S >= 0")
        return RoutingSpec("zipf", nums[0])
    # hot
    if not 1 <= len(nums) <= 2 or not 0 <= nums[0] <= 1 or (len(nums) == 2 and (nums[1] < 1 or nums[1] % 1)):
        raise ValueError(f"routing {text!r}: hot:F[:N] takes a fraction F in [0, 1] and a count N >= 1")
    return RoutingSpec("hot", nums[0], int(nums[1]) if len(nums) == 2 else 1)


def default_skew(num_experts: int, top_k: int) -> float:
    """The default skewed imbalance for E experts and top-K: 10.9, or where E/K - 1 (a hottest
    expert in every token) is not above 11.9, max(limit - 1, limit / 2): as skewed as the model
    allows with the hottest expert short of every token (Mixtral 8/2: 2.0; gpt-oss-20b 32/4: 6.0)."""
    limit = num_experts / top_k - 1
    return min(DEFAULT_SKEW_IMBALANCE, max(limit - 1, limit / 2))


def resolve_routing(routing: str | RoutingSpec, config: MoEConfig) -> tuple[RoutingSpec, str | None]:
    """The routing as it will run for ``config``, and a note when the default skew was clamped."""
    spec = parse_routing(routing)
    if spec.kind != "skewed" or not spec.default:
        return spec, None
    E, K = config.num_experts, config.top_k
    r = default_skew(E, K)
    if r == spec.value:
        return spec, None
    note = (f"skewed routing: the default imbalance {DEFAULT_SKEW_IMBALANCE:g} is out of reach for {config.name} "
            f"(E={E}, K={K}: a hottest expert in every token gives {E / K - 1:g}); using skewed:{r:g} "
            f"(give skewed:R to choose)")
    return RoutingSpec("skewed", r), note


def estimate_build(config: MoEConfig, num_gpus: int, tokens_per_gpu: int, routing: str | RoutingSpec) -> dict:
    """What ``build_workload`` will take, roughly: {"pairs", "bytes", "seconds"} (see BUILD_*)."""
    T = int(num_gpus) * int(tokens_per_gpu)
    pairs = T * config.top_k
    s = pairs * BUILD_S_PER_PAIR
    if parse_routing(routing).kind == "router":
        s += T * config.hidden_size * config.num_experts * ROUTER_S_PER_THE
    return {"pairs": pairs, "bytes": pairs * BUILD_BYTES_PER_PAIR, "seconds": s}


def available_memory_bytes() -> float:
    """Memory this machine can give now (MemAvailable on Linux; else the physical size)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


# ---------------------------------------------------------------------------- popularity and sampling
def zipf_popularity(num_experts: int, exponent: float, seed: int) -> np.ndarray:
    """(E,) probabilities p_e proportional to rank^-exponent, ranks over a seeded permutation."""
    ranks = np.random.default_rng(seed).permutation(num_experts) + 1.0
    p = ranks ** (-float(exponent))
    return p / p.sum()


def expected_inclusion(p: np.ndarray, k: int) -> np.ndarray:
    """(E,) probability that a token picks each expert when drawing k of E without replacement.

    Hajek's approximation for successive sampling: pi_e = 1 - exp(-lam * p_e), lam such that
    sum pi = k.
    """
    lo, hi = 0.0, 1.0
    while (1 - np.exp(-hi * p)).sum() < k:
        hi *= 2
        if hi > 1e12:
            break
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if (1 - np.exp(-mid * p)).sum() < k:
            lo = mid
        else:
            hi = mid
    return 1 - np.exp(-hi * p)


def imbalance(loads) -> float:
    """(max - mean) / mean of a load vector (0 for an all-zero one)."""
    loads = np.asarray(loads, dtype=np.float64)
    m = loads.mean() if loads.size else 0.0
    return 0.0 if m <= 0 else float((loads.max() - m) / m)


def calibrate_zipf(num_experts: int, top_k: int, target_imbalance: float) -> float:
    """The Zipf exponent whose expected by-expert imbalance ratio is ``target_imbalance``.

    The expected imbalance does not depend on the permutation, so no seed is needed.
    """
    limit = num_experts / top_k - 1  # every token picks the hottest expert
    if not 0 <= target_imbalance < limit:
        raise ValueError(
            f"skewed routing: imbalance ratio {target_imbalance} must be in [0, {limit:g}) for "
            f"E={num_experts}, K={top_k} (at {limit:g} the hottest expert is in every token)"
        )
    ranks = np.arange(1, num_experts + 1, dtype=np.float64)

    def ratio(s: float) -> float:
        p = ranks ** -s
        return imbalance(expected_inclusion(p / p.sum(), top_k))

    lo, hi = 0.0, 1.0
    while ratio(hi) < target_imbalance:
        hi *= 2
        if hi > 64:
            raise ValueError(f"skewed routing: cannot reach imbalance {target_imbalance}")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if ratio(mid) < target_imbalance:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@njit(cache=True)
def _taken(out, t, j, e):
    """Whether expert e is among the first j choices of token t."""
    for i in range(j):
        if out[t, i] == e:
            return True
    return False


def sample_topk(p: np.ndarray, num_tokens: int, top_k: int, seed: int) -> np.ndarray:
    """(T, K) int64 distinct experts per token drawn without replacement with probabilities p (E,)."""
    p = np.asarray(p, dtype=np.float64)
    if np.count_nonzero(p > 0) < top_k:
        raise ValueError(f"popularity has {np.count_nonzero(p > 0)} experts with weight > 0, fewer than top_k={top_k}")
    return _sample_topk(np.cumsum(p), int(num_tokens), int(top_k), int(seed))


def _sample_topk(cum_p: np.ndarray, num_tokens: int, k: int, seed: int) -> np.ndarray:
    """(T, K) int64: K distinct experts per token, successive sampling by cumulative weights cum_p.

    Column by column, every token draws from p; the tokens whose draw repeats one of their earlier
    choices draw again (rejection: the draw is then from p without those, as successive sampling
    asks), in rounds over the tokens still drawing (``_place`` maps a round's draws to experts).
    """
    rng = np.random.default_rng(seed)
    E, T = cum_p.size, int(num_tokens)
    total = cum_p[E - 1]
    # inverse CDF through a table of 2^16 bins: a bin inside one expert's interval answers directly,
    # a bin across a boundary falls back to the binary search
    edges = np.linspace(0.0, total, (1 << 16) + 1)
    at = np.minimum(np.searchsorted(cum_p, edges, side="right"), E - 1)
    out = np.empty((T, k), np.int64)
    for j in range(k):
        todo = np.arange(T)  # tokens still drawing their choice j
        while todo.size:
            todo = _place(out, j, todo, rng.random(todo.size) * total, cum_p, at, (1 << 16) / total)
    return out


@njit(cache=True)
def _place(out, j, tokens, u, cum_p, at, scale):
    """Map the draws u (n,) of ``tokens`` (n,) to experts through the bin table ``at`` (bins + 1,)
    (u x scale is the bin) and make each the token's choice j unless it has that expert already;
    returns the tokens that draw again."""
    E, bins = cum_p.size, at.size - 1
    again = np.empty(tokens.size, np.int64)
    n = 0
    for i in range(tokens.size):
        t = tokens[i]
        b = min(np.int64(u[i] * scale), bins - 1)
        e = at[b]
        if e != at[b + 1]:  # the bin spans a boundary between experts
            e = min(np.searchsorted(cum_p, u[i], side="right"), E - 1)
        if _taken(out, t, j, e):
            again[n] = t
            n += 1
        else:
            out[t, j] = e
    return again[:n]


@njit(cache=True)
def _sample_hot(num_tokens, k, num_experts, hot, frac, seed):
    np.random.seed(seed)
    out = np.empty((num_tokens, k), np.int64)
    is_hot = np.zeros(num_experts, np.bool_)
    for h in hot:
        is_hot[h] = True
    for t in range(num_tokens):
        j = 0
        for h in hot:
            if j < k and np.random.random() < frac:
                out[t, j] = h
                j += 1
        while j < k:
            e = np.random.randint(0, num_experts)
            if is_hot[e]:
                continue
            if not _taken(out, t, j, e):
                out[t, j] = e
                j += 1
    return out


# ---------------------------------------------------------------------------- traces
def load_trace(path: str | Path, num_experts: int, top_k: int) -> np.ndarray:
    """(T, K) int64 expert ids from an npz (key ``topk_idx``) or a CSV (K ids per line, # comments)."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"trace file {str(path)!r} does not exist")
    if path.suffix == ".npz":
        try:
            z = np.load(path, allow_pickle=False)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise TraceError(f"{path}: is a single .npy array, not an .npz archive with a 'topk_idx' array")
            with z:
                if "topk_idx" not in z.files:
                    raise TraceError(f"{path}: no array named 'topk_idx' (found {sorted(z.files)})")
                a = z["topk_idx"]
        except TraceError:
            raise
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
            why = f" ({exc})" if isinstance(exc, OSError) else ""
            raise TraceError(f"{path}: not a readable .npz archive{why}; write one with "
                             f"numpy.savez(path, topk_idx=ids) (ids: [T, K] integers)") from None
        if a.dtype.kind not in "iu":
            raise TraceError(f"{path}: topk_idx must be integers, got dtype {a.dtype}")
        if a.ndim != 2 or a.shape[1] != top_k:
            raise TraceError(f"{path}: topk_idx must have shape [T, {top_k}], got {list(a.shape)}")
        a = a.astype(np.int64)
        bad = np.argwhere((a < 0) | (a >= num_experts))
        if bad.size:
            r, c = bad[0]
            raise TraceError(f"{path}: topk_idx[{r}, {c}]={a[r, c]} is outside [0, {num_experts})")
        s = np.sort(a, axis=1)
        dup = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0]
        if dup.size:
            raise TraceError(f"{path}: topk_idx row {dup[0]} names an expert twice: {a[dup[0]].tolist()}")
        return a
    if path.suffix not in (".csv", ".txt"):
        raise TraceError(f"{path}: trace files are .npz or .csv, got {path.suffix!r}")
    rows = []
    with path.open(newline="") as f:
        for lineno, line in enumerate(csv.reader(f), start=1):
            if not line or line[0].lstrip().startswith("#"):
                continue
            if len(line) != top_k:
                raise TraceError(f"{path} line {lineno}: expected {top_k} expert ids, got {len(line)}: {line}")
            try:
                ids = [int(x) for x in line]
            except ValueError:
                raise TraceError(f"{path} line {lineno}: expert ids must be integers, got {line}") from None
            for x in ids:
                if not 0 <= x < num_experts:
                    raise TraceError(f"{path} line {lineno}: expert id {x} is outside [0, {num_experts})")
            if len(set(ids)) != len(ids):
                raise TraceError(f"{path} line {lineno}: names an expert twice: {ids}")
            rows.append(ids)
    if not rows:
        raise TraceError(f"{path}: no token lines")
    return np.asarray(rows, dtype=np.int64)


def _router_topk(config: MoEConfig, num_tokens: int, seed: int, chunk: int = 2048,
                 progress: Callable[[str], None] | None = None) -> np.ndarray:
    from megamoe.reference import route

    rng = np.random.default_rng(seed)
    E, H = config.num_experts, config.hidden_size
    w = rng.standard_normal((E, H)) / math.sqrt(H)
    rb = rng.standard_normal(E) * 0.1 if config.router_bias else None
    sb = rng.standard_normal(E) * 0.01 if config.score_bias else None
    out = []
    step = max(chunk, -(-num_tokens // 10 // chunk) * chunk)  # about ten progress lines
    for s in range(0, num_tokens, chunk):
        x = rng.standard_normal((min(chunk, num_tokens - s), H))
        out.append(route(x, w, config, router_bias=rb, score_bias=sb).topk_idx)
        if progress and (s + chunk) % step == 0 and s + chunk < num_tokens:
            progress(f"routing with the reference router: {s + chunk:,} of {num_tokens:,} tokens")
    return np.concatenate(out) if out else np.zeros((0, config.top_k), np.int64)


def make_topk(config: MoEConfig, num_tokens: int, routing: str | RoutingSpec, seed: int,
              progress: Callable[[str], None] | None = None) -> np.ndarray:
    """(T, K) int64 expert ids for ``num_tokens`` tokens under ``routing`` (the default skew
    clamped per ``resolve_routing``)."""
    spec, _ = resolve_routing(routing, config)
    E, K = config.num_experts, config.top_k
    if spec.kind == "uniform":
        return sample_topk(np.full(E, 1.0 / E), num_tokens, K, seed)
    if spec.kind in ("skewed", "zipf"):
        s = calibrate_zipf(E, K, spec.value) if spec.kind == "skewed" else spec.value
        return sample_topk(zipf_popularity(E, s, seed), num_tokens, K, seed + 1)
    if spec.kind == "hot":
        if spec.count > K or spec.count >= E:
            raise ValueError(f"routing hot: N={spec.count} hot experts must be <= top_k={K} and < E={E}")
        if E - spec.count < K:
            raise ValueError(f"routing hot: too few cold experts ({E - spec.count}) to fill top_k={K}")
        hot = np.random.default_rng(seed).choice(E, spec.count, replace=False).astype(np.int64)
        return _sample_hot(int(num_tokens), K, E, hot, float(spec.value), int(seed) & 0xFFFFFFFF)
    if spec.kind == "trace":
        a = load_trace(spec.path, E, K)
        if a.shape[0] < num_tokens:
            raise TraceError(
                f"{spec.path}: has {a.shape[0]} tokens but the run needs {num_tokens} "
                f"(GPUs x tokens per GPU); lower --tokens-per-gpu"
            )
        return a[:num_tokens]
    return _router_topk(config, num_tokens, seed, progress=progress)


# ---------------------------------------------------------------------------- the workload
@dataclass(frozen=True)
class Workload:
    """One MoE layer's work on G GPUs.

    topk_idx: (T, K) expert ids; token_rank: (T,) GPU of each token (token t = g * Tg + i);
    slot_topk_idx: (T, K) slot ids; rows_slot_mb: (P, B) rows (pairs) per slot per minibatch (the
    dispatch plan's counts); traffic_mb: (G, B, G) tokens [src, minibatch, dst] (deduplicated per
    destination GPU, diagonal = tokens staying local: ``rank_traffic`` with dedup).
    pull_slot_mb: (P, B, G) tokens [slot, minibatch, src] that slot p's GPU pulls from src for p
    first: a token crosses once to a GPU, with the first of its slots there in slot order;
    push_slot_mb: (P, B, G) tokens [slot, minibatch, owner] whose partial sum on slot p's GPU is
    complete once p (the last of the token's slots there) is done. Summed over the slots of GPU d,
    both are ``traffic_mb[:, :, d]``.
    """

    config: MoEConfig
    num_gpus: int
    tokens_per_gpu: int
    minibatch: int
    routing: str
    placement: Placement
    topk_idx: np.ndarray
    token_rank: np.ndarray
    slot_topk_idx: np.ndarray
    rows_slot_mb: np.ndarray
    traffic_mb: np.ndarray
    pull_slot_mb: np.ndarray
    push_slot_mb: np.ndarray

    @property
    def num_minibatches(self) -> int:
        return self.rows_slot_mb.shape[1]

    @property
    def traffic(self) -> np.ndarray:
        """(G, G) tokens [src, dst] over the whole layer."""
        return self.traffic_mb.sum(axis=1)

    @property
    def rows_slot(self) -> np.ndarray:
        return self.rows_slot_mb.sum(axis=1)

    def expert_load(self) -> np.ndarray:
        """(E,) pairs per expert: the rows of its slots (every pair has one slot), without a pass over T x K."""
        return np.bincount(self.placement.slot_expert, weights=self.rows_slot,
                           minlength=self.config.num_experts).astype(np.int64)

    def gpu_load(self) -> np.ndarray:
        """(G,) pairs computed on each GPU."""
        return np.bincount(self.placement.slot_rank, weights=self.rows_slot, minlength=self.num_gpus).astype(np.int64)

    def imbalance(self) -> dict[str, float]:
        """(max - mean) / mean of pairs by GPU, by expert and by slot."""
        return {"by_gpu": imbalance(self.gpu_load()), "by_expert": imbalance(self.expert_load()),
                "by_slot": imbalance(self.rows_slot)}


def minibatch_count(tokens_per_gpu: int, minibatch: int | None) -> tuple[int, int]:
    """(tokens per minibatch, minibatches per GPU) for a requested minibatch size (None: one)."""
    if minibatch is not None and (isinstance(minibatch, bool) or int(minibatch) != minibatch or minibatch < 1):
        raise ValueError(f"minibatch must be a whole number of tokens >= 1, got {minibatch!r}")
    mb = tokens_per_gpu if minibatch is None else min(int(minibatch), tokens_per_gpu)
    nmb = -(-tokens_per_gpu // mb)
    if nmb > MAX_MINIBATCHES:
        raise ValueError(
            f"minibatch={minibatch} makes {nmb} minibatches per GPU; at most {MAX_MINIBATCHES} "
            f"(use minibatch >= {-(-tokens_per_gpu // MAX_MINIBATCHES)})"
        )
    return mb, nmb


def build_workload(config: MoEConfig, num_gpus: int, tokens_per_gpu: int, routing: str | RoutingSpec = "skewed",
                   placement: str | Placement = "contiguous", *, minibatch: int | None = None, seed: int = 0,
                   num_slots: int | None = None, num_nodes: int = 1, topk_idx: np.ndarray | None = None,
                   progress: Callable[[str], None] | None = None) -> Workload:
    """Route G * Tg tokens, place the experts, and read the per-GPU work off the dispatch plan.

    ``progress``, if given, is called with a line per stage (for long builds; see ``estimate_build``)."""
    def say(msg: str) -> None:
        if progress:
            progress(msg)

    if isinstance(tokens_per_gpu, bool) or int(tokens_per_gpu) != tokens_per_gpu or tokens_per_gpu < 1:
        raise ValueError(f"tokens_per_gpu must be a positive integer, got {tokens_per_gpu!r}")
    G, Tg = int(num_gpus), int(tokens_per_gpu)
    T, E = G * Tg, config.num_experts
    spec, _ = resolve_routing(routing, config)
    label = spec.describe()
    if topk_idx is None:
        say(f"routing {T:,} tokens ({label})")
        topk_idx = make_topk(config, T, spec, seed, progress=progress)
    else:
        label = "explicit topk_idx"
    topk_idx = np.asarray(topk_idx, dtype=np.int64)
    if topk_idx.shape != (T, config.top_k):
        raise ValueError(f"topk_idx must have shape [{T}, {config.top_k}], got {list(topk_idx.shape)}")
    token_rank = np.repeat(np.arange(G, dtype=np.int64), Tg)
    if isinstance(placement, Placement):
        pl = placement
    else:
        load = np.bincount(topk_idx.reshape(-1), minlength=E)
        pl = make_placement(placement, E, G, seed=seed, expert_load=load, num_slots=num_slots,
                            num_nodes=num_nodes, num_groups=config.n_group)
    say(f"placing {E} experts ({pl.policy}) and assigning {topk_idx.size:,} token-expert pairs to slots")
    slot_topk = assign_slots(topk_idx, token_rank, pl)
    mb, nmb = minibatch_count(Tg, minibatch)
    say("dispatch plan and GPU-to-GPU traffic")
    rows_slot_mb, traffic_mb, pull, push = slot_traffic(slot_topk, pl.slot_rank, G, Tg, mb, nmb)
    return Workload(config=config, num_gpus=G, tokens_per_gpu=Tg, minibatch=mb, routing=label,
                    placement=pl, topk_idx=topk_idx, token_rank=token_rank, slot_topk_idx=slot_topk,
                    rows_slot_mb=rows_slot_mb, traffic_mb=traffic_mb, pull_slot_mb=pull, push_slot_mb=push)


def slot_traffic(slot_topk: np.ndarray, slot_rank: np.ndarray, num_gpus: int, tokens_per_gpu: int,
                 minibatch: int, num_minibatches: int):
    """Counts of the dispatch plan without sorting the T x K pairs (token t lives on GPU t // Tg).

    slot_topk: (T, K) slot ids; slot_rank: (P,) GPU of each slot. Returns rows_slot_mb (P, B) (the
    counts of ``reference.plan_dispatch`` split by minibatch), traffic_mb (G, B, G) (``reference.
    rank_traffic`` with dedup), and pull_slot_mb, push_slot_mb (P, B, G) (see ``Workload``): a
    token's first and last slot on each GPU come from K x K comparisons of its own entries, in one
    pass over the tokens (``_slot_counts``).
    """
    return _slot_counts(np.ascontiguousarray(slot_topk, np.int64), np.ascontiguousarray(slot_rank, np.int64),
                        int(num_gpus), int(tokens_per_gpu), int(minibatch), int(num_minibatches))


@njit(cache=True)
def _slot_counts(slot_topk, slot_rank, num_gpus, tokens_per_gpu, minibatch, num_minibatches):
    T, K = slot_topk.shape
    P, G, B = slot_rank.size, num_gpus, num_minibatches
    rows = np.zeros((P, B), np.int64)
    pull = np.zeros((P, B, G), np.int64)
    push = np.zeros((P, B, G), np.int64)
    gpu = np.empty(K, np.int64)
    for t in range(T):
        src = t // tokens_per_gpu
        m = (t % tokens_per_gpu) // minibatch
        for j in range(K):
            gpu[j] = slot_rank[slot_topk[t, j]]
        for j in range(K):
            s = slot_topk[t, j]
            first = True  # no other of the token's slots on that GPU comes before it (ties: the later one is first)
            last = True  # none comes after it (ties: the earlier one is last)
            for i in range(K):
                if i == j or gpu[i] != gpu[j]:
                    continue
                o = slot_topk[t, i]
                if o < s or (o == s and i > j):
                    first = False
                if o > s or (o == s and i < j):
                    last = False
            rows[s, m] += 1
            if first:
                pull[s, m, src] += 1
            if last:
                push[s, m, src] += 1
    traffic = np.zeros((G, B, G), np.int64)  # [src, mb, dst]
    for s in range(P):
        for m in range(B):
            for g in range(G):
                traffic[g, m, slot_rank[s]] += pull[s, m, g]
    return rows, traffic, pull, push
