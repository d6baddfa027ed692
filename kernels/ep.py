"""Expert parallelism over torch.distributed: dispatch, the local experts, combine.

Shape legend: R ranks, T tokens on this rank, K top-k, H hidden, I expert width, P expert slots,
P_r slots on this rank, N rows sent (or received) by this rank, Np (row, slot) pairs it computes.

``ep_moe_experts`` (each rank holds its slots' weights, ``shard_weights``): plan_send; all-to-all
of the counts, then of x rows (N, H), topk_idx (N, K) int64 and topk_weights (N, K) fp32;
plan_receive and the local experts (``local_partials``, one partial row per received row); the
partial rows back, y[t] = their fp32 sum over ranks ascending in x's dtype. Bitwise the same run to
run. Transport ``all_to_all_single`` or ``all_to_all_p2p``; every process needs ``TRANSPORT_ENV``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.distributed as dist

from ..reference.config import MoEConfig
from ..reference.ep import local_slots, peer_order, plan_receive, plan_send
from .torch_ffn import gated_activation

#: Set in every process before any communicator is made (NVLink multicast is left off on these hosts).
TRANSPORT_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
TRANSPORTS = ("auto", "all_to_all", "p2p")
BACKENDS = ("auto", "kernels", "torch")


class EPInputError(ValueError):
    """An input of the expert-parallel layer is unusable; the message says which and why."""


class TransportEnvError(EPInputError, RuntimeError):
    """A variable of ``TRANSPORT_ENV`` is unset or has another value in this process."""


def check_transport_env() -> None:
    """Raise TransportEnvError unless every variable of ``TRANSPORT_ENV`` is set in this process."""
    bad = {k: os.environ.get(k) for k, v in TRANSPORT_ENV.items() if os.environ.get(k) != v}
    if bad:
        raise TransportEnvError(f"expert parallelism needs {TRANSPORT_ENV} in every process; here {bad}. "
                           f"Launch through megamoe.ep.launch (or set them before torch.distributed starts).")


@dataclass(frozen=True)
class EPShard:
    """One rank's share of the routed experts: slot_rank (P,), slots (P_r,) int64 ascending; gate_up
    (P_r, 2I, H); down (P_r, H, I); biases (P_r, 2I), (P_r, H) or None; x's dtype and device."""

    rank: int
    num_ranks: int
    slot_rank: np.ndarray
    slots: np.ndarray
    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None
    activation: str
    alpha: float
    limit: float

    @property
    def num_slots(self) -> int:
        return int(self.slot_rank.size)


def shard_weights(weights, config: MoEConfig, slot_expert, slot_rank, rank: int, num_ranks: int, *,
                  dtype: torch.dtype, device) -> EPShard:
    """The slots of ``rank`` cut from full weights; slot_expert, slot_rank: (P,) a placement's arrays."""
    if config.weight_on_input:
        raise NotImplementedError("expert parallelism with weights on the expert input (Llama 4) is not built")
    slot_expert = np.asarray(slot_expert, np.int64)
    slot_rank = np.asarray(slot_rank, np.int64)
    if slot_expert.shape != slot_rank.shape or slot_expert.ndim != 1:
        raise EPInputError(f"slot_expert {list(slot_expert.shape)} and slot_rank {list(slot_rank.shape)} must be "
                           f"equal 1-D shapes")
    if slot_rank.size and (slot_rank.min() < 0 or slot_rank.max() >= num_ranks):
        raise EPInputError(f"slot_rank must lie in [0, {num_ranks}), got {slot_rank.min()}..{slot_rank.max()}")
    slots = local_slots(slot_rank, rank)
    experts = torch.from_numpy(slot_expert[slots])

    def cut(a):
        if a is None:
            return None
        t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.asarray(a))
        return t[experts.to(t.device)].to(device=device, dtype=dtype).contiguous()

    return EPShard(rank=rank, num_ranks=num_ranks, slot_rank=slot_rank, slots=slots, gate_up=cut(weights.gate_up),
                   down=cut(weights.down), gate_up_bias=cut(weights.gate_up_bias), down_bias=cut(weights.down_bias),
                   activation=config.activation, alpha=config.swiglu_alpha, limit=config.swiglu_limit)


