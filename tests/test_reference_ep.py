"""The expert-parallel schedule (reference/ep.py) against brute force and against the layer itself."""

from __future__ import annotations

import numpy as np
import pytest

from megamoe.reference import InputError, MoEConfig, moe_forward, random_weights, rank_traffic
from megamoe.reference.ep import local_slots, peer_order, plan_ep, plan_receive, plan_send
from megamoe.reference.forward import expert_ffn


def _distinct_topk(rng, T, K, P, p=None):
    """(T, K) distinct slots per row; ``p`` skews the choice."""
    rows = [rng.choice(P, K, replace=False, p=p) for _ in range(T)]
    return np.array(rows, dtype=np.int64).reshape(T, K)


def _brute_send(idx, slot_rank, R):
    """Loops: for each destination ascending, each token ascending that has a slot there."""
    T = idx.shape[0]
    rows, counts = [], []
    combine = -np.ones((T, R), np.int64)
    for d in range(R):
        n = 0
        for t in range(T):
            if any(slot_rank[s] == d for s in idx[t]):
                combine[t, d] = len(rows)
                rows.append(t)
                n += 1
        counts.append(n)
    return np.array(rows, np.int64), np.array(counts, np.int64), combine


CASES = [
    # (T, K, P, R, why)
    (13, 2, 8, 2, "odd T, two ranks"),
    (32, 4, 16, 4, "four ranks, K = R: a token may reach every rank"),
    (7, 1, 4, 4, "top-1: at most one destination per token"),
    (0, 2, 8, 2, "T = 0: every buffer empty"),
    (20, 3, 6, 3, "ranks hold different numbers of slots"),
]


@pytest.mark.parametrize("T,K,P,R,why", CASES, ids=[c[-1] for c in CASES])
def test_plan_send_matches_brute_force(rng, T, K, P, R, why):
    slot_rank = rng.integers(0, R, P)
    idx = _distinct_topk(rng, T, K, P)
    sp = plan_send(idx, slot_rank, R, 1 % R)
    rows, counts, combine = _brute_send(idx, slot_rank, R)
    np.testing.assert_array_equal(sp.send_token, rows)
    np.testing.assert_array_equal(sp.send_counts, counts)
    np.testing.assert_array_equal(sp.send_offsets, np.concatenate([[0], np.cumsum(counts)]))
    np.testing.assert_array_equal(sp.combine_row, combine)
    # duplicate-free: a token goes to a destination at most once, every row is one (token, dst)
    for d in range(R):
        got = sp.rows_to(d)
        assert np.unique(got).size == got.size and np.all(np.diff(got) > 0)
    assert sp.send_token.dtype == np.int64 and sp.combine_row.shape == (T, R)


def test_plan_send_empty_sends_and_one_rank_takes_all(rng):
    """All slots on rank 2 of 4: ranks 0, 1, 3 receive nothing, rank 2 every token once."""
    T, K, P, R = 9, 3, 6, 4
    slot_rank = np.full(P, 2)
    idx = _distinct_topk(rng, T, K, P)
    sched = plan_ep([idx, idx[:4], idx[:0], idx], slot_rank, R)
    for s in sched.send:
        assert s.send_counts.tolist() == [0, 0, s.num_tokens, 0]
        np.testing.assert_array_equal(s.rows_to(2), np.arange(s.num_tokens))
    for d, r in enumerate(sched.recv):
        n = 9 + 4 + 0 + 9 if d == 2 else 0
        assert r.num_recv == n and r.num_pairs == n * K
        assert (r.slots.size == P) == (d == 2)


def test_traffic_equals_rank_traffic(rng):
    """The schedule's (src, dst) counts are dispatch.rank_traffic's deduplicated token movement (skewed routing)."""
    R, P, K = 4, 16, 4
    slot_rank = rng.integers(0, R, P)
    T = [10, 0, 7, 25]
    p = 1.0 / np.arange(1, P + 1) ** 1.5
    idx = [_distinct_topk(rng, t, K, P, p / p.sum()) for t in T]
    got = plan_ep(idx, slot_rank, R).traffic()
    want = rank_traffic(np.concatenate(idx), np.repeat(np.arange(R), T), slot_rank, R, dedup=True)
    np.testing.assert_array_equal(got, want)


def test_peer_order_is_a_latin_square():
    """At step i every rank visits a different peer, and each rank visits every peer once."""
    R = 5
    m = np.stack([peer_order(r, R) for r in range(R)])
    assert m[:, 0].tolist() == list(range(R))
    for i in range(R):
        assert sorted(m[:, i]) == list(range(R)) and sorted(m[i]) == list(range(R))


