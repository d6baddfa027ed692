"""The validation grid: configurations (preset, T, routing, backend) and the inputs that steer each.
T tokens, E experts, K top-k, H hidden, NI inputs captured per CUDA graph."""

from __future__ import annotations

from dataclasses import dataclass

#: the default GPU run: 3 presets x 6 T x 3 routings x 2 backends = 108 configurations
GRID_PRESETS = "qwen3-30b-a3b,mixtral-8x7b,deepseek-v3"
GRID_TOKENS = (1, 8, 64, 512, 4096, 16384)
ROUTINGS = ("uniform", "zipf", "concentrated")
BACKENDS = ("multi", "megakernel")
#: the interpreter's shrunken layer: small, not tile multiples
CPU_SHAPE = dict(hidden_size=48, intermediate_size=40)


def calls_per_graph(T: int) -> int:
    """NI: fresh inputs (and calls) captured in one CUDA graph (kernels.bench.inputs_per_graph)."""
    from megamoe.kernels.bench import inputs_per_graph

    return inputs_per_graph(T)


@dataclass(frozen=True)
class Configuration:
    preset: str
    T: int
    routing: str
    backend: str

    @property
    def key(self) -> str:
        return f"{self.preset}/T={self.T}/{self.routing}/{self.backend}"

    def fields(self) -> dict:
        return {"preset": self.preset, "T": self.T, "routing": self.routing, "backend": self.backend}


def configurations(presets, tokens, routings, backends) -> list[Configuration]:
    """Every configuration, T-major: all presets, routings and backends at the first T, then the next."""
    return [Configuration(p, int(T), r, b) for T in tokens for p in presets for r in routings for b in backends]


def key_of(row: dict) -> str:
    return Configuration(row["preset"], int(row["T"]), row.get("routing", "uniform"), row.get("backend", "multi")).key


def routing_bias(cfg, routing: str, seed: int = 0):
    """(E,) logit bias steering the layer's router: 0 (uniform), Zipf(1.2)-like (zipf), or +30 on
    experts 0..K-1 (concentrated; one expert group, so grouped top-k keeps them)."""
    import numpy as np

    E, K = cfg.num_experts, cfg.top_k
    if routing == "uniform":
        return np.zeros(E)
    if routing == "zipf":
        rank = np.random.default_rng(seed).permutation(E) + 1
        return -1.2 * np.log(rank) * 2.0
    if routing == "concentrated":
        b = np.zeros(E)
        b[:K] = 30.0
        return b
    raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")


def steer_inputs(xs: list, router_weight, bias) -> tuple[list, object]:
    """Inputs x (T, H) and a copy of router_weight (E, H) that carry ``bias`` (E,) into the logits:
    x[:, 0] = 1 and W[:, 0] = bias. A zero bias changes nothing (no copies)."""
    import torch

    if not bias.any():
        return list(xs), router_weight
    w = router_weight.clone()
    w[:, 0] = torch.as_tensor(bias, device=w.device, dtype=torch.float32).to(w.dtype)
    out = []
    for x in xs:
        x = x.clone()
        x[:, 0] = 1.0
        out.append(x)
    return out, w


def shrink_for_interpreter(cfg):
    """The preset's layer at interpreter size: H = 48, I = 40, at most 16 experts and top-4."""
    return cfg.replace(**CPU_SHAPE, shared_intermediate_size=56 * cfg.num_shared_experts,
                       num_experts=min(cfg.num_experts, 16),
                       **({"n_group": min(cfg.n_group, 4), "topk_group": min(cfg.topk_group, 2)}
                          if cfg.n_group > 1 else {}),
                       top_k=min(cfg.top_k, 4))