# --------------------------------------------------------------------------- transport
def all_to_all_p2p(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                   group=None) -> None:
    """``all_to_all_single`` from isend/irecv, peers in the order (rank + i) % R. Rows grouped by peer."""
    rank, R = dist.get_rank(group), dist.get_world_size(group)
    in_off = np.concatenate([[0], np.cumsum(in_splits)]).astype(int)
    out_off = np.concatenate([[0], np.cumsum(out_splits)]).astype(int)
    out[out_off[rank]:out_off[rank + 1]].copy_(inp[in_off[rank]:in_off[rank + 1]])
    ops = []
    for i, to in enumerate(peer_order(rank, R)[1:].tolist(), start=1):
        frm = (rank - i) % R  # the peer whose step i sends to this rank
        if in_splits[to]:
            ops.append(dist.P2POp(dist.isend, inp[in_off[to]:in_off[to + 1]].contiguous(),
                                  dist.get_global_rank(group, to) if group is not None else to, group))
        if out_splits[frm]:
            ops.append(dist.P2POp(dist.irecv, out[out_off[frm]:out_off[frm + 1]],
                                  dist.get_global_rank(group, frm) if group is not None else frm, group))
    if ops:
        for w in dist.batch_isend_irecv(ops):
            w.wait()


@cache
def _has_all_to_all(backend: str) -> bool:
    """Whether the process group's backend implements all_to_all_single (probed once per backend)."""
    t = torch.zeros(dist.get_world_size(), device="cuda" if backend == "nccl" else "cpu")
    try:
        dist.all_to_all_single(torch.empty_like(t), t)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def resolve_transport(transport: str, group=None) -> str:
    if transport not in TRANSPORTS:
        raise EPInputError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
    if transport != "auto":
        return transport
    return "all_to_all" if _has_all_to_all(str(dist.get_backend(group))) else "p2p"


def exchange(inp: torch.Tensor, in_splits: list[int], out_splits: list[int], transport: str, group=None) -> torch.Tensor:
    """Rows of ``inp`` grouped by destination -> rows received, grouped by source (both ascending)."""
    out = inp.new_empty((sum(out_splits), *inp.shape[1:]))
    if transport == "p2p":
        all_to_all_p2p(out, inp, out_splits, in_splits, group)
    else:
        dist.all_to_all_single(out, inp.contiguous(), out_splits, in_splits, group=group)
    return out


# --------------------------------------------------------------------------- local experts
def _torch_experts(xp: torch.Tensor, wp: torch.Tensor, shard: EPShard, counts: np.ndarray) -> torch.Tensor:
    """Pairs sorted by local slot, counts[j] of slot j: w * expert_j(x) in x's dtype (the CPU path)."""
    out = torch.empty_like(xp)
    I = shard.down.shape[2]
    lo = 0
    for j, n in enumerate(counts.tolist()):
        if n == 0:
            continue
        h = xp[lo:lo + n] @ shard.gate_up[j].t()
        if shard.gate_up_bias is not None:
            h = h + shard.gate_up_bias[j]
        a = gated_activation(h, I, shard.activation, shard.alpha, shard.limit)
        o = a @ shard.down[j].t()
        if shard.down_bias is not None:
            o = o + shard.down_bias[j]
        out[lo:lo + n] = (o.float() * wp[lo:lo + n, None]).to(xp.dtype)
        lo += n
    return out


def _local_experts(xp, wp, local, shard: EPShard, counts: np.ndarray, backend: str) -> torch.Tensor:
    """(Np, H) rows, (Np,) fp32 weights, (Np,) local slot ids -> (Np, H) weighted expert outputs."""
    if xp.shape[0] == 0:
        return xp.clone()
    if backend == "torch":
        return _torch_experts(xp, wp, shard, counts)
    from .moe import moe_experts  # the single-GPU path, one slot per pair

    return moe_experts(xp, local[:, None], wp[:, None], shard.gate_up, shard.down, shard.gate_up_bias,
                       shard.down_bias, activation=shard.activation, alpha=shard.alpha, limit=shard.limit,
                       deterministic=True)


