"""The dispatch plan: hand-worked cases, padding, empty and hot experts, GPU traffic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megamoe.reference import InputError, plan_dispatch, rank_traffic


def test_hand_worked_plan():
    # token 0 -> experts 1, 0; token 1 -> 0, 2; token 2 -> 2, 1. Pairs p = t*K + k.
    p = plan_dispatch(np.array([[1, 0], [0, 2], [2, 1]]), 4, block_size=4)
    assert p.counts.tolist() == [2, 2, 2, 0]
    assert p.offsets.tolist() == [0, 2, 4, 6, 6]
    assert p.sorted_token.tolist() == [0, 1, 0, 2, 1, 2]
    assert p.sorted_pair.tolist() == [1, 2, 0, 5, 3, 4]
    assert p.pair_row.tolist() == [2, 0, 1, 4, 5, 3]
    assert p.padded_counts.tolist() == [4, 4, 4, 0]
    assert p.padded_token.tolist() == [0, 1, -1, -1, 0, 2, -1, -1, 1, 2, -1, -1]
    assert p.block_expert.tolist() == [0, 1, 2]
    assert p.experts_touched == 3
    assert p.rows_of(2).tolist() == [1, 2]


def test_zero_tokens():
    p = plan_dispatch(np.zeros((0, 3), np.int64), 5, block_size=16)
    assert p.num_pairs == 0 and p.counts.tolist() == [0] * 5 and p.num_padded_rows == 0
    assert p.block_expert.size == 0


def test_every_token_on_one_expert():
    T = 37
    p = plan_dispatch(np.full((T, 1), 3), 6, block_size=8)
    assert p.counts.tolist() == [0, 0, 0, T, 0, 0]
    assert p.sorted_token.tolist() == list(range(T))
    assert p.padded_counts[3] == 40 and (p.block_expert == 3).all()


@settings(max_examples=60, deadline=None)
@given(T=st.integers(0, 40), E=st.integers(1, 9), data=st.data())
def test_plan_invariants(T, E, data):
    K = data.draw(st.integers(1, E))
    block = data.draw(st.integers(1, 8))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    idx = np.stack([rng.permutation(E)[:K] for _ in range(T)]) if T else np.zeros((0, K), np.int64)
    p = plan_dispatch(idx, E, block_size=block)
    flat = idx.reshape(-1)
    # every pair appears exactly once, under its own expert, tokens ascending inside an expert
    assert sorted(p.sorted_pair.tolist()) == list(range(T * K))
    assert (flat[p.sorted_pair] == np.repeat(np.arange(E), p.counts)).all()
    for e in range(E):
        assert (np.diff(p.rows_of(e)) > 0).all()
    assert (p.pair_row[p.sorted_pair] == np.arange(T * K)).all()
    assert (p.padded_counts % block == 0).all() and (p.padded_counts - p.counts < block).all()
    real = p.padded_pair[p.padded_pair >= 0]
    assert sorted(real.tolist()) == list(range(T * K))
    # padded rows of a block belong to the block's expert
    rows_expert = np.repeat(p.block_expert, block)
    assert (flat[p.padded_pair[p.padded_pair >= 0]] == rows_expert[p.padded_pair >= 0]).all()


@pytest.mark.parametrize(
    "idx,E,block,message",
    [
        (np.array([[0, 4]]), 4, 1, r"topk_idx has value 4 outside \[0, 4\)"),
        (np.array([[-1, 0]]), 4, 1, "value -1 outside"),
        (np.array([[1, 1]]), 4, 1, r"row 0 names an expert twice: \[1, 1\]"),
        (np.array([[0.0, 1.0]]), 4, 1, "topk_idx must be an integer array"),
        (np.array([0, 1]), 4, 1, r"topk_idx must have shape \[\*, \*\]"),
        (np.array([[0, 1]]), 0, 1, "num_experts must be a positive integer, got 0"),
        (np.array([[0, 1]]), 4, 0, "block_size must be a positive integer, got 0"),
    ],
)
def test_bad_input_is_named(idx, E, block, message):
    with pytest.raises(InputError, match=message):
        plan_dispatch(idx, E, block_size=block)


def test_rank_traffic_hand_worked():
    # 2 GPUs, experts 0,1 on GPU 0 and 2,3 on GPU 1; tokens 0,1 on GPU 0, token 2 on GPU 1.
    idx = np.array([[0, 2], [2, 3], [1, 0]])
    token_rank = np.array([0, 0, 1])
    expert_rank = np.array([0, 0, 1, 1])
    dedup = rank_traffic(idx, token_rank, expert_rank, 2)
    # token 0 -> {0, 1}; token 1 -> {1} once (two experts there); token 2 -> {0} once
    assert dedup.tolist() == [[1, 2], [1, 0]]
    per_pair = rank_traffic(idx, token_rank, expert_rank, 2, dedup=False)
    assert per_pair.tolist() == [[1, 3], [2, 0]]
    assert per_pair.sum() == idx.size


def test_rank_traffic_bad_rank():
    with pytest.raises(InputError, match=r"expert_rank has value 2 outside \[0, 2\)"):
        rank_traffic(np.array([[0]]), np.array([0]), np.array([2]), 2)
