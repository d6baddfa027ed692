"""The cost model's choice of a layer's launch configs and of ``backend="auto"``'s backend.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, BM tile rows (BLOCK_M).

For a MoEConfig, T and a profile: every GEMM config of ``kernels.configs.candidates`` (the set
``megamoe tune`` times) is priced in the multi-launch plan of the layer (``kernels.plan.launch_plan``
with the candidate entry, ``simulator.cost.predict_launch_plan``) on ROUTINGS: the expected uniform
routing (T x K pairs spread as evenly as the experts allow) and the concentrated one (every token
on the same K experts); a candidate's price is the sum of the two, so that a config fast on spread
rows but several times slower when a few experts take the tokens (16-row tiles at T = 512) loses
to one good on both. The GEMMs are chosen as the tuner pairs them:
per BM, GEMM 1's candidates with a reference GEMM 2 (the candidate nearest the heuristic's), then
GEMM 2's with the best GEMM 1; the best pair over BM wins. The megakernel is priced the same way
through its task plan (``megamoe.predict.predict_config``) and taken where its price is lower.

Ties: predicted times within TIE_REL of the best are equal; among them the rule ``tie_key`` takes
the heuristic's own config (fewest fields differing from ``default_config``'s), then the lightest
(no split, fewer stages, fewer warps, narrower and shallower tiles, the pointer kernel), and the
multi-launch path over the megakernel. List order never decides.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

#: predicted times within this fraction of the best count as a tie (``tie_key`` decides)
TIE_REL = 1e-3
#: layers per CUDA-graph replay the predictions share the graph's fixed cost among (one: the layer alone)
CALLS_PER_GRAPH = 1
#: the megakernel's key in the backend choice
BACKENDS = ("multi", "megakernel")
#: the routings a candidate is priced on (its price: the sum of its times on them)
ROUTINGS = ("uniform", "concentrated")
#: the launch-plan stages ``megamoe tune`` times (each GEMM alone): ``Choice.gemm_us``
TIMED_STAGES = ("gemm1", "gemm1_act", "gemm2")


@dataclass(frozen=True)
class Choice:
    """The model's choice for one layer at T: ``entry`` {"gemm1", "gemm2"} and its predicted
    multi-launch us on the uniform routing; the megakernel's; ``backend``; ``price``: {backend:
    us summed over ROUTINGS}, what decided; ``ranking``: every priced entry [(price us, entry), ...]
    best first; ``terms``: the chosen plan's stages on the uniform routing {name: (us, bound term)}."""

    preset: str
    T: int
    profile: str
    entry: dict
    predicted_us: float
    megakernel_us: float | None
    backend: str
    ranking: list = field(default_factory=list, repr=False)
    terms: dict = field(default_factory=dict, repr=False)
    price: dict = field(default_factory=dict)

    @property
    def gemm_us(self) -> float:
        """The predicted us of the entry's TIMED_STAGES on the uniform routing (what the tuner times)."""
        return sum(us for stage, (us, _) in self.terms.items() if stage in TIMED_STAGES)

    @property
    def best_us(self) -> float:
        """The predicted time of the chosen backend."""
        return self.megakernel_us if self.backend == "megakernel" else self.predicted_us