def _sum_rows(rows: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """out[i] = sum_{j asc, index[i, j] >= 0} rows[index[i, j]] in fp32, a fixed order.  index (M, J)."""
    M, J = index.shape
    padded = torch.cat([rows.float(), rows.new_zeros((1, rows.shape[1]), dtype=torch.float32)])
    idx = torch.from_numpy(np.where(index >= 0, index, rows.shape[0])).to(rows.device)
    acc = padded.new_zeros((M, rows.shape[1]))
    for j in range(J):
        acc = acc + padded[idx[:, j]]
    return acc


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """"kernels" or "torch" for ``backend`` ("auto": the kernels on CUDA, torch on the CPU)."""
    if backend not in BACKENDS:
        raise EPInputError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "kernels" if x.is_cuda else "torch"
    return backend


def check_routing(x: torch.Tensor, topk_idx, topk_weights: torch.Tensor) -> np.ndarray:
    """(T, K) int64 slot ids as a host array, after checking x (T, H), topk_idx and topk_weights (T, K)."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise EPInputError(f"x must be a [T, H] tensor, got {type(x).__name__} of shape "
                           f"{list(getattr(x, 'shape', []))}")
    T = x.shape[0]
    idx_np = (topk_idx.detach().cpu().numpy() if isinstance(topk_idx, torch.Tensor) else np.asarray(topk_idx))
    if idx_np.ndim != 2 or idx_np.shape[0] != T or tuple(topk_weights.shape) != idx_np.shape:
        raise EPInputError(f"topk_idx and topk_weights must both be [T={T}, K], got {list(idx_np.shape)} and "
                           f"{list(topk_weights.shape)}")
    return idx_np.astype(np.int64)


def local_partials(rx: torch.Tensor, ridx: np.ndarray, rw: torch.Tensor, recv_counts, shard: EPShard, backend: str,
                   dtype: torch.dtype) -> torch.Tensor:
    """Step 3 on the received rows: rx (N, H), ridx (N, K) int64 slot ids (host), rw (N, K) fp32, recv_counts
    (R,) rows from each source -> (N, H) partial rows in ``dtype``: 0 + w_k * expert_k(row), k ascending."""
    dev = rx.device
    rp = plan_receive(ridx, recv_counts, shard.slot_rank, shard.rank)
    pr = torch.from_numpy(rp.pair_row).to(dev)
    pk = torch.from_numpy(rp.pair_k).to(dev)
    out = _local_experts(rx[pr].contiguous(), rw[pr, pk].contiguous(), torch.from_numpy(rp.pair_local).to(dev),
                         shard, rp.counts, backend)
    return _sum_rows(out, rp.row_pair).to(dtype)


def combine_partials(back: torch.Tensor, combine_row: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Step 4's sum: y[t] = 0 + back[combine_row[t, d]] over ranks d ascending, fp32, in ``dtype``."""
    return _sum_rows(back, combine_row).to(dtype)


def ep_moe_experts(x: torch.Tensor, topk_idx, topk_weights: torch.Tensor, shard: EPShard, group=None, *,
                   transport: str = "auto", backend: str = "auto") -> torch.Tensor:
    """The routed experts, expert-parallel.  x: (T, H) this rank's tokens; topk_idx: (T, K) slot ids
    (distinct per row); topk_weights: (T, K) float -> y (T, H) in x's dtype. Collective (own T each).
    ``backend``: "kernels" (moe_experts), "torch" (a loop of torch GEMMs), "auto" (kernels on CUDA).
    """
    backend = resolve_backend(backend, x)
    transport = resolve_transport(transport, group)
    rank, R = dist.get_rank(group), dist.get_world_size(group)
    if (rank, R) != (shard.rank, shard.num_ranks):
        raise EPInputError(f"shard is for rank {shard.rank} of {shard.num_ranks}, this is rank {rank} of {R}")
    idx_np = check_routing(x, topk_idx, topk_weights)
    T, K = idx_np.shape
    dev = x.device
    sp = plan_send(idx_np, shard.slot_rank, R, rank)
    # 1. counts: what each peer sends me
    recv_counts = exchange(torch.from_numpy(sp.send_counts).to(dev), [1] * R, [1] * R, transport, group).cpu().numpy()
    send_splits, recv_splits = sp.send_counts.tolist(), recv_counts.tolist()
    # 2. dispatch: the rows, their slot ids and their weights
    send_tok = torch.from_numpy(sp.send_token).to(dev)
    w32 = topk_weights.to(torch.float32).reshape(T, K)
    idx_t = torch.from_numpy(idx_np).to(dev)
    rx = exchange(x[send_tok], send_splits, recv_splits, transport, group)
    ridx = exchange(idx_t[send_tok], send_splits, recv_splits, transport, group)
    rw = exchange(w32[send_tok], send_splits, recv_splits, transport, group)
    # 3. the local pairs, by local slot; one partial row per received row
    partial = local_partials(rx, ridx.cpu().numpy(), rw, recv_counts, shard, backend, x.dtype)
    # 4. combine: partial rows back where they came from, summed over ranks ascending
    back = exchange(partial, recv_splits, send_splits, transport, group)
    return combine_partials(back, sp.combine_row, x.dtype)


__all__ = ["BACKENDS", "TRANSPORTS", "TRANSPORT_ENV", "EPInputError", "EPShard", "TransportEnvError", "all_to_all_p2p",
           "check_routing", "check_transport_env", "combine_partials", "ep_moe_experts", "exchange", "local_partials",
           "peer_order", "resolve_backend", "resolve_transport", "shard_weights"]
