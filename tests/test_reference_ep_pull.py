"""The one-sided schedule (reference/ep.py plan_pull) and its exact emulation against the all-to-all path.

Routings come from the reference router on random tokens, slots from the simulator's placements
(``assign_slots``, as megamoe/ep.py picks them); the all-to-all path is computed by hand here, the
way tests/test_reference_ep.py does it, so the emulation is checked against an independent copy.
"""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.reference import InputError, MoEConfig, combine, moe_forward, random_weights
from megamoe.reference.ep import (
    PullSchedule,
    all_to_all_rows,
    ep_experts_forward,
    peer_order,
    plan_ep,
    plan_pull,
    pull_rows,
    push_rows,
)
from megamoe.reference.forward import expert_ffn
from megamoe.simulator.placement import Placement, assign_slots, contiguous, eplb, random_placement, round_robin

CFG = MoEConfig(hidden_size=16, intermediate_size=8, num_experts=8, top_k=2)
CFG_BIAS = MoEConfig(hidden_size=16, intermediate_size=8, num_experts=6, top_k=3, activation="clamped_swiglu",
                     expert_bias=True, router="topk_softmax")

# (name, R, tokens per rank, placement policy, why)
SCENARIOS = [
    ("one-rank", 1, [11], "contiguous", "R = 1: every copy is the rank's own"),
    ("two-ranks", 2, [13, 6], "contiguous", "two ranks, uneven tokens"),
    ("three-random", 3, [9, 0, 14], "random", "a rank that sends nothing, a seeded permutation of experts"),
    ("three-eplb", 3, [10, 7, 12], "eplb", "EPLB with replicas of the hot experts on other ranks"),
    ("four-rr", 4, [12, 0, 7, 21], "round_robin", "four ranks, one of them without tokens"),
    ("four-empty", 4, [0, 0, 0, 0], "contiguous", "T = 0 on every rank: nothing moves"),
    ("four-hot", 4, [8, 5, 9, 3], "hot", "one expert takes every token (and the others, the rest)"),
    ("four-one-rank", 4, [6, 4, 0, 9], "one_rank_all", "every slot on the last rank: the others compute nothing"),
]
MAX_ROWS = [None, 1, 3, 10_000]


