"""The fused EP launch's plan (reference/ep_tasks.py): pair positions, the layout known before launch, the
placement against plan_receive, and the ticket order that lets one program finish the launch."""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.reference import InputError
from megamoe.reference.ep import peer_order, plan_ep, plan_pull, pull_rows
from megamoe.reference.ep_tasks import (
    EP_KINDS,
    check_ticket_order,
    pair_positions,
    place_pairs,
    plan_fused_ep,
    slot_pair_counts,
)

# (name, R, tokens per rank, P slots, K, slot_rank rule, max_rows, why)
CASES = [
    ("one-rank", 1, [11], 6, 2, "contiguous", None, "R = 1: every pair is the rank's own"),
    ("two-ranks", 2, [13, 6], 8, 2, "contiguous", 3, "uneven tokens, copies cut in chunks of 3"),
    ("three-zero", 3, [9, 0, 14], 9, 3, "round_robin", None, "a rank that sends nothing"),
    ("four-hot", 4, [8, 5, 9, 3], 8, 2, "hot", 2, "slot 0 in every row: one slot takes every token"),
    ("four-empty", 4, [0, 0, 0, 0], 8, 2, "contiguous", None, "T = 0 everywhere: no task at all"),
    ("four-one-rank", 4, [6, 4, 0, 9], 8, 3, "one_rank", None, "every slot on rank 3: the others get nothing"),
]


def _routing(rng, R, tokens, P, K, rule):
    if rule == "one_rank":
        slot_rank = np.full(P, R - 1, np.int64)
    elif rule == "round_robin":
        slot_rank = np.arange(P, dtype=np.int64) % R
    else:
        slot_rank = np.repeat(np.arange(R, dtype=np.int64), -(-P // R))[:P]
    idx = []
    for T in tokens:
        rows = [rng.permutation(P)[:K] for _ in range(T)]
        if rule == "hot":
            rows = [np.concatenate([[0], rng.permutation(np.arange(1, P))[:K - 1]]) for _ in range(T)]
        idx.append(np.array(rows, np.int64).reshape(T, K))
    return slot_rank, idx


def _plans(rng, case, block_m=4):
    _, R, tokens, P, K, rule, max_rows, _why = case
    slot_rank, idx = _routing(rng, R, tokens, P, K, rule)
    sched = plan_ep(idx, slot_rank, R)
    pull = plan_pull(sched, 16, 2, max_rows=max_rows, meta_bytes=K * 20)
    counts = np.stack([slot_pair_counts(i, P) for i in idx])
    plans = [plan_fused_ep(pull, r, counts, slot_rank, top_k=K, hidden_size=16, intermediate_size=12,
                           block_m=block_m, block_n1=8, block_n2=16) for r in range(R)]
    return slot_rank, idx, sched, pull, plans


def test_pair_positions_count_earlier_rows_of_the_slot(rng):
    idx = np.stack([rng.permutation(7)[:3] for _ in range(40)])
    pos = pair_positions(idx, 7)
    for t in range(40):
        for k in range(3):
            assert pos[t, k] == int((idx[:t] == idx[t, k]).any(axis=1).sum())
    assert np.array_equal(slot_pair_counts(idx, 7), np.bincount(idx.ravel(), minlength=7))
    assert pair_positions(np.zeros((0, 3), np.int64), 7).shape == (0, 3)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_placement_is_plan_receive_by_peer_step(case, rng):
    """Each slot's pairs are plan_receive's, ordered by (peer step, row); padding rows -1; blocks of BM rows."""
    slot_rank, idx, sched, pull, plans = _plans(rng, case)
    R, K = case[1], case[4]
    pos_send = [pair_positions(i, slot_rank.size)[sp.send_token] for i, sp in zip(idx, sched.send)]
    idx_send = [i[sp.send_token] for i, sp in zip(idx, sched.send)]
    recv_idx, recv_pos = pull_rows(pull, idx_send), pull_rows(pull, pos_send)
    for d, plan in enumerate(plans):
        check_ticket_order(plan)
        rp = sched.recv[d]
        prow, ppair = place_pairs(plan, pull, recv_idx[d], recv_pos[d], slot_rank)
        assert prow.size == plan.num_padded and plan.num_padded % plan.block_m == 0
        step_of_row = (np.repeat(np.arange(R), pull.traffic[:, d]) - d) % R
        for j in range(plan.slots.size):
            lo, hi = int(plan.slot_base[j]), int(plan.slot_base[j + 1])
            n = int(rp.counts[j])
            want = sorted(zip(rp.pair_row[rp.offsets[j]:rp.offsets[j + 1]].tolist(),
                              rp.pair_k[rp.offsets[j]:rp.offsets[j + 1]].tolist()),
                          key=lambda rk: (int(step_of_row[rk[0]]), rk[0]))
            got = list(zip(prow[lo:lo + n].tolist(), (ppair[lo:lo + n] % K).tolist()))
            assert got == want, f"rank {d} slot {j}"
            assert (prow[lo + n:hi] == -1).all() and (ppair[lo + n:hi] == -1).all()
            assert hi - lo == -(-n // plan.block_m) * plan.block_m
        assert np.array_equal(ppair[prow >= 0] // K, prow[prow >= 0])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_tasks_and_waits(case, rng):
    """Pulls, GEMM tiles per block, pushes; each GEMM 1 waits for the pulls of exactly its block's peer steps
    that have copies."""
    slot_rank, idx, sched, pull, plans = _plans(rng, case)
    R = case[1]
    for d, plan in enumerate(plans):
        n = plan.tasks_per_kind()
        assert n == {"pull": int(pull.pull_offsets[d + 1] - pull.pull_offsets[d]), "gemm1": plan.num_blocks * plan.n1,
                     "gemm2": plan.num_blocks * plan.n2, "push": int(pull.push_offsets[d + 1] - pull.push_offsets[d])}
        assert list(np.unique(plan.kind)) == sorted(set(plan.kind.tolist()))
        assert np.all(np.diff(plan.kind) >= 0), "tickets run the kinds in EP_KINDS order"
        steps = (np.repeat(np.arange(R), pull.traffic[:, d]) - d) % R
        for t in np.nonzero(plan.kind == EP_KINDS.index("gemm1"))[0].tolist():
            b = int(plan.arg[t])
            lo, hi = int(plan.block_steps[b, 0]), int(plan.block_steps[b, 1])
            copied = set(pull.pull_step[pull.pulls(d)].tolist())
            assert [plan.counters[c] for c, _ in plan.waits(t)] == [f"pulled[{q}]" for q in range(lo, hi + 1)
                                                                     if q in copied]
            assert steps.size == 0 or lo <= hi
        assert peer_order(d, R)[0] == d


def test_bad_inputs_are_named(rng):
    slot_rank, idx, sched, pull, plans = _plans(rng, CASES[1])
    counts = np.stack([slot_pair_counts(i, slot_rank.size) for i in idx])
    kw = dict(top_k=2, hidden_size=16, intermediate_size=12, block_m=4, block_n1=8, block_n2=16)
    with pytest.raises(InputError, match="slot_counts do not match the traffic"):
        plan_fused_ep(pull, 0, counts * 0, slot_rank, **kw)
    with pytest.raises(InputError, match="block_m must be an integer >= 1"):
        plan_fused_ep(pull, 0, counts, slot_rank, **{**kw, "block_m": 0})
    with pytest.raises(InputError, match="rank"):
        plan_fused_ep(pull, 5, counts, slot_rank, **kw)
    with pytest.raises(InputError, match="PullSchedule"):
        plan_fused_ep(sched, 0, counts, slot_rank, **kw)
