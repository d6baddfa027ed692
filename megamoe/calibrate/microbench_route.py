"""Routing-selection microbenchmark for ``megamoe calibrate`` (step "select").

Shape legend: BT tokens a routing program holds, E experts, BE = BLOCK_E, R rounds.

``_route_select_kernel``: one program routes R blocks of BT tokens from fp32 logits with
``routing._route_block``'s selection, weights and stores only; ``route_select`` launches it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from megamoe.kernels.plan import router_launch
from megamoe.kernels.routing import ROUTER_CODES, _route_block
from megamoe.reference.tiles import route_select_key


@triton.jit(do_not_specialize=["T", "rounds"])
def _route_select_kernel(part_ptr, rb_ptr, sb_ptr, topk_idx_ptr, topk_w_ptr, T, E, rounds, scaling,
                         ROUTER: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, N_GROUP: tl.constexpr,
                         TOPK_GROUP: tl.constexpr, PER_GROUP: tl.constexpr, MASK_NEG_INF: tl.constexpr,
                         HAS_RB: tl.constexpr, HAS_SB: tl.constexpr,
                         BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
                         BITONIC: tl.constexpr):
    for r in range(rounds):
        _route_block(part_ptr, part_ptr, rb_ptr, sb_ptr, part_ptr, part_ptr, part_ptr, topk_idx_ptr, topk_w_ptr,
                     part_ptr, r, T, E, E, E, E, scaling, 1, ROUTER, K, NORM, N_GROUP, TOPK_GROUP, PER_GROUP,
                     MASK_NEG_INF, HAS_RB, HAS_SB, False, False, BLOCK_T, BLOCK_E, 16, BLOCK_K, BLOCK_G, BITONIC)


def select_launch(config, tokens: int) -> dict:
    """The routing programs' sizes of a ``tokens``-token batch of ``config`` (plan.router_launch: BLOCK_T,
    BLOCK_E, warps, the top-k way), which the microbenchmark runs as the router would."""
    return router_launch(tokens, config.num_experts, config.hidden_size, config.top_k, config.n_group)


def select_key(config, tokens: int) -> tuple[float, ...]:
    """The table key of the routing program of a ``tokens``-token batch of ``config``
    (reference.tiles.route_select_key from select_launch)."""
    rl = select_launch(config, tokens)
    return route_select_key(ROUTER_CODES[config.router], rl["BLOCK_E"], config.top_k, config.n_group, rl["BLOCK_T"],
                            rl["BITONIC"])


def route_select(logits: torch.Tensor, config, tokens: int, rounds: int, *, rb=None, sb=None,
                 check: bool = False) -> torch.Tensor:
    """One program routes ``rounds`` blocks of ``logits`` (rounds x block_t, E) fp32 as the routing
    program of a ``tokens``-token batch of ``config`` -> topk_idx (rounds x block_t, K) int32.
    ``rb`` / ``sb``: router / score bias (E,). ``check``: softmax_topk picks equal torch.topk's."""
    T, E = logits.shape
    K = config.top_k
    rl = select_launch(config, tokens)  # the routing program's sizes, warps and top-k way
    block_t = rl["BLOCK_T"]
    if T != rounds * block_t or E != config.num_experts:
        raise ValueError(f"route_select: logits must be ({rounds * block_t}, {config.num_experts}), got {tuple(logits.shape)}")
    idx = torch.empty((T, K), device=logits.device, dtype=torch.int32)
    w = torch.empty((T, K), device=logits.device, dtype=torch.float32)
    _route_select_kernel[(1,)](
        logits, rb if rb is not None else logits, sb if sb is not None else logits, idx, w, T, E, rounds,
        float(config.routed_scaling_factor), ROUTER=ROUTER_CODES[config.router], K=K, NORM=bool(config.norm_topk_prob),
        N_GROUP=config.n_group, TOPK_GROUP=config.topk_group, PER_GROUP=E // config.n_group,
        MASK_NEG_INF=config.group_mask == "neg_inf", HAS_RB=rb is not None, HAS_SB=sb is not None, BLOCK_T=block_t,
        BLOCK_E=rl["BLOCK_E"], BLOCK_K=rl["BLOCK_K"], BLOCK_G=rl["BLOCK_G"], BITONIC=rl["BITONIC"], num_warps=rl["num_warps"])
    if check and config.router == "softmax_topk":
        want = torch.topk(logits, K, dim=1).indices.sort(dim=1).values
        if not torch.equal(idx.long().sort(dim=1).values, want):
            raise AssertionError("route_select: the picks differ from torch.topk's")
    return idx