def _placement(policy: str, E: int, R: int, load) -> Placement:
    if policy == "contiguous" or policy == "hot":
        return contiguous(E, R)
    if policy == "round_robin":
        return round_robin(E, R)
    if policy == "random":
        return random_placement(E, R, seed=4)
    if policy == "eplb":
        return eplb(load, R, num_slots=(E // R + 1) * R)  # a replica or more of the hot experts
    assert policy == "one_rank_all"
    s = np.arange(E, dtype=np.int64)
    return Placement("custom", E, R, s, np.full(E, R - 1, np.int64))


def _dense_routed(x, topk, tw, w, cfg):
    """The dense layer's routed part for a given routing, token by token: y[t] = sum_k w[t, k] * expert(x[t])."""
    y = np.zeros((x.shape[0], cfg.hidden_size))
    for t in range(x.shape[0]):
        for k in range(cfg.top_k):
            e = topk[t, k]
            y[t] += tw[t, k] * expert_ffn(x[t:t + 1], w.gate_up[e], w.down[e], cfg)[0]
    return y


def _scenario(name: str, cfg: MoEConfig = CFG, seed: int = 0):
    """(weights, xs, per-rank slot ids, per-rank routing weights, placement, dense routed y per rank)."""
    _, R, T, policy, _ = next(s for s in SCENARIOS if s[0] == name)
    w = random_weights(cfg, seed=seed + 1)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((t, cfg.hidden_size)) for t in T]
    outs = [moe_forward(x, w, cfg, details=True) for x in xs]
    topk = [o.routing.topk_idx.copy() for o in outs]
    tw = [o.routing.topk_weights for o in outs]
    dense = [combine(o.expert_out, o.plan, o.routing.topk_weights, cfg) for o in outs]
    if policy == "hot":  # expert 0 in every row (its last choice replaced), the rows still distinct
        for t in topk:
            for row in t:
                if 0 not in row:
                    row[-1] = 0
        dense = [_dense_routed(x, t, ww, w, cfg) for x, t, ww in zip(xs, topk, tw)]
    load = np.bincount(np.concatenate([t.reshape(-1) for t in topk]), minlength=cfg.num_experts)
    placement = _placement(policy, cfg.num_experts, R, load)
    slots = [assign_slots(t, np.full(t.shape[0], r, np.int64), placement) for r, t in enumerate(topk)]
    return w, xs, slots, tw, placement, dense


def _by_hand(xs, slots, tw, placement, w, cfg):
    """The all-to-all path written out as in tests/test_reference_ep.py: slices of the plans, concatenated."""
    R = len(xs)
    slot_expert, slot_rank = placement.slot_expert, placement.slot_rank
    sched = plan_ep(slots, slot_rank, R)
    partial = []
    for d, rp in enumerate(sched.recv):
        rx = np.concatenate([xs[s][sched.send[s].rows_to(d)] for s in range(R)])
        rw = np.concatenate([tw[s][sched.send[s].rows_to(d)] for s in range(R)]).reshape(-1, cfg.top_k)
        out = np.zeros((rp.num_pairs, cfg.hidden_size))
        for j, g in enumerate(rp.slots):
            lo, hi = rp.offsets[j], rp.offsets[j + 1]
            if hi == lo:
                continue
            e = slot_expert[g]
            out[lo:hi] = expert_ffn(rx[rp.pair_row[lo:hi]], w.gate_up[e], w.down[e], cfg,
                                    None if w.gate_up_bias is None else w.gate_up_bias[e],
                                    None if w.down_bias is None else w.down_bias[e])
        part = np.zeros((rp.num_recv, cfg.hidden_size))
        for k in range(cfg.top_k):
            m = rp.row_pair[:, k] >= 0
            part[m] += rw[m, k, None] * out[rp.row_pair[m, k]]
        partial.append(part)
    ys = []
    for r in range(R):
        sp = sched.send[r]
        back = np.concatenate([partial[d][sched.recv[d].recv_offsets[r]:sched.recv[d].recv_offsets[r + 1]]
                               for d in range(R)])
        y = np.zeros((sp.num_tokens, cfg.hidden_size))
        for d in range(R):
            m = sp.combine_row[:, d] >= 0
            y[m] += back[sp.combine_row[m, d]]
        ys.append(y)
    return ys


def _check_side(R, traffic, offsets, peer, src_row, rows, dst_row, step, pull: bool, max_rows):
    """The properties of one side (pull: rank a pulls from peer; push: rank a pushes to peer)."""
    send_off = np.cumsum(traffic, axis=1) - traffic  # [s, d] first row of d's group in s's send buffer
    recv_off = np.cumsum(traffic, axis=0) - traffic  # [s, d] first row of s's group in d's receive buffer
    owner = np.repeat(np.arange(R), np.diff(offsets))
    assert offsets[0] == 0 and np.all(np.diff(offsets) >= 0) and offsets[-1] == peer.size
    assert np.all(rows >= 1)
    if max_rows:
        assert np.all(rows <= max_rows)
    # each rank's copies in its peer order: step non-decreasing, peer = (a + step) % R
    np.testing.assert_array_equal(peer, (owner + step) % R)
    for a in range(R):
        mine = slice(offsets[a], offsets[a + 1])
        assert np.all(np.diff(step[mine]) >= 0)
        has = [p for p in peer_order(a, R).tolist() if traffic[p, a] > 0]
        seen = list(dict.fromkeys(peer[mine].tolist()))
        assert seen == has, (a, seen, has)
    # at each step every peer is visited by one rank at most (no two ranks on one peer)
    for i in range(R):
        at = peer[step == i]
        owners = owner[step == i]
        for p in np.unique(at):
            assert np.unique(owners[at == p]).size == 1
    # every (src, dst) pair's rows exactly once, in order, chunks of at most max_rows
    n_chunks = 0
    for s in range(R):
        for d in range(R):
            sel = (owner == d) & (peer == s)
            n = int(traffic[s, d])
            n_chunks += -(-n // max_rows) if (max_rows and n) else int(n > 0)
            if n == 0:
                assert not sel.any()
                continue
            a_rows = np.concatenate([np.arange(lo, lo + k) for lo, k in zip(src_row[sel], rows[sel])])
            b_rows = np.concatenate([np.arange(lo, lo + k) for lo, k in zip(dst_row[sel], rows[sel])])
            if pull:  # src_row in s's send buffer, dst_row in d's receive buffer
                np.testing.assert_array_equal(a_rows, send_off[s, d] + np.arange(n))
                np.testing.assert_array_equal(b_rows, recv_off[s, d] + np.arange(n))
            else:  # src_row in d's partial buffer (receive layout), dst_row in s's combine buffer (send layout)
                np.testing.assert_array_equal(a_rows, recv_off[s, d] + np.arange(n))
                np.testing.assert_array_equal(b_rows, send_off[s, d] + np.arange(n))
    assert peer.size == n_chunks
    # the written rows tile each written buffer: no gaps, no overlaps
    for b in range(R):
        sel = (owner == b) if pull else (peer == b)
        size = traffic[:, b].sum() if pull else traffic[b].sum()
        got = np.sort(np.concatenate([np.arange(lo, lo + k) for lo, k in zip(dst_row[sel], rows[sel])] +
                                     [np.zeros(0, np.int64)]))
        np.testing.assert_array_equal(got, np.arange(size))


@pytest.mark.parametrize("max_rows", MAX_ROWS, ids=lambda m: f"max_rows={m}")
@pytest.mark.parametrize("name", [s[0] for s in SCENARIOS])
def test_plan_pull_properties(name, max_rows):
    _, xs, slots, _, placement, _ = _scenario(name)
    R = len(xs)
    sched = plan_ep(slots, placement.slot_rank, R)
    traffic = sched.traffic()
    ps = plan_pull(sched, CFG.hidden_size, 2, max_rows=max_rows, meta_bytes=CFG.top_k * 12)
    assert isinstance(ps, PullSchedule) and ps.num_ranks == R
    for k, v in vars(ps).items():
        if isinstance(v, np.ndarray):
            assert v.dtype == np.int64 and v.flags.c_contiguous, k
    np.testing.assert_array_equal(ps.send_rows, [s.num_send for s in sched.send])
    np.testing.assert_array_equal(ps.recv_rows, [r.num_recv for r in sched.recv])
    _check_side(R, traffic, ps.pull_offsets, ps.pull_src, ps.pull_src_row, ps.pull_rows, ps.pull_dst_row,
                ps.pull_step, True, max_rows)
    _check_side(R, traffic, ps.push_offsets, ps.push_dst, ps.push_src_row, ps.push_rows, ps.push_dst_row,
                ps.push_step, False, max_rows)
    # bytes per copy, and per rank: the whole receive (resp. send) buffer
    assert ps.dispatch_row_bytes == CFG.hidden_size * 2 + CFG.top_k * 12 and ps.combine_row_bytes == CFG.hidden_size * 2
    np.testing.assert_array_equal(ps.pull_bytes, ps.pull_rows * ps.dispatch_row_bytes)
    np.testing.assert_array_equal(ps.push_bytes, ps.push_rows * ps.combine_row_bytes)
    assert ps.buffer_rows == max(ps.send_rows.max(), ps.recv_rows.max())
    # the traffic matrix alone gives the same schedule
    again = plan_pull(traffic, CFG.hidden_size, 2, max_rows=max_rows, meta_bytes=CFG.top_k * 12)
    for k, v in vars(ps).items():
        assert np.array_equal(v, getattr(again, k)), k


@pytest.mark.parametrize("max_rows", [None, 1, 4])
@pytest.mark.parametrize("name", [s[0] for s in SCENARIOS])
def test_pulled_buffers_are_the_all_to_all_layout(rng, name, max_rows):
    """Pulls and pushes, in any interleaving of the ranks that keeps each rank's order, lay the
    buffers out exactly as all_to_all does (the receive side as plan_receive expects)."""
    _, xs, slots, _, placement, _ = _scenario(name)
    R = len(xs)
    sched = plan_ep(slots, placement.slot_rank, R)
    traffic = sched.traffic()
    ps = plan_pull(sched, CFG.hidden_size, 2, max_rows=max_rows)
    # row tags: (source rank, token) per send row, so any misplaced row shows
    send = [np.stack([np.full(sp.num_send, r), sp.send_token], axis=1) for r, sp in enumerate(sched.send)]
    want = all_to_all_rows(send, traffic)
    for d in range(R):  # all_to_all's layout: sources ascending, each in the sender's order
        np.testing.assert_array_equal(want[d], np.concatenate(
            [np.stack([np.full(sched.send[s].rows_to(d).size, s), sched.send[s].rows_to(d)], axis=1)
             for s in range(R)]))
        np.testing.assert_array_equal(
            np.concatenate([slots[s][sched.send[s].rows_to(d)] for s in range(R)]).reshape(-1, CFG.top_k),
            all_to_all_rows([s_[sp.send_token] for s_, sp in zip(slots, sched.send)], traffic)[d])
    # step-major (what concurrent ranks do, step by step) and a random interleaving
    owner = np.repeat(np.arange(R), np.diff(ps.pull_offsets))
    step_major = np.lexsort((np.arange(ps.num_pulls), owner, ps.pull_step))
    labels = rng.permutation(owner)  # a random interleaving: the j-th turn of rank a runs a's j-th copy
    shuffled = np.empty(ps.num_pulls, np.int64)
    for a in range(R):
        shuffled[labels == a] = np.nonzero(owner == a)[0]
    for order in (None, step_major, shuffled):
        got = pull_rows(ps, send, order=order)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))
    # combine: tags of each computing rank's partial rows come back where the source sent them
    partial = [np.stack([np.full(n, d), np.arange(n)], axis=1) for d, n in enumerate(ps.recv_rows)]
    want_back = all_to_all_rows(partial, traffic.T)
    owner = np.repeat(np.arange(R), np.diff(ps.push_offsets))
    for order in (None, np.lexsort((np.arange(int(ps.push_offsets[-1])), owner, ps.push_step))):
        got = push_rows(ps, partial, order=order)
        assert all(np.array_equal(g, w) for g, w in zip(got, want_back))
    for s, sp in enumerate(sched.send):  # the row of s's send buffer to d comes back from d
        for d in range(R):
            sel = sp.combine_row[:, d][sp.combine_row[:, d] >= 0]
            assert np.all(want_back[s][sel, 0] == d)


