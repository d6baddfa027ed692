"""The cost model's choice of a layer's launch configs and of ``backend="auto"``'s backend.

Shape legend: T tokens, E experts, K top-k, H hidden, I expert width, BM tile rows (BLOCK_M).

For a MoEConfig, T and a profile: every GEMM config of ``kernels.configs.candidates`` (the set
``megamoe tune`` times) is priced in the multi-launch plan of the layer (``kernels.plan.launch_plan``
with the candidate entry, ``simulator.cost.predict_launch_plan``) on the expected uniform routing
(T x K pairs spread as evenly as the experts allow). The GEMMs are chosen as the tuner pairs them:
per BM, GEMM 1's candidates with a reference GEMM 2 (the candidate nearest the heuristic's), then
GEMM 2's with the best GEMM 1; the best pair over BM wins. The megakernel is priced through its task
plan (``megamoe.predict.predict_config``) and taken where it is predicted faster than that pair.

Ties: predicted times within TIE_REL of the best are equal; among them the rule ``tie_key`` takes
the heuristic's own config (fewest fields differing from ``default_config``'s), then the lightest
(no split, fewer stages, fewer warps, narrower and shallower tiles, the pointer kernel), and the
multi-launch path over the megakernel. List order never decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: predicted times within this fraction of the best count as a tie (``tie_key`` decides)
TIE_REL = 1e-3
#: layers per CUDA-graph replay the predictions share the graph's fixed cost among (one: the layer alone)
CALLS_PER_GRAPH = 1
#: the megakernel's key in the backend choice
BACKENDS = ("multi", "megakernel")


@dataclass(frozen=True)
class Choice:
    """The model's choice for one layer at T: ``entry`` {"gemm1", "gemm2"} and its predicted
    multi-launch us; the megakernel's predicted us; ``backend``; ``ranking``: every priced entry
    [(us, entry), ...] best first; ``terms``: the chosen plan's stages {name: (us, bound term)}."""

    preset: str
    T: int
    profile: str
    entry: dict
    predicted_us: float
    megakernel_us: float | None
    backend: str
    ranking: list = field(default_factory=list, repr=False)
    terms: dict = field(default_factory=dict, repr=False)

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
    """The multi-launch plan of one layer at T priced for a GEMM entry (memoized per entry)."""

    def __init__(self, cfg, T: int, profile, dtype: str):
        from megamoe.kernels import configs as cfgs

        self.cfg, self.T, self.profile, self.dtype = cfg, T, profile, dtype
        self.counts = uniform_counts(cfg.num_experts, T, cfg.top_k)
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


def choose_entry(cfg, T: int, profile, *, dtype: str = "bfloat16") -> tuple[float, dict, list, dict]:
    """(predicted us, entry, ranking, terms) of the multi-launch path's best candidate entry."""
    from megamoe.kernels import configs as cfgs

    E, H, I, K = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k
    heur = cfgs.default_config(E, H, I, K, T)
    cands = cfgs.candidates(E, H, I, K, T, dtype=dtype)
    price = _Pricer(cfg, T, profile, dtype)
    per_bm = []
    for bm in sorted({g["BLOCK_M"] for g in cands["gemm1"]} & {g["BLOCK_M"] for g in cands["gemm2"]}):
        g1s = [g for g in cands["gemm1"] if g["BLOCK_M"] == bm]
        g2s = [g for g in cands["gemm2"] if g["BLOCK_M"] == bm]
        ref2 = min(g2s, key=lambda g: tie_key(g, heur["gemm2"]))
        pass1 = [(price(e), e) for e in ({"gemm1": g, "gemm2": ref2} for g in g1s)]
        g1 = _pick(pass1, heur, "gemm1")[1]["gemm1"]
        pass2 = [(price(e), e) for e in ({"gemm1": g1, "gemm2": g} for g in g2s)]
        per_bm.append(_pick(pass2, heur, "gemm2"))
    ranking = sorted(((us, json.loads(k)) for k, (us, _) in price.memo.items()),
                     key=lambda p: (p[0], json.dumps(p[1], sort_keys=True)))
    best = _pick(per_bm, heur, "gemm1")
    us, terms = price.price(best[1])
    return us, best[1], ranking, terms


def megakernel_us(cfg, T: int, profile) -> float:
    """The megakernel's predicted us for this layer at T on the expected uniform routing."""
    from .predict import predict_config

    counts = uniform_counts(cfg.num_experts, T, cfg.top_k)
    return float(predict_config(cfg, counts, T, "megakernel", profile, device_name=f"profile {profile.name}",
                                calls_per_graph=CALLS_PER_GRAPH)["predicted_us"])


def choose(cfg, T: int, profile, *, dtype: str = "bfloat16", megakernel: bool = True) -> Choice:
    """The model's entry and backend for layer ``cfg`` at T on ``profile`` (a name, path or Profile);
    ``megakernel``: also price the megakernel (False: "multi" without it)."""
    from megamoe.simulator.hardware import load_profile

    if T < 1:
        raise ValueError(f"choose: T must be >= 1, got {T}")
    prof = load_profile(profile)
    us, entry, ranking, terms = choose_entry(cfg, T, prof, dtype=dtype)
    mk = megakernel_us(cfg, T, prof) if megakernel else None
    backend = "megakernel" if mk is not None and mk < us * (1 - TIE_REL) else "multi"
    return Choice(cfg.name, T, prof.name, entry, us, mk, backend, ranking, terms)
