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


# --------------------------------------------------------------------------- the multi-launch scatter
def _routing(kind, rng, T, E, K):
    """topk_idx (T, K) int32, K distinct experts a token. "uniform": random; "one_expert": expert E // 2 in
    every token, in a random slot; "few": only experts 0..K+1 (the rest empty); "zipf": skewed to low ids."""
    if kind == "few":
        pool = np.arange(min(E, K + 2))
        return np.stack([rng.permutation(pool)[:K] for _ in range(T)]).astype(np.int32)
    if kind == "zipf":
        p = 1.0 / np.arange(1, E + 1) ** 1.2
        return np.stack([rng.choice(E, K, replace=False, p=p / p.sum()) for _ in range(T)]).astype(np.int32)
    idx = _random_topk(rng, T, E, K).astype(np.int32)
    if kind == "one_expert":
        for t in range(T):
            row = [e for e in idx[t] if e != E // 2][:K - 1]
            row.insert(int(rng.integers(K)), E // 2)
            idx[t] = row
    return idx


def _scatter_inputs(idx, E, block_m, device):
    """(topk_idx, block_t, meta with chunk_base and padded_offsets from NumPy and the three outputs
    poisoned with -7, the reference plan): the scatter's inputs as the scan and layout leave them."""
    from megamoe.kernels import configs as cfgs

    T, K = idx.shape
    block_t = cfgs.router_block_t(T, E)
    C = -(-T // block_t)
    hist = np.stack([np.bincount(idx[c * block_t:(c + 1) * block_t].ravel(), minlength=E) for c in range(C)])
    plan = plan_dispatch(idx, E, block_m)
    P = plan.num_padded_rows + 5  # rows past P too: none may be written

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device.name)

    meta = {"chunk_base": t(np.cumsum(hist, axis=0) - hist), "padded_offsets": t(plan.padded_offsets),
            "padded_token": t(np.full(P, -7)), "padded_pair": t(np.full(P, -7)), "pair_dest": t(np.full(T * K, -7))}
    return t(idx), block_t, meta, plan


def _run_scatter(idx, E, block_m, device):
    """The outputs (padded_token, padded_pair, pair_dest) of launch_scatter (_scatter_pairs_kernel at
    plan.align_launch's sizes) on poisoned buffers, and the reference plan."""
    from megamoe.kernels.align import launch_scatter
    from megamoe.kernels.plan import align_launch

    T, K = idx.shape
    topk, block_t, meta, plan = _scatter_inputs(idx, E, block_m, device)
    launch_scatter(topk, meta, E, align_launch(meta["chunk_base"].shape[0], K, E, block_t, block_m, 1))
    return [meta[k].cpu().numpy() for k in ("padded_token", "padded_pair", "pair_dest")], plan


def _assert_scatter(got, plan, K):
    """got = (padded_token, padded_pair, pair_dest) of a scatter on poisoned buffers: the pairs' rows
    as plan_dispatch's, -7 left in the padding rows and past them, every pair_dest written."""
    pt, pp, pd = got
    P = plan.num_padded_rows
    rows = plan.padded_pair >= 0
    np.testing.assert_array_equal(pt[:P][rows], plan.padded_token[rows])
    np.testing.assert_array_equal(pp[:P][rows], plan.padded_pair[rows])
    assert (pt[:P][~rows] == -7).all() and (pp[:P][~rows] == -7).all() and (pt[P:] == -7).all() and (pp[P:] == -7).all()
    np.testing.assert_array_equal(pd, np.flatnonzero(rows)[np.argsort(plan.padded_pair[rows])])


@pytest.mark.parametrize(
    "T,E,K,kind,block_m",
    [
        (1, 384, 8, "uniform", 128),  # T = 1 at Kimi K2's width (old: the slot-by-slot branch at BLOCK_E 512)
        (13, 60, 6, "uniform", 16),  # K = 6: 78 pairs in BLOCK_J 128, E not a power of two
        (45, 8, 1, "one_expert", 16),  # K = 1, every token on one expert, seven experts empty
        (50, 8, 8, "uniform", 16),  # K = E: every token on every expert (old: the one-shot branch)
        (100, 256, 8, "zipf", 128),  # T not a multiple of 32: a last chunk of 4 tokens; skewed counts
        (70, 384, 8, "one_expert", 64),  # Kimi K2's 384: one expert in every token, at random slots
        (200, 128, 2, "one_expert", 16),  # K = 2, an expert holding 200 rows across seven chunks
        (33, 60, 1, "few", 16),  # K = 1 on three experts, one token past the first chunk
        (257, 8, 2, "zipf", 16),  # Mixtral widths, nine chunks, the last of one token
    ],
)
def test_pair_scatter_equals_the_reference(T, E, K, kind, block_m, rng, device):
    """_scatter_pairs_kernel stores plan_dispatch's rows on buffers poisoned with -7 (an element it
    leaves unwritten shows) and nothing else."""
    idx = _routing(kind, rng, T, E, K)
    got, plan = _run_scatter(idx, E, block_m, device)
    _assert_scatter(got, plan, K)


@pytest.mark.parametrize("block_p,T,E,K", [(16, 70, 60, 6), (64, 70, 60, 6),  # K = 6: the last pair block half
                                           (256, 100, 256, 8)])  # empty at 64; 256: capped at the chunk's BLOCK_J
def test_pair_scatter_any_pair_block(T, E, K, block_p, rng, device, monkeypatch):
    """Any BLOCK_P (plan.ALIGN_SCATTER_PAIRS; capped at the chunk's BLOCK_J) stores plan_dispatch's rows."""
    from megamoe.kernels import plan as kplan

    monkeypatch.setattr(kplan, "ALIGN_SCATTER_PAIRS", block_p)
    idx = _routing("uniform", rng, T, E, K)
    got, plan = _run_scatter(idx, E, 16, device)
    _assert_scatter(got, plan, K)


def test_scatter_launch_sizes():
    """The scatter's grid: a program per BLOCK_P pairs of each chunk, BLOCK_J covering a chunk's pairs."""
    from megamoe.kernels.plan import ALIGN_SCATTER_PAIRS, align_launch

    al = align_launch(128, 8, 256, 32, 128, 510)  # DeepSeek-V3 T = 4096
    assert (al["BLOCK_J"], al["scatter_grid"]) == (256, (128, 256 // ALIGN_SCATTER_PAIRS))
    al = align_launch(3, 6, 60, 32, 16, 40)  # 192 pairs a chunk in BLOCK_J 256
    assert al["BLOCK_J"] == 256 and al["scatter_grid"] == (3, -(-192 // al["BLOCK_P"]))
    assert align_launch(1, 1, 8, 16, 16, 4)["BLOCK_P"] == 16  # 16 pairs a chunk: one program of 16


@pytest.mark.parametrize("T,E,K,block_m,bad", [
    (1, 7, 3, 16, False),  # one token: the decode case
    (1, 256, 8, 16, True),  # DeepSeek-V3's routing width, an id out of range
    (5, 9, 4, 16, True),  # odd T, a repeated id and a -1
    (16, 33, 2, 64, False),  # the most tokens it takes, E not a power of two, 64-row blocks
])
def test_check_and_align_in_one_launch(T, E, K, block_m, bad, rng, device):
    """checks.launch_check_align (moe_experts at T <= CHECK_ALIGN_MAX_T): the same safe ids, weights,
    flag and align metadata as the check, histogram and align launches one after another."""
    from megamoe.kernels import checks
    from megamoe.kernels.align import launch_align, launch_hist
    from megamoe.kernels.moe import align_buffers

    idx = _random_topk(rng, T, E, K).astype(np.int64)
    if bad:
        idx[0, 0] = E + 3
        if T > 1:
            idx[T - 1, K - 1], idx[1, 1] = idx[T - 1, 0], -1
    ids = torch.from_numpy(idx).to(device.name)
    w = torch.from_numpy(rng.random((T, K)).astype(np.float32)).to(device.name)
    got, want = {}, {}
    for out, fused in ((got, True), (want, False)):
        meta, hist, block_t = align_buffers(T, K, E, block_m, device.name, poison=True)
        flag = checks.new_flag(device.name)
        safe = (torch.empty((T, K), dtype=torch.int32, device=device.name),
                torch.empty((T, K), dtype=torch.float32, device=device.name))
        if fused:
            safe = checks.launch_check_align(ids, w, E, flag, safe, meta, block_m)
        else:
            safe = checks.launch_check(ids, w, E, flag, out=safe)
            launch_hist(safe[0], hist, E, block_t)
            launch_align(safe[0], hist, E, block_t, block_m, meta)
        out.update({k: v.cpu() for k, v in meta.items() if k != "chunk_base"}, ids=safe[0].cpu(), w=safe[1].cpu(),
                   flag=flag.cpu())
    P = int(want["padded_offsets"][E])
    for k in ("ids", "w", "flag", "counts", "padded_offsets", "block_expert", "pair_dest"):
        assert torch.equal(got[k], want[k]), k
    for k in ("padded_token", "padded_pair"):
        assert torch.equal(got[k][:P], want[k][:P]), k
    assert (got["flag"][3:].sum() > 0) == bad
    with pytest.raises(ValueError, match="1 to 16 tokens, got T=17"):
        checks.launch_check_align(torch.zeros((17, K), dtype=torch.int32, device=device.name),
                                  torch.zeros((17, K), device=device.name), E, flag, safe, meta, block_m)
