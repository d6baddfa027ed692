"""The expert-parallel schedule as data: which rows each rank sends to which peer, and back.

Shape legend: R ranks (GPUs), T tokens on one rank, K top-k, P expert slots (P = E without
replicas), N rows one rank sends (or receives), Np (row, slot) pairs one rank computes.

Each rank r routes its T tokens to expert *slots* ``topk_idx`` (T, K); slot p lives on rank
``slot_rank[p]``. Dispatch sends a token to each rank holding one of its slots *once* (DeepEP's
dispatch) with its topk_idx and topk_weights rows; the receiver sums the row's local slots in k
order into one partial row; combine sends the partial rows back and the source adds them up, ranks
ascending. Every order is fixed, so the result is bitwise deterministic. The send and receive
layouts (``plan_send``, ``plan_receive``) are tabled in docs/kernels.md.

The one-sided transport (``plan_pull``, a ``PullSchedule``): each destination pulls its rows from
the peers' send buffers into the offsets all_to_all would have put them at, and pushes its partial
rows back the same way. ``pull_rows`` / ``push_rows`` emulate it on NumPy buffers,
``all_to_all_rows`` is what all_to_all delivers, and ``ep_experts_forward`` is the whole
expert-parallel layer in float64 over either transport: the two are bitwise equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import InputError, as_float_array, as_index_array, check_distinct_rows
from .config import MoEConfig
from .forward import expert_ffn
from .weights import MoEWeights


def _check_rank(rank, num_ranks) -> tuple[int, int]:
    for name, v in (("num_ranks", num_ranks), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InputError(f"{name} must be an integer, got {v!r}")
    if num_ranks < 1 or not 0 <= rank < num_ranks:
        raise InputError(f"need 0 <= rank < num_ranks, got rank={rank}, num_ranks={num_ranks}")
    return int(rank), int(num_ranks)


def _check_slot_rank(slot_rank, num_ranks: int) -> np.ndarray:
    return as_index_array("slot_rank", slot_rank, (None,), num_ranks)


def _check_topk(topk_idx, num_slots: int) -> np.ndarray:
    return check_distinct_rows("topk_idx", as_index_array("topk_idx", topk_idx, (None, None), num_slots), "a slot")


def local_slots(slot_rank, rank: int) -> np.ndarray:
    """(P_r,) int64 slot ids held by ``rank``, ascending: local slot j is global slot local_slots[j]."""
    return np.nonzero(np.asarray(slot_rank) == rank)[0].astype(np.int64)


def peer_order(rank: int, num_ranks: int) -> np.ndarray:
    """(R,) int64 peers in the order ``rank`` visits them: itself, then rank+1, ... (mod R)."""
    rank, num_ranks = _check_rank(rank, num_ranks)
    return (rank + np.arange(num_ranks, dtype=np.int64)) % num_ranks


@dataclass(frozen=True)
class SendPlan:
    """One source rank's side of dispatch and combine (docs/kernels.md), int64: send_counts (R,),
    send_offsets (R+1,), send_token (N,), combine_row (T, R), peer_order (R,)."""

    rank: int
    num_ranks: int
    num_tokens: int
    top_k: int
    send_counts: np.ndarray
    send_offsets: np.ndarray
    send_token: np.ndarray
    combine_row: np.ndarray
    peer_order: np.ndarray

    @property
    def num_send(self) -> int:
        return int(self.send_offsets[-1])

    def rows_to(self, dst: int) -> np.ndarray:
        """Tokens sent to ``dst``, ascending."""
        return self.send_token[self.send_offsets[dst] : self.send_offsets[dst + 1]]


def plan_send(topk_idx, slot_rank, num_ranks: int, rank: int) -> SendPlan:
    """Dispatch plan of ``rank``.  topk_idx: (T, K) slot ids, distinct per row; slot_rank: (P,) ints."""
    rank, R = _check_rank(rank, num_ranks)
    slot_rank = _check_slot_rank(slot_rank, R)
    idx = _check_topk(topk_idx, slot_rank.size)
    T, K = idx.shape
    goes = np.zeros((T, R), dtype=bool)  # goes[t, d]: token t has a slot on rank d
    if T and K:
        goes[np.repeat(np.arange(T), K), slot_rank[idx].reshape(-1)] = True
    # rows in (destination, token) order: the transposed mask's nonzeros, row-major
    dst, tok = np.nonzero(goes.T)
    send_counts = np.bincount(dst, minlength=R).astype(np.int64)
    send_offsets = np.zeros(R + 1, np.int64)
    np.cumsum(send_counts, out=send_offsets[1:])
    combine_row = np.full((T, R), -1, np.int64)
    combine_row[tok, dst] = np.arange(tok.size, dtype=np.int64)
    return SendPlan(rank=rank, num_ranks=R, num_tokens=T, top_k=K, send_counts=send_counts,
                    send_offsets=send_offsets, send_token=tok.astype(np.int64), combine_row=combine_row,
                    peer_order=peer_order(rank, R))


@dataclass(frozen=True)
class RecvPlan:
    """One destination rank's side: the local pairs of the rows it received (docs/kernels.md).

    recv_counts: (R,) int64 rows from each source; recv_offsets: (R+1,) int64;
    slots: (P_r,) int64 global slot of each local slot; counts: (P_r,) int64 pairs per local slot;
    offsets: (P_r+1,) int64; pair_row, pair_k, pair_local: (Np,) int64; row_pair: (N, K) int64.
    """

    rank: int
    num_ranks: int
    top_k: int
    recv_counts: np.ndarray
    recv_offsets: np.ndarray
    slots: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray
    pair_row: np.ndarray
    pair_k: np.ndarray
    pair_local: np.ndarray
    row_pair: np.ndarray

    @property
    def num_recv(self) -> int:
        return int(self.recv_offsets[-1])

    @property
    def num_pairs(self) -> int:
        return int(self.pair_row.size)


def plan_receive(recv_topk_idx, recv_counts, slot_rank, rank: int) -> RecvPlan:
    """The local work of ``rank`` on the rows it received.

    recv_topk_idx: (N, K) slot ids of the received rows (sources ascending, as all_to_all lays
    them out); recv_counts: (R,) rows from each source; slot_rank: (P,) ints. Every row must have
    at least one slot on ``rank`` (else it was sent by mistake).
    """
    slot_rank = np.asarray(slot_rank)
    recv_counts = as_index_array("recv_counts", recv_counts, (None,), np.iinfo(np.int64).max)
    R = recv_counts.size
    rank, R = _check_rank(rank, R)
    slot_rank = _check_slot_rank(slot_rank, R)
    idx = _check_topk(recv_topk_idx, slot_rank.size)
    N, K = idx.shape
    if int(recv_counts.sum()) != N:
        raise InputError(f"recv_counts sum to {int(recv_counts.sum())} but {N} rows were received")
    recv_offsets = np.zeros(R + 1, np.int64)
    np.cumsum(recv_counts, out=recv_offsets[1:])
    slots = local_slots(slot_rank, rank)
    local_of = np.full(slot_rank.size, -1, np.int64)
    local_of[slots] = np.arange(slots.size, dtype=np.int64)
    local = local_of[idx] if N else np.zeros((0, K), np.int64)  # (N, K), -1 where remote
    if N and not (local >= 0).any(axis=1).all():
        bad = int(np.nonzero(~(local >= 0).any(axis=1))[0][0])
        raise InputError(f"received row {bad} has no slot on rank {rank}: {idx[bad].tolist()}")
    row, k = np.nonzero(local >= 0)  # row-major: rows ascending, k ascending
    j = local[row, k]
    order = np.lexsort((row, j))  # by local slot, then row
    pair_row, pair_k, pair_local = row[order].astype(np.int64), k[order].astype(np.int64), j[order]
    counts = np.bincount(pair_local, minlength=slots.size).astype(np.int64)
    offsets = np.zeros(slots.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    row_pair = np.full((N, K), -1, np.int64)
    row_pair[pair_row, pair_k] = np.arange(pair_row.size, dtype=np.int64)
    return RecvPlan(rank=rank, num_ranks=R, top_k=K, recv_counts=recv_counts, recv_offsets=recv_offsets,
                    slots=slots, counts=counts, offsets=offsets, pair_row=pair_row, pair_k=pair_k,
                    pair_local=pair_local, row_pair=row_pair)


@dataclass(frozen=True)
class EPSchedule:
    """The whole exchange for R ranks, as all ranks' plans together (for tests and the simulator)."""

    send: tuple[SendPlan, ...]
    recv: tuple[RecvPlan, ...]

    def traffic(self) -> np.ndarray:
        """(R, R) int64: [src, dst] rows dispatched (combine moves the same rows back)."""
        return np.stack([s.send_counts for s in self.send]) if self.send else np.zeros((0, 0), np.int64)


