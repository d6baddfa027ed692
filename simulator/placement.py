"""Expert placement: which physical expert slot holds which expert, on which GPU.

Shape legend: E experts, P physical slots (P >= E; P > E means redundant replicas), G GPUs,
T tokens, K top-k.

Policies:
    contiguous   slot s = expert s on GPU floor(s * G / E) (EP's default)
    round_robin  expert e on GPU e % G
    random       a seeded permutation of experts, then contiguous
    eplb         DeepSeek's EPLB (deepseek-ai/EPLB, eplb.py), hierarchical: pack expert groups onto
                 nodes by load; inside each node, give each redundant slot to the expert with the
                 highest load per replica; pack the replicas onto the node's GPUs by load, the same
                 number of slots on each GPU. With one node (an NVL72 rack) it is the global pass.

``assign_slots`` turns expert ids into slot ids per (token, expert) pair: a replica on the token's
own GPU if there is one, else replica number ``token % replicas`` (round-robin by token).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICIES = ("contiguous", "round_robin", "random", "eplb")


@dataclass(frozen=True)
class Placement:
    """slot_expert: (P,) int64 expert of each slot; slot_rank: (P,) int64 GPU of each slot."""

    policy: str
    num_experts: int
    num_gpus: int
    slot_expert: np.ndarray
    slot_rank: np.ndarray

    @property
    def num_slots(self) -> int:
        return int(self.slot_expert.size)

    def replicas(self) -> np.ndarray:
        """(E,) int64 replicas per expert."""
        return np.bincount(self.slot_expert, minlength=self.num_experts)

    def slots_per_gpu(self) -> np.ndarray:
        return np.bincount(self.slot_rank, minlength=self.num_gpus)


def contiguous(num_experts: int, num_gpus: int) -> Placement:
    s = np.arange(num_experts, dtype=np.int64)
    return Placement("contiguous", num_experts, num_gpus, s, s * num_gpus // num_experts)


def round_robin(num_experts: int, num_gpus: int) -> Placement:
    s = np.arange(num_experts, dtype=np.int64)
    return Placement("round_robin", num_experts, num_gpus, s, s % num_gpus)


def random_placement(num_experts: int, num_gpus: int, seed: int) -> Placement:
    perm = np.random.default_rng(seed).permutation(num_experts).astype(np.int64)
    s = np.arange(num_experts, dtype=np.int64)
    return Placement("random", num_experts, num_gpus, perm, s * num_gpus // num_experts)


def default_num_slots(num_experts: int, num_gpus: int) -> int:
    """E plus about 1/8 redundant, rounded up to a multiple of G (DeepSeek-V3 on 72 GPUs: 288)."""
    return max(num_gpus, -(-(num_experts + num_experts // 8) // num_gpus) * num_gpus)


def _balanced_packing(weight: np.ndarray, num_packs: int) -> np.ndarray:
    """EPLB's balanced_packing: (n,) weights -> (n,) pack ids, n / num_packs items per pack.

    Heaviest first, each to the lightest pack that still has room (ties to the lower pack id).
    """
    n = weight.size
    per = n // num_packs
    pack = np.empty(n, np.int64)
    load = np.zeros(num_packs)
    count = np.zeros(num_packs, np.int64)
    for i in np.argsort(-weight, kind="stable"):
        room = np.nonzero(count < per)[0]
        p = room[np.argmin(load[room])]
        pack[i] = p
        load[p] += weight[i]
        count[p] += 1
    return pack


def _replicate(weight: np.ndarray, num_phy: int) -> np.ndarray:
    """EPLB's replicate_experts: (n,) loads -> (num_phy,) logical expert of each physical slot."""
    n = weight.size
    phy = np.concatenate([np.arange(n), np.zeros(num_phy - n, np.int64)]).astype(np.int64)
    cnt = np.ones(n, np.int64)
    for i in range(n, num_phy):
        j = int(np.argmax(weight / cnt))
        phy[i] = j
        cnt[j] += 1
    return phy


