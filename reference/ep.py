"""The expert-parallel schedule as data: which rows each rank sends to which peer, and back.

Shape legend: R ranks (GPUs), T tokens on one rank, K top-k, P expert slots (P = E without
replicas), N rows one rank sends (or receives), Np (row, slot) pairs one rank computes.

Each rank r starts with its own T tokens, routed to expert *slots* ``topk_idx`` (T, K); a slot
lives on rank ``slot_rank[slot]`` (from a placement: the caller turns the simulator's
``Placement.slot_rank`` into this plain array, and expert ids into slot ids with its
``assign_slots``). Dispatch sends a token to each rank holding one of its slots *once* however many
of its slots live there (DeepEP's dispatch), together with its topk_idx and topk_weights rows; the
receiver runs each of the row's local slots and sums them in k order into one partial row;
combine sends the partial rows back to the same places, and the source adds them up, ranks in
ascending order. Every order is fixed, so the result is bitwise deterministic.

Layouts (what ``all_to_all_single`` needs: buffers grouped by peer id, ascending):

    send side (``plan_send``, on the source)
        send_token (N,)     token of each send row: rows grouped by destination rank, ascending,
                            tokens ascending inside a group; destination d owns rows
                            send_offsets[d]:send_offsets[d+1]
        combine_row (T, R)  row of the send (= combine's return) buffer carrying token t to rank d,
                            -1 where t sends nothing to d:  y[t] = sum_{d asc, row >= 0} back[row]
        peer_order (R,)     the order a one-sided transport visits peers: (r + i) % R, so at
                            step i every rank talks to a different peer (and starts with itself)
    receive side (``plan_receive``, on the destination)
        recv rows           grouped by source rank ascending, each group in the sender's order
        pair_row, pair_k    (Np,) the (row, k) of each local pair, sorted by (local slot, row), so
        pair_local          each local slot's pairs are contiguous: offsets[j]:offsets[j+1]
        row_pair (N, K)     index of pair (row, k) in the pair order, -1 where slot k is remote:
                            partial[row] = sum_{k asc, row_pair >= 0} w[row, k] * out[row_pair]

Pure NumPy and deterministic; the torch transport (kernels/ep.py) and the simulator read the same
counts (``traffic`` equals ``dispatch.rank_traffic`` with dedup).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import InputError, as_index_array


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
    idx = as_index_array("topk_idx", topk_idx, (None, None), num_slots)
    if idx.shape[0] and idx.shape[1] > 1:
        s = np.sort(idx, axis=1)
        dup = np.nonzero((s[:, 1:] == s[:, :-1]).any(axis=1))[0]
        if dup.size:
            raise InputError(f"topk_idx row {int(dup[0])} names a slot twice: {idx[dup[0]].tolist()}")
    return idx


def local_slots(slot_rank, rank: int) -> np.ndarray:
    """(P_r,) int64 slot ids held by ``rank``, ascending: local slot j is global slot local_slots[j]."""
    return np.nonzero(np.asarray(slot_rank) == rank)[0].astype(np.int64)


def peer_order(rank: int, num_ranks: int) -> np.ndarray:
    """(R,) int64 peers in the order ``rank`` visits them: itself, then rank+1, ... (mod R)."""
    rank, num_ranks = _check_rank(rank, num_ranks)
    return (rank + np.arange(num_ranks, dtype=np.int64)) % num_ranks


@dataclass(frozen=True)
class SendPlan:
    """One source rank's side of dispatch and combine (see the module docstring).

    send_counts: (R,) int64 rows to each destination; send_offsets: (R+1,) int64;
    send_token: (N,) int64; combine_row: (T, R) int64; peer_order: (R,) int64.
    """

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
    """One destination rank's side: the local pairs of the rows it received (module docstring).

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
    recv = []
    for d in range(num_ranks):
        # what all_to_all delivers to d: each source's rows for d, sources ascending
        rows = [np.asarray(topk_idx_per_rank[s], np.int64)[send[s].rows_to(d)] for s in range(num_ranks)]
        K = send[0].top_k
        recv_idx = np.concatenate(rows) if rows else np.zeros((0, K), np.int64)
        recv.append(plan_receive(recv_idx.reshape(-1, K), [s.send_counts[d] for s in send], slot_rank, d))
    return EPSchedule(send=send, recv=tuple(recv))
