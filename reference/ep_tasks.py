"""One rank's fused expert-parallel launch as data: the task plan the fused kernel runs and the cost model reads.

Shape legend: R ranks, P expert slots, P_r slots on this rank, K top-k, H hidden, I expert width,
N rows this rank receives, Np its (row, slot) pairs, BM the GEMMs' row block, B row blocks,
n1 / n2 GEMM 1 / GEMM 2 column tiles, C_r / C'_r this rank's pull / push copies.

Tasks, in ticket order: ``pull`` (one per pull copy of ``reference.ep.plan_pull``: rows, topk and
pair positions, then the rows' pairs placed), ``gemm1`` (row block, column tile of a local slot:
h = act(x @ gate_up^T)), ``gemm2`` (out[row * K + k] = w[row, k] * (h @ down^T)), ``push`` (one per
push copy: partial rows, k ascending in fp32, into the source's combine buffer).

The pair layout is known before launch: each source sends each row's position among its rows
routed to each slot (``pair_positions``) and every rank knows every source's pairs per slot
(``slot_pair_counts``), so a pulled pair (k, slot j) goes to row ``src_base[q, j] + pos[row, k]``
with no count or host sync after the rows arrive.

Counters: ``pulled[q]`` (pull copies of peer step q), ``g1[b]`` (GEMM 1 tiles of block b), ``g2[q]``
(GEMM 2 tiles over step q's rows). Every wait names counters only lower tickets signal, so any
number of programs finishes the launch. Pure NumPy, deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import InputError, as_index_array
from .ep import PullSchedule, _check_rank, _check_slot_rank, _check_topk, local_slots, peer_order

#: bytes a dispatched row carries per pick besides x: topk_idx, topk_weights and the pair's position
META_BYTES_PER_PICK = 8 + 4 + 8
#: task kinds in ticket order; ``kind`` holds their index
EP_KINDS = ("pull", "gemm1", "gemm2", "push")
PULL, GEMM1, GEMM2, PUSH = range(len(EP_KINDS))


def pair_positions(topk_idx, num_slots: int) -> np.ndarray:
    """(T, K) int64: pos[t, k] = the rows t' < t whose slots include topk_idx[t, k]."""
    idx = _check_topk(topk_idx, _positive("num_slots", num_slots))
    T, K = idx.shape
    flat = idx.reshape(-1)
    order = np.argsort(flat, kind="stable")  # by slot, then (t, k) row-major: t ascending inside a slot
    first = np.searchsorted(flat[order], flat[order], side="left")
    pos = np.empty(flat.size, np.int64)
    pos[order] = np.arange(flat.size, dtype=np.int64) - first
    return pos.reshape(T, K)


def slot_pair_counts(topk_idx, num_slots: int) -> np.ndarray:
    """(P,) int64 rows of this routing per slot (what each rank contributes to the gathered (R, P) matrix)."""
    idx = _check_topk(topk_idx, _positive("num_slots", num_slots))
    return np.bincount(idx.reshape(-1), minlength=num_slots).astype(np.int64)