def eplb(expert_load, num_gpus: int, num_slots: int | None = None, *, num_nodes: int = 1,
         num_groups: int = 1) -> Placement:
    """EPLB hierarchical placement from a load estimate: expert_load (E,) tokens per expert."""
    w = np.asarray(expert_load, dtype=np.float64)
    E = w.size
    P = default_num_slots(E, num_gpus) if num_slots is None else int(num_slots)
    if P < E or P % num_gpus:
        raise ValueError(f"eplb: num_slots={P} must be >= num_experts={E} and a multiple of num_gpus={num_gpus}")
    if num_gpus % num_nodes or P % num_nodes:
        raise ValueError(f"eplb: num_nodes={num_nodes} must divide num_gpus={num_gpus} and num_slots={P}")
    if num_nodes > 1 and (E % num_groups or num_groups % num_nodes):
        num_groups = num_nodes  # fall back to one group per node's share of experts
    groups = num_groups if num_nodes > 1 else 1
    gpn = num_gpus // num_nodes
    # 1. groups of experts onto nodes
    group_of = np.arange(E) // (E // groups)
    node_of_group = _balanced_packing(np.bincount(group_of, weights=w, minlength=groups), num_nodes)
    slot_expert, slot_rank = [], []
    for node in range(num_nodes):
        experts = np.nonzero(node_of_group[group_of] == node)[0]
        phy = _replicate(w[experts], P // num_nodes)  # local index
        cnt = np.bincount(phy, minlength=experts.size)
        gpu_local = _balanced_packing(w[experts][phy] / cnt[phy], gpn)
        order = np.lexsort((np.arange(phy.size), gpu_local))  # slots ordered by GPU
        slot_expert.append(experts[phy[order]])
        slot_rank.append(node * gpn + gpu_local[order])
    return Placement("eplb", E, num_gpus, np.concatenate(slot_expert).astype(np.int64),
                     np.concatenate(slot_rank).astype(np.int64))


def make_placement(policy: str, num_experts: int, num_gpus: int, *, seed: int = 0, expert_load=None,
                   num_slots: int | None = None, num_nodes: int = 1, num_groups: int = 1) -> Placement:
    if policy == "contiguous":
        return contiguous(num_experts, num_gpus)
    if policy == "round_robin":
        return round_robin(num_experts, num_gpus)
    if policy == "random":
        return random_placement(num_experts, num_gpus, seed)
    if policy == "eplb":
        if expert_load is None:
            raise ValueError("eplb placement needs expert_load (E,)")
        return eplb(expert_load, num_gpus, num_slots, num_nodes=num_nodes, num_groups=num_groups)
    raise ValueError(f"placement must be one of {POLICIES}, got {policy!r}")


def assign_slots(topk_idx: np.ndarray, token_rank: np.ndarray, placement: Placement) -> np.ndarray:
    """(T, K) expert ids -> (T, K) slot ids: the token's own GPU's replica, else round-robin by token."""
    E, G, P = placement.num_experts, placement.num_gpus, placement.num_slots
    if P == E and np.array_equal(np.sort(placement.slot_expert), np.arange(E)):
        slot_of = np.empty(E, np.int64)
        slot_of[placement.slot_expert] = np.arange(E)
        return slot_of[topk_idx]
    order = np.argsort(placement.slot_expert, kind="stable")  # slots grouped by expert
    nrep = placement.replicas()
    if (nrep == 0).any():
        raise ValueError(f"placement {placement.policy!r} leaves expert {int(np.argmin(nrep))} without a slot")
    first = np.concatenate([[0], np.cumsum(nrep)[:-1]])
    T = topk_idx.shape[0]
    tok = np.arange(T, dtype=np.int64)[:, None]
    slot = order[first[topk_idx] + tok % nrep[topk_idx]]
    local = np.full((E, G), -1, np.int64)
    local[placement.slot_expert[order[::-1]], placement.slot_rank[order[::-1]]] = order[::-1]  # lowest slot wins
    own = local[topk_idx, token_rank[:, None]]
    return np.where(own >= 0, own, slot)