def plan_ep(topk_idx_per_rank, slot_rank, num_ranks: int) -> EPSchedule:
    """Every rank's plans.  topk_idx_per_rank: R arrays (T_r, K) of slot ids (T_r may differ)."""
    if len(topk_idx_per_rank) != num_ranks:
        raise InputError(f"need one topk_idx per rank: got {len(topk_idx_per_rank)} for {num_ranks} ranks")
    send = tuple(plan_send(t, slot_rank, num_ranks, r) for r, t in enumerate(topk_idx_per_rank))
    ks = [s.top_k for s in send]
    if len(set(ks)) > 1:
        raise InputError(f"every rank's topk_idx needs the same top-k: rank 0 has {ks[0]}, rank "
                         f"{next(r for r, k in enumerate(ks) if k != ks[0])} has "
                         f"{next(k for k in ks if k != ks[0])}")
    recv = []
    for d in range(num_ranks):
        # what all_to_all delivers to d: each source's rows for d, sources ascending
        rows = [np.asarray(topk_idx_per_rank[s], np.int64)[send[s].rows_to(d)] for s in range(num_ranks)]
        K = send[0].top_k
        recv_idx = np.concatenate(rows) if rows else np.zeros((0, K), np.int64)
        recv.append(plan_receive(recv_idx.reshape(-1, K), [s.send_counts[d] for s in send], slot_rank, d))
    return EPSchedule(send=send, recv=tuple(recv))


