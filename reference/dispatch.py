"""The dispatch plan: which (token, slot) pair goes to which expert, in what order, on which GPU.

Shape legend: T tokens, E experts (or physical expert slots), K top-k, P padded rows, G GPUs.

A token t routed to experts topk_idx[t, 0..K-1] makes K *pairs*; pair p = t * K + k. The plan sorts
the pairs by (expert, token), a total order (a token picks an expert once), so it does not depend
on the order of a row's K choices. The padded view rounds each expert's rows up to a block (a tile
never mixes two experts), -1 in rows without a pair. The kernels' align must reproduce it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import InputError, as_index_array, check_distinct_rows


@dataclass(frozen=True)
class DispatchPlan:
    """Pairs sorted by expert; block_size 1 = no padding. All arrays int64:
    counts (E,) pairs per expert; offsets (E+1,): expert e owns sorted rows offsets[e]:offsets[e+1];
    sorted_token, sorted_pair (T*K,): token and pair t*K + k of each sorted row; pair_row (T*K,) its
    inverse; padded_counts (E,), padded_offsets (E+1,); padded_token, padded_pair (P,), -1 for
    padding; block_expert (P // block_size,) the expert of each block of padded rows.
    """

    num_tokens: int
    num_experts: int
    top_k: int
    block_size: int
    counts: np.ndarray
    offsets: np.ndarray
    sorted_token: np.ndarray
    sorted_pair: np.ndarray
    pair_row: np.ndarray
    padded_counts: np.ndarray
    padded_offsets: np.ndarray
    padded_token: np.ndarray
    padded_pair: np.ndarray
    block_expert: np.ndarray

    @property
    def num_pairs(self) -> int:
        return self.num_tokens * self.top_k

    @property
    def num_padded_rows(self) -> int:
        return int(self.padded_offsets[-1])

    @property
    def experts_touched(self) -> int:
        """Experts with at least one pair (their weights must be read)."""
        return int(np.count_nonzero(self.counts))

    def rows_of(self, expert: int) -> np.ndarray:
        """Token rows of one expert, ascending."""
        return self.sorted_token[self.offsets[expert] : self.offsets[expert + 1]]


def plan_dispatch(topk_idx, num_experts: int, block_size: int = 1) -> DispatchPlan:
    """Sort (token, slot) pairs by expert.  topk_idx: (T, K) ints in [0, num_experts)."""
    if isinstance(num_experts, bool) or not isinstance(num_experts, (int, np.integer)) or num_experts < 1:
        raise InputError(f"num_experts must be a positive integer, got {num_experts!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise InputError(f"block_size must be a positive integer, got {block_size!r}")
    num_experts, block_size = int(num_experts), int(block_size)
    idx = check_distinct_rows("topk_idx", as_index_array("topk_idx", topk_idx, (None, None), num_experts), "an expert")
    T, K = idx.shape
    flat = idx.reshape(-1)
    pairs = np.arange(T * K, dtype=np.int64)
    tokens = pairs // K if K else pairs
    # one stable sort of the key expert * T + token: by expert, then by token
    order = np.argsort(flat * max(T, 1) + tokens, kind="stable").astype(np.int64)
    counts = np.bincount(flat, minlength=num_experts).astype(np.int64)
    offsets = np.zeros(num_experts + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    pair_row = np.empty_like(order)
    pair_row[order] = np.arange(order.size, dtype=np.int64)

    padded_counts = -(-counts // block_size) * block_size
    padded_offsets = np.zeros(num_experts + 1, np.int64)
    np.cumsum(padded_counts, out=padded_offsets[1:])
    P = int(padded_offsets[-1])
    padded_pair = np.full(P, -1, np.int64)
    # row j of expert e (j < counts[e]) goes to padded_offsets[e] + j
    expert_of_row = np.repeat(np.arange(num_experts, dtype=np.int64), counts)
    dest = padded_offsets[expert_of_row] + (np.arange(order.size, dtype=np.int64) - offsets[expert_of_row])
    padded_pair[dest] = order
    padded_token = np.where(padded_pair >= 0, padded_pair // max(K, 1), -1)
    block_expert = np.repeat(np.arange(num_experts, dtype=np.int64), padded_counts // block_size)
    return DispatchPlan(
        num_tokens=T, num_experts=num_experts, top_k=K, block_size=block_size,
        counts=counts, offsets=offsets, sorted_token=tokens[order], sorted_pair=order,
        pair_row=pair_row, padded_counts=padded_counts, padded_offsets=padded_offsets,
        padded_token=padded_token, padded_pair=padded_pair, block_expert=block_expert,
    )


def rank_traffic(topk_idx, token_rank, expert_rank, num_ranks: int, *, dedup: bool = True) -> np.ndarray:
    """Token movement between GPUs for one dispatch: (G, G) int64, [src, dst] = tokens sent.

    topk_idx: (T, K) expert (or slot) ids; token_rank: (T,) the GPU each token starts on;
    expert_rank: (E,) the GPU each expert (slot) lives on. ``dedup``: a token goes to each GPU once
    (DeepEP's dispatch), else once per pair. The diagonal counts tokens that stay on their GPU.
    """
    expert_rank = np.asarray(expert_rank)
    if expert_rank.ndim != 1:
        raise InputError(f"expert_rank must be 1-D, got shape {list(expert_rank.shape)}")
    expert_rank = as_index_array("expert_rank", expert_rank, (None,), num_ranks)
    idx = as_index_array("topk_idx", topk_idx, (None, None), expert_rank.size)
    T, K = idx.shape
    token_rank = as_index_array("token_rank", token_rank, (T,), num_ranks)
    dst = expert_rank[idx]  # (T, K)
    if dedup:
        # a token counts once per destination: keep the first of equal ranks in each sorted row
        dst = np.sort(dst, axis=1)
        keep = np.ones(dst.shape, dtype=bool)
        keep[:, 1:] = dst[:, 1:] != dst[:, :-1]
    else:
        keep = np.ones(dst.shape, dtype=bool)
    cell = (token_rank[:, None] * num_ranks + dst)[keep]
    return np.bincount(cell, minlength=num_ranks * num_ranks).astype(np.int64).reshape(num_ranks, num_ranks)