@pytest.mark.parametrize("max_rows", [None, 1, 5])
@pytest.mark.parametrize("name", [s[0] for s in SCENARIOS])
def test_emulation_is_the_all_to_all_path_bitwise(name, max_rows):
    """Pull, local experts, push back, per-token sum: bitwise the all-to-all path, close to the dense layer."""
    w, xs, slots, tw, placement, dense = _scenario(name)
    args = (xs, slots, tw, placement.slot_expert, placement.slot_rank, w, CFG)
    a2a = ep_experts_forward(*args, transport="all_to_all")
    pull = ep_experts_forward(*args, transport="pull", max_rows=max_rows)
    hand = _by_hand(xs, slots, tw, placement, w, CFG)
    for r in range(len(xs)):
        assert a2a[r].shape == (xs[r].shape[0], CFG.hidden_size) and pull[r].dtype == np.float64
        assert np.array_equal(pull[r], a2a[r]), f"rank {r}: pull differs from all_to_all"
        assert np.array_equal(a2a[r], hand[r]), f"rank {r}: differs from the plans by hand"
        np.testing.assert_allclose(pull[r], dense[r], rtol=0, atol=1e-12 * max(1.0, np.abs(dense[r]).max(initial=0)))


def test_emulation_with_biases_and_skewed_eplb(rng):
    """gpt-oss-like experts (biases, clamped swiglu, K = 3) on an EPLB placement with replicas."""
    R, T = 3, [10, 4, 17]
    w = random_weights(CFG_BIAS, seed=8)
    xs = [rng.standard_normal((t, CFG_BIAS.hidden_size)) for t in T]
    outs = [moe_forward(x, w, CFG_BIAS, details=True) for x in xs]
    load = np.bincount(np.concatenate([o.routing.topk_idx.reshape(-1) for o in outs]),
                       minlength=CFG_BIAS.num_experts)
    placement = eplb(load, R, num_slots=(CFG_BIAS.num_experts // R + 1) * R)
    assert placement.num_slots > CFG_BIAS.num_experts
    slots = [assign_slots(o.routing.topk_idx, np.full(t, r, np.int64), placement) for r, (o, t) in
             enumerate(zip(outs, T))]
    tw = [o.routing.topk_weights for o in outs]
    args = (xs, slots, tw, placement.slot_expert, placement.slot_rank, w, CFG_BIAS)
    a2a = ep_experts_forward(*args)
    pull = ep_experts_forward(*args, transport="pull", max_rows=2)
    hand = _by_hand(xs, slots, tw, placement, w, CFG_BIAS)
    for r in range(R):
        assert np.array_equal(pull[r], a2a[r]) and np.array_equal(a2a[r], hand[r])
        np.testing.assert_allclose(pull[r], outs[r].y, rtol=0, atol=1e-12 * max(1.0, np.abs(outs[r].y).max()))


def test_one_rank_schedule_is_a_local_copy():
    ps = plan_pull(np.array([[5]]), 4, 2, max_rows=2)
    assert ps.pull_src.tolist() == [0, 0, 0] and ps.pull_rows.tolist() == [2, 2, 1]
    assert ps.pull_src_row.tolist() == ps.pull_dst_row.tolist() == [0, 2, 4]
    assert ps.push_dst.tolist() == [0, 0, 0] and ps.pull_bytes.tolist() == [16, 16, 8]


def test_two_ranks_by_hand():
    """Rank 0 sends 2 rows to itself, 3 to rank 1; rank 1 sends 1 to rank 0, 4 to itself."""
    ps = plan_pull(np.array([[2, 3], [1, 4]]), 1, 1)
    # rank 0: itself (rows 0:2 -> 0:2), then rank 1 (its rows 0:1 -> 2:3)
    assert ps.pulls(0) == slice(0, 2)
    assert ps.pull_src[:2].tolist() == [0, 1] and ps.pull_src_row[:2].tolist() == [0, 0]
    assert ps.pull_dst_row[:2].tolist() == [0, 2]
    # rank 1: itself first (its rows 1:5 -> receive rows 3:7), then rank 0 (rows 2:5 -> 0:3)
    assert ps.pull_src[2:].tolist() == [1, 0] and ps.pull_src_row[2:].tolist() == [1, 2]
    assert ps.pull_dst_row[2:].tolist() == [3, 0] and ps.pull_rows[2:].tolist() == [4, 3]
    # push-back of rank 1: its partial rows 3:7 to its own combine rows 1:5, rows 0:3 to rank 0's 2:5
    assert ps.push_dst[2:].tolist() == [1, 0] and ps.push_src_row[2:].tolist() == [3, 0]
    assert ps.push_dst_row[2:].tolist() == [1, 2]


def test_bad_inputs_are_named():
    t = np.array([[1, 2], [3, 4]])
    with pytest.raises(InputError, match="max_rows must be >= 1, got 0"):
        plan_pull(t, 4, 2, max_rows=0)
    with pytest.raises(InputError, match="hidden_size must be an integer, got True"):
        plan_pull(t, True, 2)
    with pytest.raises(InputError, match="element_size must be >= 1"):
        plan_pull(t, 4, 0)
    with pytest.raises(InputError, match="meta_bytes must be >= 0"):
        plan_pull(t, 4, 2, meta_bytes=-1)
    with pytest.raises(InputError, match="square"):
        plan_pull(np.ones((2, 3), np.int64), 4, 2)
    with pytest.raises(InputError, match="traffic has value -1"):
        plan_pull(np.array([[1, -1], [0, 0]]), 4, 2)
    with pytest.raises(InputError, match="traffic must be an integer array"):
        plan_pull(np.ones((2, 2)), 4, 2)
    sched = plan_ep([np.array([[0], [0]]), np.array([[1]])], [0, 1], 2)  # traffic [[2, 0], [0, 1]]
    bad = type(sched)(send=sched.send, recv=sched.recv[::-1])
    with pytest.raises(InputError, match=r"rank 0 receives \[0, 1\] rows but its senders send it \[2, 0\]"):
        plan_pull(bad, 4, 2)
    ps = plan_pull(t, 4, 2, max_rows=1)
    with pytest.raises(InputError, match="send buffer of rank 1 must have 7 rows"):
        pull_rows(ps, [np.zeros(3), np.zeros(5)])
    with pytest.raises(InputError, match="need one partial buffer per rank"):
        push_rows(ps, [np.zeros(4)])
    with pytest.raises(InputError, match="out of their schedule order"):
        pull_rows(ps, [np.zeros(3), np.zeros(7)], order=np.arange(ps.num_pulls)[::-1])
    with pytest.raises(InputError, match="transport must be one of"):
        ep_experts_forward([np.zeros((0, 16))], [np.zeros((0, 2), np.int64)], [np.zeros((0, 2))],
                           np.arange(8), np.zeros(8, np.int64), random_weights(CFG), CFG, transport="nvshmem")