def auto_max_rows(traffic, num_programs: int) -> int:
    """Rows per copy for a fused launch: ceil(most rows any rank receives / num_programs), at least 1."""
    t = as_index_array("traffic", traffic, (None, None), np.iinfo(np.int64).max)
    P = _positive("num_programs", num_programs)
    return max(1, -(-int(t.sum(axis=0).max(initial=0)) // P))


def _positive(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise InputError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class FusedEPPlan:
    """One rank's fused launch (module docstring). Arrays are int64 unless said.

    Layout: slots (P_r,); pair_counts (R, P_r) [source, local slot]; slot_base (P_r+1,) and src_base
    (R, P_r) first padded rows of each local slot and of peer step q's pairs in it; block_slot (B,);
    block_steps (B, 2) first and last peer step; num_padded = B * block_m.
    Tasks (n, ticket order): kind (EP_KINDS index), arg (the copy's index, or the row block), tile;
    wait_* and signal_* CSR lists as tiles.TaskPlan's; counters (names), counter_target.
    Cost fields (n,) float64: rows, link_bytes (0 for step 0), weight_bytes, in_bytes, out_bytes,
    flops; weight_id (n,) (slot * 2 + GEMM - 1, -1 else).
    """

    rank: int
    num_ranks: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    block_m: int
    block_n1: int
    block_n2: int
    slots: np.ndarray
    pair_counts: np.ndarray
    slot_base: np.ndarray
    src_base: np.ndarray
    block_slot: np.ndarray
    block_steps: np.ndarray
    kind: np.ndarray
    arg: np.ndarray
    tile: np.ndarray
    wait_ptr: np.ndarray
    wait_counter: np.ndarray
    wait_target: np.ndarray
    signal_ptr: np.ndarray
    signal_counter: np.ndarray
    counters: tuple
    counter_target: np.ndarray
    rows: np.ndarray
    link_bytes: np.ndarray
    weight_bytes: np.ndarray
    in_bytes: np.ndarray
    out_bytes: np.ndarray
    flops: np.ndarray
    weight_id: np.ndarray

    @property
    def num_tasks(self) -> int:
        return int(self.kind.size)

    @property
    def num_blocks(self) -> int:
        return int(self.block_slot.size)

    @property
    def num_padded(self) -> int:
        return self.num_blocks * self.block_m

    @property
    def n1(self) -> int:
        return -(-self.intermediate_size // self.block_n1)

    @property
    def n2(self) -> int:
        return -(-self.hidden_size // self.block_n2)

    def tasks_per_kind(self) -> dict:
        n = np.bincount(self.kind, minlength=len(EP_KINDS))
        return {k: int(n[i]) for i, k in enumerate(EP_KINDS)}

    def waits(self, task: int) -> list[tuple[int, int]]:
        lo, hi = int(self.wait_ptr[task]), int(self.wait_ptr[task + 1])
        return list(zip(self.wait_counter[lo:hi].tolist(), self.wait_target[lo:hi].tolist()))

    def signals(self, task: int) -> list[int]:
        return self.signal_counter[int(self.signal_ptr[task]):int(self.signal_ptr[task + 1])].tolist()


def _csr(lists: list[list]) -> tuple[np.ndarray, list]:
    ptr = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=ptr[1:])
    return ptr, [v for x in lists for v in x]


def plan_fused_ep(pull: PullSchedule, rank: int, slot_counts, slot_rank, *, top_k: int, hidden_size: int,
                  intermediate_size: int, block_m: int, block_n1: int, block_n2: int, act_bytes: int = 2,
                  weight_bytes: float = 2.0) -> FusedEPPlan:
    """The fused launch of ``rank`` (module docstring).

    pull: plan_pull's schedule (meta_bytes = top_k x META_BYTES_PER_PICK); slot_counts: (R, P) rows
    of every source per slot; slot_rank: (P,); block_m / block_n1 / block_n2: the GEMMs' row block
    and column tiles; act_bytes / weight_bytes: bytes per element (cost fields only).
    """
    if not isinstance(pull, PullSchedule):
        raise InputError(f"pull must be a reference.ep.PullSchedule (plan_pull), got {type(pull).__name__}")
    rank, R = _check_rank(rank, pull.num_ranks)
    slot_rank = _check_slot_rank(slot_rank, R)
    P = slot_rank.size
    counts = as_index_array("slot_counts", slot_counts, (R, P), np.iinfo(np.int64).max)
    K, H, I = (_positive(n, v) for n, v in (("top_k", top_k), ("hidden_size", hidden_size),
                                             ("intermediate_size", intermediate_size)))
    BM, BN1, BN2 = (_positive(n, v) for n, v in (("block_m", block_m), ("block_n1", block_n1),
                                                  ("block_n2", block_n2)))
    slots = local_slots(slot_rank, rank)
    steps = peer_order(rank, R)  # steps[q] = the source at peer step q
    pc = counts[:, slots]  # (R, P_r) [source, local slot]
    # every source's rows to rank must match its pairs: a row carries 1..K local pairs
    rows_in = pull.traffic[:, rank]
    pairs_in = pc.sum(axis=1)
    bad = np.nonzero((pairs_in < rows_in) | (pairs_in > rows_in * K))[0]
    if bad.size:
        s = int(bad[0])
        raise InputError(f"slot_counts do not match the traffic: source {s} sends rank {rank} {int(rows_in[s])} rows "
                         f"but {int(pairs_in[s])} pairs for its slots (need between rows and rows x top_k)")
    by_step = pc[steps]  # (R, P_r) [peer step, local slot]
    padded = -(-pc.sum(axis=0) // BM) * BM
    slot_base = np.zeros(slots.size + 1, np.int64)
    np.cumsum(padded, out=slot_base[1:])
    src_base = np.zeros((R, slots.size), np.int64)
    src_base[:] = slot_base[:-1][None, :] + (np.cumsum(by_step, axis=0) - by_step)
    # row blocks: which slot, which peer steps its pairs come from
    nblk = padded // BM
    block_slot = np.repeat(np.arange(slots.size, dtype=np.int64), nblk)
    B = block_slot.size
    block_steps = np.zeros((B, 2), np.int64)
    cum = np.cumsum(by_step, axis=0)  # (R, P_r): pairs of steps 0..q in slot j
    for b in range(B):
        j = int(block_slot[b])
        lo = (b - int(slot_base[j] // BM)) * BM  # first pair of the block inside its slot
        hi = min(lo + BM, int(cum[-1, j])) - 1  # last real pair
        block_steps[b] = (np.searchsorted(cum[:, j], lo, side="right"), np.searchsorted(cum[:, j], hi, side="right"))
    n1, n2 = -(-I // BN1), -(-H // BN2)
    pulls = np.arange(int(pull.pull_offsets[rank]), int(pull.pull_offsets[rank + 1]))
    pushes = np.arange(int(pull.push_offsets[rank]), int(pull.push_offsets[rank + 1]))
    counters = tuple([f"pulled[{q}]" for q in range(R)] + [f"g1[{b}]" for b in range(B)] +
                     [f"g2[{q}]" for q in range(R)])
    c_pulled, c_g1, c_g2 = 0, R, R + B
    target = np.zeros(len(counters), np.int64)
    np.add.at(target, c_pulled + pull.pull_step[pulls], 1)
    target[c_g1:c_g1 + B] = n1
    for b in range(B):
        target[c_g2 + block_steps[b, 0]:c_g2 + block_steps[b, 1] + 1] += n2
    kind, arg, tile, waits, signals = [], [], [], [], []
    row_bytes, back_bytes = pull.dispatch_row_bytes, pull.combine_row_bytes
    cost = {k: [] for k in ("rows", "link_bytes", "weight_bytes", "in_bytes", "out_bytes", "flops", "weight_id")}

    def add(k, a, t, w, s, **c):
        kind.append(k)
        arg.append(a)
        tile.append(t)
        waits.append(w)
        signals.append(s)
        for name in cost:
            cost[name].append(c.get(name, -1 if name == "weight_id" else 0.0))

    for i, c in enumerate(pulls.tolist()):
        q, n = int(pull.pull_step[c]), int(pull.pull_rows[c])
        add(PULL, i, 0, [], [c_pulled + q], rows=n, link_bytes=0.0 if q == 0 else n * row_bytes,
            in_bytes=n * row_bytes if q == 0 else 0.0, out_bytes=n * row_bytes)
    # real pairs of each block: its slot's pairs past the block's first row, at most BM
    first = np.arange(B, dtype=np.int64) * BM - slot_base[block_slot]
    real = np.clip(pc.sum(axis=0)[block_slot] - first, 0, BM)
    order = sorted(range(B), key=lambda b: (int(block_steps[b, 1]), b))
    for b in order:
        j = int(block_slot[b])
        w = [(c_pulled + q, int(target[c_pulled + q])) for q in range(int(block_steps[b, 0]), int(block_steps[b, 1]) + 1)
             if target[c_pulled + q]]  # a step with no copies has nothing to wait for
        for t in range(n1):
            cols = min(BN1, I - t * BN1)
            add(GEMM1, b, t, w, [c_g1 + b], rows=int(real[b]), weight_bytes=2 * cols * H * weight_bytes,
                in_bytes=int(real[b]) * H * act_bytes, out_bytes=int(real[b]) * cols * act_bytes,
                flops=2.0 * BM * 2 * BN1 * H, weight_id=int(slots[j]) * 2)
    for b in order:
        j = int(block_slot[b])
        for t in range(n2):
            cols = min(BN2, H - t * BN2)
            add(GEMM2, b, t, [(c_g1 + b, n1)],
                list(range(c_g2 + int(block_steps[b, 0]), c_g2 + int(block_steps[b, 1]) + 1)), rows=int(real[b]),
                weight_bytes=cols * I * weight_bytes, in_bytes=int(real[b]) * I * act_bytes,
                out_bytes=int(real[b]) * cols * act_bytes, flops=2.0 * BM * BN2 * I, weight_id=int(slots[j]) * 2 + 1)
    for i, c in enumerate(pushes.tolist()):
        q, n = int(pull.push_step[c]), int(pull.push_rows[c])
        w = [(c_g2 + q, int(target[c_g2 + q]))] if target[c_g2 + q] else []
        src = int(steps[q])
        pairs_per_row = pairs_in[src] / max(int(rows_in[src]), 1)
        add(PUSH, i, 0, w, [], rows=n, link_bytes=0.0 if q == 0 else n * back_bytes,
            in_bytes=n * pairs_per_row * H * act_bytes, out_bytes=n * back_bytes if q == 0 else 0.0)
    wait_ptr, wl = _csr(waits)
    signal_ptr, sl = _csr(signals)
    i64 = dict(dtype=np.int64)
    return FusedEPPlan(
        rank=rank, num_ranks=R, top_k=K, hidden_size=H, intermediate_size=I, block_m=BM, block_n1=BN1, block_n2=BN2,
        slots=slots, pair_counts=pc, slot_base=slot_base, src_base=src_base, block_slot=block_slot,
        block_steps=block_steps, kind=np.array(kind, **i64), arg=np.array(arg, **i64), tile=np.array(tile, **i64),
        wait_ptr=wait_ptr, wait_counter=np.array([c for c, _ in wl], **i64),
        wait_target=np.array([v for _, v in wl], **i64), signal_ptr=signal_ptr, signal_counter=np.array(sl, **i64),
        counters=counters, counter_target=target,
        **{k: np.array(v, dtype=np.int64 if k == "weight_id" else np.float64) for k, v in cost.items()})


def check_ticket_order(plan: FusedEPPlan) -> None:
    """InputError unless the tasks run in ticket order meet every wait and reach every target."""
    value = np.zeros(len(plan.counters), np.int64)
    for t in range(plan.num_tasks):
        for c, want in plan.waits(t):
            if value[c] < want:
                raise InputError(f"task {t} ({EP_KINDS[plan.kind[t]]}) waits for {plan.counters[c]} >= {want}, "
                                 f"which lower tickets leave at {int(value[c])}")
        for c in plan.signals(t):
            value[c] += 1
    if not np.array_equal(value, plan.counter_target):
        c = int(np.nonzero(value != plan.counter_target)[0][0])
        raise InputError(f"{plan.counters[c]} ends at {int(value[c])}, its target is {int(plan.counter_target[c])}")


def place_pairs(plan: FusedEPPlan, pull: PullSchedule, recv_idx, recv_pos, slot_rank) -> tuple[np.ndarray, np.ndarray]:
    """What the pull tasks' placement writes: (padded_row, padded_pair), each (num_padded,) int64, -1 in
    padding rows: the received row of each pair and row * K + k. recv_idx / recv_pos: (N, K) the
    received rows' slot ids and positions (in the receive layout, sources ascending)."""
    N = int(pull.recv_rows[plan.rank])
    idx = as_index_array("recv_idx", recv_idx, (N, plan.top_k), np.asarray(slot_rank).size)
    pos = as_index_array("recv_pos", recv_pos, (N, plan.top_k), np.iinfo(np.int64).max)
    local_of = np.full(np.asarray(slot_rank).size, -1, np.int64)
    local_of[plan.slots] = np.arange(plan.slots.size)
    row_step = (np.repeat(np.arange(plan.num_ranks), pull.traffic[:, plan.rank]) - plan.rank) % plan.num_ranks
    padded_row = np.full(plan.num_padded, -1, np.int64)
    padded_pair = np.full(plan.num_padded, -1, np.int64)
    row, k = np.nonzero(local_of[idx] >= 0) if N else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    j = local_of[idx[row, k]]
    dst = plan.src_base[row_step[row], j] + pos[row, k]
    if dst.size and (np.unique(dst).size != dst.size or (dst >= plan.slot_base[j + 1]).any()):
        raise InputError("the positions place two pairs in one row or past their slot: recv_pos does not match "
                         "slot_counts")
    padded_row[dst] = row
    padded_pair[dst] = row * plan.top_k + k
    return padded_row, padded_pair


__all__ = ["EP_KINDS", "META_BYTES_PER_PICK", "FusedEPPlan", "auto_max_rows", "check_ticket_order", "pair_positions", "place_pairs", "plan_fused_ep",
           "slot_pair_counts"]