def test_plan_receive_pairs(rng):
    """Each received row's local slots, by (local slot, row); row_pair inverts the pair order."""
    R, P, K = 3, 9, 3
    slot_rank = np.arange(P) % R
    idx = [_distinct_topk(rng, 11, K, P) for _ in range(R)]
    sched = plan_ep(idx, slot_rank, R)
    for d, rp in enumerate(sched.recv):
        recv = np.concatenate([idx[s][sched.send[s].rows_to(d)] for s in range(R)])
        np.testing.assert_array_equal(rp.slots, local_slots(slot_rank, d))
        want = sorted((int(np.nonzero(rp.slots == recv[n, k])[0][0]), n, k)
                      for n in range(recv.shape[0]) for k in range(K) if slot_rank[recv[n, k]] == d)
        got = list(zip(rp.pair_local.tolist(), rp.pair_row.tolist(), rp.pair_k.tolist()))
        assert got == want
        np.testing.assert_array_equal(rp.counts, np.bincount(rp.pair_local, minlength=rp.slots.size))
        for p in range(rp.num_pairs):
            assert rp.row_pair[rp.pair_row[p], rp.pair_k[p]] == p
        assert (rp.row_pair >= 0).sum() == rp.num_pairs


def test_exchange_through_the_plans_is_the_layer(rng):
    """Dispatch, local experts and combine done with the plans in float64 equal moe_forward's routed part.

    Skewed routing onto 2 hot experts, replicas of the hot experts on other ranks (EPLB-like)."""
    cfg = MoEConfig(hidden_size=16, intermediate_size=8, num_experts=6, top_k=2)
    w = random_weights(cfg, seed=3)
    R, T = 3, [9, 0, 14]
    # slots: experts 0..5 then replicas of hot experts 0 and 1; slots spread over the ranks
    slot_expert = np.array([0, 1, 2, 3, 4, 5, 0, 1, 0])
    slot_rank = np.array([0, 0, 1, 1, 2, 2, 1, 2, 2])
    xs = [rng.standard_normal((t, cfg.hidden_size)) for t in T]
    ys, sent = [], []
    for r in range(R):
        out = moe_forward(xs[r], w, cfg, details=True)
        e = out.routing.topk_idx
        # pick a replica: the lowest slot of that expert on this rank, else the first one
        slot = np.array([[next((s for s in np.nonzero(slot_expert == ee)[0] if slot_rank[s] == r),
                               np.nonzero(slot_expert == ee)[0][0]) for ee in row] for row in e],
                        dtype=np.int64).reshape(e.shape)
        sent.append((slot, out.routing.topk_weights))
        ys.append(out.y)
    sched = plan_ep([s for s, _ in sent], slot_rank, R)
    partial = []
    for d, rp in enumerate(sched.recv):
        rx = np.concatenate([xs[s][sched.send[s].send_token[sched.send[s].send_offsets[d]:
                                                           sched.send[s].send_offsets[d + 1]]] for s in range(R)])
        rw = np.concatenate([sent[s][1][sched.send[s].rows_to(d)] for s in range(R)]).reshape(-1, cfg.top_k)
        out = np.zeros((rp.num_pairs, cfg.hidden_size))
        for j, g in enumerate(rp.slots):
            lo, hi = rp.offsets[j], rp.offsets[j + 1]
            e = slot_expert[g]
            out[lo:hi] = expert_ffn(rx[rp.pair_row[lo:hi]], w.gate_up[e], w.down[e], cfg)
        part = np.zeros((rp.num_recv, cfg.hidden_size))
        for k in range(cfg.top_k):
            m = rp.row_pair[:, k] >= 0
            part[m] += rw[m, k, None] * out[rp.row_pair[m, k]]
        partial.append(part)
    for r in range(R):
        sp = sched.send[r]
        back = np.concatenate([partial[d][sched.recv[d].recv_offsets[r]:sched.recv[d].recv_offsets[r + 1]]
                               for d in range(R)])
        y = np.zeros((T[r], cfg.hidden_size))
        for d in range(R):
            m = sp.combine_row[:, d] >= 0
            y[m] += back[sp.combine_row[m, d]]
        np.testing.assert_allclose(y, ys[r], rtol=0, atol=1e-12 * max(1.0, np.abs(ys[r]).max(initial=0)))


def test_bad_inputs_are_named():
    with pytest.raises(InputError, match="names a slot twice"):
        plan_send([[1, 1]], [0, 1], 2, 0)
    with pytest.raises(InputError, match="slot_rank has value 3"):
        plan_send([[0, 1]], [0, 3], 2, 0)
    with pytest.raises(InputError, match="rank"):
        plan_send([[0, 1]], [0, 1], 2, 2)
    with pytest.raises(InputError, match="no slot on rank 1"):
        plan_receive([[0]], [1, 0], [0, 1], 1)
    with pytest.raises(InputError, match="sum to 2"):
        plan_receive([[1]], [1, 1], [0, 1], 1)


def test_plan_ep_names_a_rank_whose_top_k_differs():
    import numpy as np
    import pytest

    from megamoe.reference import InputError
    from megamoe.reference.ep import plan_ep

    slot_rank = np.array([0, 0, 1, 1])
    with pytest.raises(InputError, match="same top-k: rank 0 has 2, rank 1 has 1"):
        plan_ep([np.array([[0, 2]]), np.array([[3]])], slot_rank, 2)