# --------------------------------------------------------------------------- the one-sided schedule
def _check_positive(name: str, v, *, allow_zero: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise InputError(f"{name} must be an integer, got {v!r}")
    if v < (0 if allow_zero else 1):
        raise InputError(f"{name} must be {'>= 0' if allow_zero else '>= 1'}, got {int(v)}")
    return int(v)


def _exclusive_cumsum(a: np.ndarray, axis: int) -> np.ndarray:
    return np.cumsum(a, axis=axis) - a


def _traffic_of(schedule) -> np.ndarray:
    """(R, R) int64 rows [src, dst] of an EPSchedule (its two sides checked against each other) or of a matrix."""
    if isinstance(schedule, EPSchedule):
        R = len(schedule.send)
        if R == 0 or len(schedule.recv) != R:
            raise InputError(f"schedule must hold one send and one receive plan per rank, got {R} send and "
                             f"{len(schedule.recv)} receive plans")
        traffic = schedule.traffic()
        for d, rp in enumerate(schedule.recv):
            if rp.recv_counts.shape != (R,) or not np.array_equal(rp.recv_counts, traffic[:, d]):
                raise InputError(f"schedule's rank {d} receives {rp.recv_counts.tolist()} rows but its senders "
                                 f"send it {traffic[:, d].tolist()}")
        return traffic
    traffic = as_index_array("traffic", schedule, (None, None), np.iinfo(np.int64).max)
    if traffic.shape[0] != traffic.shape[1] or traffic.shape[0] == 0:
        raise InputError(f"traffic must be a square [R, R] matrix with R >= 1, got {list(traffic.shape)}")
    return traffic


@dataclass(frozen=True)
class PullSchedule:
    """The one-sided exchange of an ``EPSchedule``: every copy each rank performs, in its peer order.

    Shape legend: R ranks, C dispatch copies (pulls) = C' combine copies (pushes), listed rank by rank
    (CSR: ``pull_offsets``, ``push_offsets``). Buffers and copy order: docs/kernels.md. The offsets
    come from the (R, R) traffic matrix alone (no handshake); copies are cut at ``max_rows`` rows.

    Every array is int64: pull_offsets, push_offsets (R+1,); send_rows, recv_rows (R,);
    pull_src, pull_src_row, pull_rows, pull_dst_row, pull_step, pull_bytes (C,);
    push_dst, push_src_row, push_rows, push_dst_row, push_step, push_bytes (C',).
    """

    num_ranks: int
    max_rows: int  # the chunk limit; 0 = copies are not cut
    dispatch_row_bytes: int
    combine_row_bytes: int
    traffic: np.ndarray  # (R, R) rows [src, dst]
    send_rows: np.ndarray
    recv_rows: np.ndarray
    pull_offsets: np.ndarray
    pull_src: np.ndarray
    pull_src_row: np.ndarray
    pull_rows: np.ndarray
    pull_dst_row: np.ndarray
    pull_step: np.ndarray
    pull_bytes: np.ndarray
    push_offsets: np.ndarray
    push_dst: np.ndarray
    push_src_row: np.ndarray
    push_rows: np.ndarray
    push_dst_row: np.ndarray
    push_step: np.ndarray
    push_bytes: np.ndarray

    @property
    def num_pulls(self) -> int:
        return int(self.pull_offsets[-1])

    @property
    def buffer_rows(self) -> int:
        """Rows of one symmetric buffer: the largest send or receive buffer of any rank."""
        return int(max(self.send_rows.max(initial=0), self.recv_rows.max(initial=0)))

    def pulls(self, dst: int) -> slice:
        """The copies ``dst`` performs in dispatch: a slice of the pull_* arrays."""
        return slice(int(self.pull_offsets[dst]), int(self.pull_offsets[dst + 1]))

    def pushes(self, rank: int) -> slice:
        """The copies ``rank`` performs in combine: a slice of the push_* arrays."""
        return slice(int(self.push_offsets[rank]), int(self.push_offsets[rank + 1]))


def _copies(traffic: np.ndarray, max_rows: int, pull: bool):
    """Every rank's copies in its peer order, chunked: (offsets, peer, src_row, rows, dst_row, step)."""
    R = traffic.shape[0]
    send_off = _exclusive_cumsum(traffic, axis=1)  # [s, d]: first row of d's group in s's send buffer
    recv_off = _exclusive_cumsum(traffic, axis=0)  # [s, d]: first row of s's group in d's receive buffer
    a = np.repeat(np.arange(R, dtype=np.int64), R)  # the rank performing the copy, then its steps
    step = np.tile(np.arange(R, dtype=np.int64), R)
    s = (a + step) % R
    n = traffic[s, a]
    if pull:  # from s's send buffer into a's receive buffer
        src_row, dst_row = send_off[s, a], recv_off[s, a]
    else:  # from a's partial buffer (receive layout) into s's combine buffer (send layout)
        src_row, dst_row = recv_off[s, a], send_off[s, a]
    keep = n > 0
    a, step, s, n, src_row, dst_row = a[keep], step[keep], s[keep], n[keep], src_row[keep], dst_row[keep]
    chunks = -(-n // max_rows) if max_rows else np.ones_like(n)
    which = np.repeat(np.arange(n.size, dtype=np.int64), chunks)
    first = np.repeat(_exclusive_cumsum(chunks, axis=0), chunks)
    skip = (np.arange(which.size, dtype=np.int64) - first) * (max_rows if max_rows else 0)
    rows = np.minimum(n[which] - skip, max_rows) if max_rows else n[which]
    offsets = np.zeros(R + 1, np.int64)
    np.cumsum(np.bincount(a[which], minlength=R), out=offsets[1:])
    return (offsets, s[which], src_row[which] + skip, rows.astype(np.int64), dst_row[which] + skip,
            step[which])


def plan_pull(schedule, hidden_size: int, element_size: int, *, max_rows: int | None = None,
              meta_bytes: int = 0, combine_element_size: int | None = None) -> PullSchedule:
    """The one-sided dispatch (pulls) and combine (push-backs) of ``schedule`` (see ``PullSchedule``).

    schedule: an ``EPSchedule`` or its (R, R) traffic matrix [src, dst]; element_size: bytes of a
    dispatched element; meta_bytes: further bytes per dispatched row; combine_element_size: bytes
    of a partial element (default element_size); max_rows: the most rows one copy moves (None: uncut).
    """
    traffic = _traffic_of(schedule)
    H = _check_positive("hidden_size", hidden_size)
    es = _check_positive("element_size", element_size)
    ces = es if combine_element_size is None else _check_positive("combine_element_size", combine_element_size)
    meta = _check_positive("meta_bytes", meta_bytes, allow_zero=True)
    m = 0 if max_rows is None else _check_positive("max_rows", max_rows)
    R = traffic.shape[0]
    d_bytes, c_bytes = H * es + meta, H * ces
    pull = _copies(traffic, m, pull=True)
    push = _copies(traffic, m, pull=False)
    return PullSchedule(
        num_ranks=R, max_rows=m, dispatch_row_bytes=d_bytes, combine_row_bytes=c_bytes,
        traffic=traffic.copy(), send_rows=traffic.sum(axis=1), recv_rows=traffic.sum(axis=0),
        pull_offsets=pull[0], pull_src=pull[1], pull_src_row=pull[2], pull_rows=pull[3], pull_dst_row=pull[4],
        pull_step=pull[5], pull_bytes=pull[3] * d_bytes,
        push_offsets=push[0], push_dst=push[1], push_src_row=push[2], push_rows=push[3], push_dst_row=push[4],
        push_step=push[5], push_bytes=push[3] * c_bytes)


# --------------------------------------------------------------------------- the exchanges, emulated
def _check_buffers(name: str, buffers, rows: np.ndarray) -> list[np.ndarray]:
    R = rows.size
    if len(buffers) != R:
        raise InputError(f"need one {name} per rank: got {len(buffers)} for {R} ranks")
    out = [np.asarray(b) for b in buffers]
    for r, b in enumerate(out):
        if b.ndim < 1 or b.shape[0] != rows[r]:
            raise InputError(f"{name} of rank {r} must have {int(rows[r])} rows, got shape {list(b.shape)}")
        if b.shape[1:] != out[0].shape[1:] or b.dtype != out[0].dtype:
            raise InputError(f"{name} of rank {r} is {b.dtype} {list(b.shape[1:])} per row, rank 0's is "
                             f"{out[0].dtype} {list(out[0].shape[1:])}: every rank's must match")
    return out


def all_to_all_rows(buffers, counts) -> list[np.ndarray]:
    """What ``all_to_all_single`` delivers.  counts: (R, R) [a, b] rows rank a sends rank b; buffers:
    R arrays, a's rows grouped by destination ascending -> R arrays, b's rows grouped by source ascending."""
    counts = _traffic_of(counts)
    bufs = _check_buffers("buffer", buffers, counts.sum(axis=1))
    off = np.concatenate([np.zeros((counts.shape[0], 1), np.int64), np.cumsum(counts, axis=1)], axis=1)
    return [np.concatenate([bufs[a][off[a, b]:off[a, b + 1]] for a in range(counts.shape[0])])
            for b in range(counts.shape[0])]


def _check_order(order, offsets: np.ndarray) -> np.ndarray:
    """A global order of the copies that keeps each rank's own copies in their schedule order."""
    C = int(offsets[-1])
    if order is None:
        return np.arange(C, dtype=np.int64)
    order = as_index_array("order", order, (C,), max(C, 1))
    if np.unique(order).size != C:
        raise InputError(f"order must list each of the {C} copies once")
    owner = np.searchsorted(offsets, order, side="right") - 1
    for r in range(offsets.size - 1):
        mine = order[owner == r]
        if np.any(np.diff(mine) < 0):
            raise InputError(f"order runs rank {r}'s copies out of their schedule order: {mine.tolist()}")
    return order


def _run_copies(peer, src_row, rows, dst_row, offsets, src_of, dst_of, srcs, dst_rows, order, what):
    """Perform the copies in ``order``; every destination row must be written exactly once."""
    R = offsets.size - 1
    out = [np.zeros((int(dst_rows[r]), *srcs[0].shape[1:]), srcs[0].dtype) for r in range(R)]
    written = [np.zeros(int(dst_rows[r]), np.int64) for r in range(R)]
    owner = np.repeat(np.arange(R, dtype=np.int64), np.diff(offsets))
    for c in _check_order(order, offsets).tolist():
        a, p = int(owner[c]), int(peer[c])
        s, d = src_of(a, p), dst_of(a, p)
        lo, hi, n = int(src_row[c]), int(dst_row[c]), int(rows[c])
        if n < 1 or lo < 0 or lo + n > srcs[s].shape[0] or hi < 0 or hi + n > out[d].shape[0]:
            raise InputError(f"{what} copy {c} (rank {a}) moves rows {lo}:{lo + n} of rank {s}'s "
                             f"{srcs[s].shape[0]} to {hi}:{hi + n} of rank {d}'s {out[d].shape[0]}")
        out[d][hi:hi + n] = srcs[s][lo:lo + n]
        written[d][hi:hi + n] += 1
    for d in range(R):
        if written[d].size and not (written[d] == 1).all():
            bad = int(np.nonzero(written[d] != 1)[0][0])
            raise InputError(f"{what} writes row {bad} of rank {d} {int(written[d][bad])} times (not once)")
    return out


def pull_rows(pull: PullSchedule, send_buffers, *, order=None) -> list[np.ndarray]:
    """Dispatch, one-sided: each rank fills its receive buffer by pulling from the peers' send buffers.

    send_buffers: R arrays (send_rows[s], ...) -> R receive buffers (recv_rows[d], ...), equal to
    ``all_to_all_rows(send_buffers, pull.traffic)``. ``order``: a global order of the C copies
    (default: rank by rank), any interleaving of the ranks that keeps each rank's own order.
    """
    srcs = _check_buffers("send buffer", send_buffers, pull.send_rows)
    return _run_copies(pull.pull_src, pull.pull_src_row, pull.pull_rows, pull.pull_dst_row, pull.pull_offsets,
                       lambda a, p: p, lambda a, p: a, srcs, pull.recv_rows, order, "dispatch")


def push_rows(pull: PullSchedule, partial_buffers, *, order=None) -> list[np.ndarray]:
    """Combine, one-sided: each computing rank writes its partial rows into their sources' combine buffers.

    -> R combine buffers, equal to ``all_to_all_rows(partial_buffers, pull.traffic.T)``."""
    srcs = _check_buffers("partial buffer", partial_buffers, pull.recv_rows)
    return _run_copies(pull.push_dst, pull.push_src_row, pull.push_rows, pull.push_dst_row, pull.push_offsets,
                       lambda a, p: a, lambda a, p: p, srcs, pull.send_rows, order, "combine")


TRANSPORTS = ("all_to_all", "pull")


def ep_experts_forward(xs, topk_slots, topk_weights, slot_expert, slot_rank, weights, config, *,
                       transport: str = "all_to_all", max_rows: int | None = None,
                       fp8_activations: bool | None = None) -> list[np.ndarray]:
    """The routed experts, expert-parallel over R simulated ranks, in float64 -> R arrays y (T_r, H).

    xs: R arrays (T_r, H); topk_slots: R arrays (T_r, K) slot ids (distinct per row); topk_weights:
    R arrays (T_r, K); slot_expert, slot_rank: (P,) a placement's arrays; weights: MoEWeights with
    the full experts. The steps of kernels/ep.py's ``ep_moe_experts``, in the orders of the module
    docstring. ``transport``: "all_to_all" or "pull" (``plan_pull``, chunked by ``max_rows``): the
    two give bitwise the same y.
    """
    if transport not in TRANSPORTS:
        raise InputError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if not isinstance(config, MoEConfig):
        raise InputError(f"config must be a MoEConfig, got {type(config).__name__}")
    if not isinstance(weights, MoEWeights):
        raise InputError(f"weights must be a MoEWeights, got {type(weights).__name__}")
    if config.weight_on_input:
        raise NotImplementedError("expert parallelism with weights on the expert input (Llama 4) is not built")
    weights = weights.to_numpy().validate(config)
    if fp8_activations is None:
        fp8_activations = weights.is_fp8
    if weights.is_fp8:
        weights = weights.dequantize()
    R = len(xs)
    if R < 1 or len(topk_slots) != R or len(topk_weights) != R:
        raise InputError(f"need xs, topk_slots and topk_weights for every rank: got {len(xs)}, {len(topk_slots)} "
                         f"and {len(topk_weights)}")
    slot_rank = _check_slot_rank(slot_rank, R)
    slot_expert = as_index_array("slot_expert", slot_expert, slot_rank.shape, config.num_experts)
    H, K = config.hidden_size, config.top_k
    xs = [as_float_array(f"xs[{r}]", x, (None, H)) for r, x in enumerate(xs)]
    idx = [_check_topk(t, slot_rank.size) for t in topk_slots]
    ws = [as_float_array(f"topk_weights[{r}]", w, (xs[r].shape[0], K)) for r, w in enumerate(topk_weights)]
    for r in range(R):
        if idx[r].shape != (xs[r].shape[0], K):
            raise InputError(f"topk_slots[{r}] must have shape [{xs[r].shape[0]}, {K}], got {list(idx[r].shape)}")
    sched = plan_ep(idx, slot_rank, R)
    traffic = sched.traffic()
    sends = [(xs[r][sp.send_token], idx[r][sp.send_token], ws[r][sp.send_token]) for r, sp in enumerate(sched.send)]
    pull = plan_pull(sched, H, 8, max_rows=max_rows, meta_bytes=K * 16) if transport == "pull" else None

    def move(bufs):
        return all_to_all_rows(bufs, traffic) if pull is None else pull_rows(pull, bufs)

    def back(bufs):
        return all_to_all_rows(bufs, traffic.T) if pull is None else push_rows(pull, bufs)

    rx, ridx, rw = (move([s[i] for s in sends]) for i in range(3))
    partials = []
    for d in range(R):
        rp = plan_receive(ridx[d], traffic[:, d], slot_rank, d)
        out = np.zeros((rp.num_pairs, H))
        for j, g in enumerate(rp.slots.tolist()):
            lo, hi = int(rp.offsets[j]), int(rp.offsets[j + 1])
            if hi == lo:
                continue
            e = int(slot_expert[g])
            out[lo:hi] = expert_ffn(rx[d][rp.pair_row[lo:hi]], weights.gate_up[e], weights.down[e], config,
                                    None if weights.gate_up_bias is None else weights.gate_up_bias[e],
                                    None if weights.down_bias is None else weights.down_bias[e],
                                    fp8_activations=fp8_activations)
        part = np.zeros((rp.num_recv, H))
        for k in range(K):
            m = rp.row_pair[:, k] >= 0
            part[m] += rw[d][m, k, None] * out[rp.row_pair[m, k]]
        partials.append(part)
    combined = back(partials)
    ys = []
    for r, sp in enumerate(sched.send):
        y = np.zeros((sp.num_tokens, H))
        for d in range(R):
            m = sp.combine_row[:, d] >= 0
            y[m] += combined[r][sp.combine_row[m, d]]
        ys.append(y)
    return ys
