"""The align kernels (sort and pad pairs by expert) against reference.plan_dispatch, exactly.

On the ``device`` fixture: CUDA where there is a GPU, else CPU tensors under the Triton interpreter
(tests/conftest.py sets TRITON_INTERPRET=1 without a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import plan_dispatch

pytestmark = pytest.mark.interpret


def _random_topk(rng, T, E, K):
    return np.stack([rng.permutation(E)[:K] for _ in range(T)]) if T else np.zeros((0, K), np.int64)


@pytest.mark.parametrize(
    "T,E,K,block_m",
    [
        (0, 7, 3, 16),  # no tokens
        (1, 7, 3, 16),  # most experts empty
        (13, 7, 3, 16),  # odd T, a tile boundary inside experts
        (40, 5, 2, 16),  # three router chunks of 16 tokens: the cross-chunk prefix
        (70, 33, 4, 32),  # E not a power of two, larger block
        (37, 7, 7, 16),  # K = E: every token on every expert
        (2080, 40, 2, 16),  # 65 chunks (two scan steps), 3 scan programs of 16 experts, 5 layout programs
        (300, 70, 4, 128),  # 128-row blocks: layout programs of 64 blocks, padding rows across them
    ],
)
def test_align_equals_plan_dispatch(T, E, K, block_m, rng, device):
    from megamoe.kernels.moe import align_only

    idx = _random_topk(rng, T, E, K)
    got = {k: v.cpu() for k, v in align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), E, block_m).items()}
    plan = plan_dispatch(idx, E, block_m)
    P = plan.num_padded_rows
    np.testing.assert_array_equal(got["counts"].numpy(), plan.counts)
    np.testing.assert_array_equal(got["padded_offsets"].numpy(), plan.padded_offsets)
    np.testing.assert_array_equal(got["padded_token"].numpy()[:P], plan.padded_token)
    np.testing.assert_array_equal(got["padded_pair"].numpy()[:P], plan.padded_pair)
    nb = P // block_m
    np.testing.assert_array_equal(got["block_expert"].numpy()[:nb], plan.block_expert)
    assert (got["block_expert"].numpy()[nb:] == -1).all()
    # pair_dest is the padded row of each pair: the inverse of padded_pair
    pd = got["pair_dest"].numpy()
    np.testing.assert_array_equal(plan.padded_pair[pd], np.arange(T * K))


def test_all_pairs_on_one_expert(device):
    """Every token's only expert is 3 (K=1): one expert holds every row, six are empty."""
    from megamoe.kernels.moe import align_only

    idx = np.full((45, 1), 3)
    got = {k: v.cpu() for k, v in align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), 7, 16).items()}
    plan = plan_dispatch(idx, 7, 16)
    np.testing.assert_array_equal(got["padded_token"].numpy()[: plan.num_padded_rows], plan.padded_token)
    np.testing.assert_array_equal(got["block_expert"].numpy()[:3], plan.block_expert)


def test_one_scan_block_for_both_scans_and_the_model():
    """reference.tiles.scan_block: a power of two in [2, 16] covering the groups (16 past them),
    the block both align scans use (plan.align_launch's BLOCK_C) and the cost model's step count
    reads (ceil(G / BLOCK_C) + 2 for the megakernel's align_scan task, whose depth is G)."""
    from megamoe.kernels.plan import align_launch
    from megamoe.reference import MoEConfig
    from megamoe.reference.tiles import KINDS, scan_block, task_plan

    assert [scan_block(g) for g in (0, 1, 2, 3, 5, 16, 17, 128, 512)] == [2, 2, 2, 4, 8, 16, 16, 16, 16]
    for C in (1, 3, 40):
        assert align_launch(C, 2, 8, 16, 16, 4)["BLOCK_C"] == scan_block(C)
    cfg = MoEConfig(hidden_size=64, intermediate_size=32, num_experts=8, top_k=2)
    tiles = {"router": {"BLOCK_T": 4, "BLOCK_H": 16, "SPLIT": 1}, "gemm1": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16},
             "gemm2": {"BLOCK_N": 16, "BLOCK_K": 16},
             "shared": {"BLOCK_M": 16, "BLOCK_N1": 16, "BLOCK_N2": 16, "BLOCK_K": 16},
             "combine": {"BLOCK_T": 4, "BLOCK_H": 64}, "order": {"GROUP_M": 2}}
    counts = np.bincount(np.arange(30 * 2) % 8, minlength=8)
    p = task_plan(cfg, counts, 30, tiles)
    scan = p.kind == KINDS.index("align_scan")
    assert scan.sum() == 1 and int(p.depth[scan][0]) == p.layout.topk_groups == 8  # 30 tokens in groups of 4