def uniform_counts(E: int, T: int, K: int):
    """(E,) int64 pairs per expert of the expected uniform routing: T x K pairs, as even as possible
    (the first T x K mod E experts take one more)."""
    import numpy as np

    counts = np.full(E, (T * K) // E, dtype=np.int64)
    counts[: (T * K) % E] += 1
    return counts


def routing_counts(routing: str, E: int, T: int, K: int):
    """(E,) int64 pairs per expert of a ROUTINGS name: "uniform" (``uniform_counts``) or
    "concentrated" (T pairs on each of experts 0..K-1)."""
    import numpy as np

    if routing == "uniform":
        return uniform_counts(E, T, K)
    if routing == "concentrated":
        counts = np.zeros(E, dtype=np.int64)
        counts[: min(K, E)] = T
        return counts
    raise ValueError(f"routing must be one of {list(ROUTINGS)}, got {routing!r}")


_FIELDS = ("SPLIT_K", "num_stages", "num_warps", "BLOCK_N", "BLOCK_K", "GROUP_M", "FLATTEN")


def tie_key(cfg: dict, heuristic: dict) -> tuple:
    """The order among tied GEMM configs: fields differing from the heuristic's config, then the
    lightest (SPLIT_K, num_stages, num_warps, BLOCK_N, BLOCK_K, GROUP_M, FLATTEN ascending, pointer first)."""
    differ = sum(cfg.get(k) != heuristic.get(k) for k in set(cfg) | set(heuristic))
    return (differ, *(cfg.get(k, 0) for k in _FIELDS), cfg.get("variant") != "pointer")


def _pick(priced: list[tuple[float, dict]], heuristic: dict, gemm: str) -> tuple[float, dict]:
    """The best (us, entry) of ``priced``: the least us, ties (TIE_REL) by ``tie_key`` on ``gemm``."""
    best = min(us for us, _ in priced)
    tied = [(us, e) for us, e in priced if us <= best * (1 + TIE_REL)]
    return min(tied, key=lambda p: (tie_key(p[1][gemm], heuristic[gemm]), p[0]))


class _Pricer:
    """The multi-launch plan of one layer at T priced for a GEMM entry on ``routing`` (memoized per entry)."""

    def __init__(self, cfg, T: int, profile, dtype: str, routing: str = "uniform"):
        from megamoe.kernels import configs as cfgs

        self.cfg, self.T, self.profile, self.dtype = cfg, T, profile, dtype
        self.counts = routing_counts(routing, cfg.num_experts, T, cfg.top_k)
        self.shared = (cfgs.default_config(1, cfg.hidden_size, cfg.shared_intermediate_size, 1, T)
                       if cfg.num_shared_experts else None)
        self.memo: dict[str, tuple[float, dict]] = {}

    def __call__(self, entry: dict) -> float:
        return self.price(entry)[0]

    def price(self, entry: dict) -> tuple[float, dict]:
        from megamoe.kernels.plan import launch_plan
        from megamoe.simulator.cost import predict_launch_plan, term_name

        key = json.dumps(entry, sort_keys=True)
        if key not in self.memo:
            plan = launch_plan(self.cfg, self.T, counts=self.counts, dtype=self.dtype,
                               device_name=f"profile {self.profile.name}", triton_version="any",
                               num_sms=self.profile.num_sms, gemm=entry, shared_gemm=self.shared)
            pred = predict_launch_plan([s.to_dict() for s in plan.stages], self.profile,
                                       calls_per_graph=CALLS_PER_GRAPH)
            terms = {s["name"]: (s["time_us"], term_name(s["bound"], s.get("memory_term"))) for s in pred["stages"]}
            self.memo[key] = (float(pred["time_us"]), terms)
        return self.memo[key]


class _Prices:
    """An entry's price: its predicted us summed over ROUTINGS (a routing whose counts repeat an
    earlier one's, as at T = 1, counted once); ``memo`` {entry json: price} of those priced."""

    def __init__(self, cfg, T: int, profile, dtype: str):
        self.pricers, seen = [], []
        for r in ROUTINGS:
            p = _Pricer(cfg, T, profile, dtype, r)
            if not any((p.counts == q).all() for q in seen):
                self.pricers.append(p)
                seen.append(p.counts)
        self.memo: dict[str, float] = {}

    def __call__(self, entry: dict) -> float:
        key = json.dumps(entry, sort_keys=True)
        if key not in self.memo:
            self.memo[key] = sum(p(entry) for p in self.pricers)
        return self.memo[key]

    def uniform(self, entry: dict) -> tuple[float, dict]:
        """(us, terms) of ``entry`` on the uniform routing."""
        return self.pricers[0].price(entry)


def choose_entry(cfg, T: int, profile, *, dtype: str = "bfloat16") -> tuple[float, dict, list, dict, float]:
    """(predicted us on the uniform routing, entry, ranking, terms, price) of the multi-launch
    path's best candidate entry."""
    from megamoe.kernels import configs as cfgs

    E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    heur = cfgs.default_config(E, H, I, K, T)
    cands = cfgs.candidates(E, H, I, K, T, dtype=dtype)
    price = _Prices(cfg, T, profile, dtype)
    per_bm = []
    for bm in sorted({g["BLOCK_M"] for g in cands["gemm1"]} & {g["BLOCK_M"] for g in cands["gemm2"]}):
        g1s = [g for g in cands["gemm1"] if g["BLOCK_M"] == bm]
        g2s = [g for g in cands["gemm2"] if g["BLOCK_M"] == bm]
        ref2 = min(g2s, key=lambda g: tie_key(g, heur["gemm2"]))
        pass1 = [(price(e), e) for e in ({"gemm1": g, "gemm2": ref2} for g in g1s)]
        g1 = _pick(pass1, heur, "gemm1")[1]["gemm1"]
        pass2 = [(price(e), e) for e in ({"gemm1": g1, "gemm2": g} for g in g2s)]
        per_bm.append(_pick(pass2, heur, "gemm2"))
    ranking = sorted(((us, json.loads(k)) for k, us in price.memo.items()),
                     key=lambda p: (p[0], json.dumps(p[1], sort_keys=True)))
    best = _pick(per_bm, heur, "gemm1")
    us, terms = price.uniform(best[1])
    return us, best[1], ranking, terms, best[0]


def megakernel_us(cfg, T: int, profile, routing: str = "uniform") -> float:
    """The megakernel's predicted us for this layer at T on ``routing`` (a ROUTINGS name)."""
    from .predict import predict_config

    counts = routing_counts(routing, cfg.num_experts, T, cfg.top_k)
    return float(predict_config(cfg, counts, T, "megakernel", profile, device_name=f"profile {profile.name}",
                                calls_per_graph=CALLS_PER_GRAPH)["predicted_us"])


def megakernel_price(cfg, T: int, profile, beat: float = math.inf) -> tuple[float, float]:
    """(us on the uniform routing, price: us summed over ROUTINGS, as ``_Prices`` counts them);
    the sum stops once it reaches ``beat`` (a price it cannot then win against)."""
    seen, total, first = [], 0.0, None
    for r in ROUTINGS:
        counts = routing_counts(r, cfg.num_experts, T, cfg.top_k)
        if any((counts == q).all() for q in seen) or total >= beat:
            continue
        seen.append(counts)
        us = megakernel_us(cfg, T, profile, r)
        first = us if first is None else first
        total += us
    return first, total


def choose(cfg, T: int, profile, *, dtype: str = "bfloat16", megakernel: bool = True) -> Choice:
    """The model's entry and backend for layer ``cfg`` at T on ``profile`` (a name, path or Profile);
    ``megakernel``: also price the megakernel (False: "multi" without it)."""
    from megamoe.simulator.hardware import load_profile

    if T < 1:
        raise ValueError(f"choose: T must be >= 1, got {T}")
    prof = load_profile(profile)
    us, entry, ranking, terms, multi_price = choose_entry(cfg, T, prof, dtype=dtype)
    price = {"multi": multi_price}
    mk = None
    if megakernel:
        mk, price["megakernel"] = megakernel_price(cfg, T, prof, beat=multi_price)
    backend = "megakernel" if mk is not None and price["megakernel"] < multi_price * (1 - TIE_REL) else "multi"
    return Choice(cfg.name, T, prof.name, entry, us, mk, backend, ranking, terms, price)
