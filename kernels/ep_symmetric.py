"""One-sided expert parallelism: ep_moe_experts with pulls and push-backs through symmetric memory.

Shape legend: R ranks, T tokens on this rank, K top-k, H hidden, S rows of a send (and combine)
buffer, N rows of a receive buffer, C_r the copies of one rank.

Every rank owns one symmetric allocation (``SymmetricBuffers``: send, combine, flags (2, R) int64
READY / LANDED); receive buffers are local. A call (``SymmetricStep``) runs pack (signal READY),
pull (after each peer's READY), compute (kernels.ep.local_partials), push (signal LANDED) and
finish (after every LANDED: y summed ranks ascending, bitwise ep_moe_experts' y). Waits are
bounded (FlagTimeoutError); the memory order: docs/kernels.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import triton
import triton.language as tl

from ..reference.ep import PullSchedule, plan_pull, plan_send
from ..reference.ep_tasks import META_BYTES_PER_PICK, auto_max_rows, pair_positions, slot_pair_counts
from .ep import (
    EPInputError,
    EPShard,
    check_routing,
    check_transport_env,
    combine_partials,
    local_partials,
    resolve_backend,
)
from .ep_fused import device_plan, fused_programs, launch_fused, plan_for
from .ep_pull import ReadyWait, _interpreting, copy_table, launch_copies, note_timeout, wait_flag
from .jit_keys import settle

#: rows of the flags region: flags[READY, s] (s packed its send buffers), flags[LANDED, c] (c's pushes landed)
READY, LANDED = 0, 1
FLAG_NAMES = ("send-ready", "push-landed")
#: polls per program before a wait gives up (about a minute on a GPU)
EMULATED_SPIN_LIMIT = 8
GPU_SPIN_LIMIT = 1 << 28
#: byte alignment of each region of the symmetric allocation
ALIGN = 256


class FlagTimeoutError(RuntimeError):
    """A bounded flag wait ran out: a peer never signalled this call (it raised, hangs, or is elsewhere)."""


@triton.jit
def _signal_kernel(peer_flags, epoch, slot, R: tl.constexpr):
    """epoch[0] += 1, then write it into word ``slot`` of every peer's flags (release, system scope)."""
    e = tl.load(epoch) + 1
    tl.store(epoch, e)
    for p in range(R):
        flag = tl.load(peer_flags + p).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(flag + slot, e, sem="release", scope="sys")


@triton.jit
def _wait_kernel(flags, n, epoch, spin_limit, status, KIND: tl.constexpr):
    """Wait until flags[i] >= epoch[0] for i < n (acquire, system scope), ``spin_limit`` polls in all."""
    want = tl.load(epoch)
    budget = spin_limit
    for i in range(n):
        seen, budget = wait_flag(flags + i, want, budget)
        if seen < want:
            note_timeout(status, want * 0 + i, seen, KIND)


def _region(offset: int, nbytes: int) -> tuple[int, int]:
    return offset, -(-(offset + nbytes) // ALIGN) * ALIGN


@dataclass(frozen=True)
class BufferLayout:
    """The symmetric allocation of one rank for at most ``max_tokens`` tokens per rank."""

    num_ranks: int
    max_tokens: int
    hidden_size: int
    top_k: int
    dtype: torch.dtype

    def __post_init__(self):
        for name in ("num_ranks", "max_tokens", "hidden_size", "top_k"):
            v, least = getattr(self, name), 0 if name == "max_tokens" else 1
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
                raise EPInputError(f"{name} must be an integer >= {least}, got {v!r}")
        if not isinstance(self.dtype, torch.dtype) or not self.dtype.is_floating_point:
            raise EPInputError(f"dtype must be a floating torch.dtype (x's), got {self.dtype!r}")

    @property
    def send_rows(self) -> int:
        return int(self.max_tokens) * min(int(self.top_k), int(self.num_ranks))

    @property
    def recv_rows(self) -> int:
        return int(self.max_tokens) * int(self.num_ranks)

    def regions(self) -> dict[str, tuple[int, tuple[int, ...], torch.dtype]]:
        """name -> (byte offset, shape, dtype) of every region of the allocation."""
        S, H, K, R = self.send_rows, self.hidden_size, self.top_k, self.num_ranks
        shapes = {"send_x": ((S, H), self.dtype), "send_idx": ((S, K), torch.int64),
                  "send_w": ((S, K), torch.float32), "send_pos": ((S, K), torch.int64), "combine": ((S, H), self.dtype),
                  "flags": ((2, R), torch.int64)}
        out, off = {}, 0
        for name, (shape, dt) in shapes.items():
            start, off = _region(off, int(np.prod(shape)) * dt.itemsize)
            out[name] = (start, shape, dt)
        return out

    @property
    def total_bytes(self) -> int:
        start, shape, dt = self.regions()["flags"]
        return _region(start, int(np.prod(shape)) * dt.itemsize)[1]


class SymmetricBuffers:
    """One rank's buffers and the addresses of its peers'.

    Symmetric: send_x (S, H), send_idx (S, K) int64, send_w (S, K) fp32, send_pos (S, K) int64 (each
    pair's position among the sender's rows of its slot), combine (S, H), flags (2, R) int64. Local:
    recv_x (N, H), recv_idx (N, K), recv_w (N, K), epoch (2,) int64, status (3,) int64 (first timeout:
    peer + 1, value, flag row + 1). ``peers[name]``: (R,) int64 addresses of region ``name``."""

    def __init__(self, rank: int, layout: BufferLayout, storage: torch.Tensor, bases: list[int], *,
                 spin_limit: int, emulated: bool, keep: tuple = ()):
        self.rank, self.num_ranks, self.layout = rank, layout.num_ranks, layout
        self.device, self.emulated, self.spin_limit = storage.device, emulated, int(spin_limit)
        self._keep = (storage, *keep)  # the allocation (and the peers' or the handle) live as long as these views
        self.peers, self.aligned = {}, {}
        for name, (off, shape, dt) in layout.regions().items():
            setattr(self, name, storage[off:off + int(np.prod(shape)) * dt.itemsize].view(dt).view(shape))
            addrs = [b + off for b in bases]
            self.peers[name] = torch.tensor(addrs, dtype=torch.int64, device=self.device)
            self.aligned[name] = all(a % 16 == 0 for a in addrs)
        N, H, K = layout.recv_rows, layout.hidden_size, layout.top_k
        self.recv_x = torch.empty((N, H), dtype=layout.dtype, device=self.device)
        self.recv_idx = torch.empty((N, K), dtype=torch.int64, device=self.device)
        self.recv_w = torch.empty((N, K), dtype=torch.float32, device=self.device)
        self.epoch = torch.zeros(2, dtype=torch.int64, device=self.device)
        self.status = torch.zeros(3, dtype=torch.int64, device=self.device)
        self.calls = [0, 0]  # host copy of epoch, for messages
        self.broken = False

    @classmethod
    def allocate(cls, max_tokens: int, hidden_size: int, top_k: int, dtype: torch.dtype, group=None, *,
                 device=None, spin_limit: int = GPU_SPIN_LIMIT) -> SymmetricBuffers:
        """This rank's buffers in torch symmetric memory (collective over ``group``)."""
        check_transport_env()
        if not dist.is_available() or not dist.is_initialized():
            raise EPInputError("SymmetricBuffers.allocate needs torch.distributed initialized (one process per GPU: "
                               "megamoe.ep.launch with backend='nccl'); SymmetricBuffers.emulated runs in one process")
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type != "cuda":
            raise EPInputError(f"symmetric memory lives on a CUDA device, got {device}")
        import torch.distributed._symmetric_memory as symm_mem

        rank, R = dist.get_rank(group), dist.get_world_size(group)
        layout = BufferLayout(R, max_tokens, hidden_size, top_k, dtype)
        group_name = (group if group is not None else dist.group.WORLD).group_name
        if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 11):  # deprecated (a no-op) since 2.11
            symm_mem.enable_symm_mem_for_group(group_name)
        storage = symm_mem.empty(layout.total_bytes, dtype=torch.uint8, device=device)
        handle = symm_mem.rendezvous(storage, group_name)
        bases = [int(p) for p in handle.buffer_ptrs]
        # the tensor's place in its symmetric segment (0 unless a pool shares the segment), the same on every rank
        offset = storage.data_ptr() - bases[rank]
        if len(bases) != R or offset < 0:
            raise RuntimeError(f"symmetric memory gave {len(bases)} buffer addresses for {R} ranks and this rank's "
                               f"tensor at {offset} bytes from its own: cannot address the peers")
        storage.zero_()
        torch.cuda.synchronize(device)
        dist.barrier(group=group)  # every rank's flags are zero before any peer signals into them
        return cls(rank, layout, storage, [b + offset for b in bases], spin_limit=spin_limit, emulated=False,
                   keep=(handle,))

    @classmethod
    def emulated(cls, num_ranks: int, max_tokens: int, hidden_size: int, top_k: int, dtype: torch.dtype, *,
                 device="cpu", spin_limit: int = EMULATED_SPIN_LIMIT) -> list[SymmetricBuffers]:
        """R ranks' buffers in this process, on one device (CPU under TRITON_INTERPRET=1, or one GPU)."""
        device = torch.device(device)
        if device.type == "cpu" and not _interpreting():
            raise EPInputError("emulated buffers on the CPU: the Triton kernels run there only with TRITON_INTERPRET=1 "
                               "set before triton is imported")
        if device.type not in ("cpu", "cuda"):
            raise EPInputError(f"emulated buffers live on the CPU or a CUDA device, got {device}")
        layout = BufferLayout(num_ranks, max_tokens, hidden_size, top_k, dtype)
        storages = [torch.zeros(layout.total_bytes, dtype=torch.uint8, device=device) for _ in range(layout.num_ranks)]
        bases = [int(s.data_ptr()) for s in storages]
        return [cls(r, layout, storages[r], bases, spin_limit=spin_limit, emulated=True, keep=tuple(storages))
                for r in range(layout.num_ranks)]

    def poison(self) -> None:
        """Every byte of the send, combine and receive buffers 0xFF; flags, epoch and status left alone."""
        for t in (self.send_x, self.send_idx, self.send_w, self.send_pos, self.combine, self.recv_x, self.recv_idx,
                  self.recv_w):
            t.view(torch.uint8).fill_(255)

    def check_fits(self, pull: PullSchedule) -> None:
        """EPInputError unless every rank's rows of ``pull`` fit (the same answer on every rank)."""
        lay = self.layout
        if pull.num_ranks != self.num_ranks:
            raise EPInputError(f"the schedule is for {pull.num_ranks} ranks, the buffers for {self.num_ranks}")
        for what, rows, room in (("sends", pull.send_rows, lay.send_rows), ("receives", pull.recv_rows, lay.recv_rows)):
            if rows.size and int(rows.max()) > room:
                r = int(rows.argmax())
                raise EPInputError(f"buffers too small for this routing: rank {r} {what} {int(rows.max())} rows, the "
                                   f"buffers hold {room} (allocated for {lay.max_tokens} tokens per rank); allocate them "
                                   f"for more tokens")

    def signal(self, kind: int) -> None:
        """Bump epoch[kind] and publish it in flags[kind, rank] of every peer."""
        self.calls[kind] += 1
        _signal_kernel[(1,)](self.peers["flags"], self.epoch[kind:kind + 1], kind * self.num_ranks + self.rank,
                             R=self.num_ranks)

    def ready_wait(self) -> ReadyWait:
        """The pull's wait: flags[READY, peer] >= epoch[READY]."""
        return ReadyWait(self.flags[READY], self.epoch[READY:READY + 1], self.spin_limit, self.status)

    def wait_landed(self) -> None:
        """Wait (on the device) until every rank's pushes of this call landed here."""
        _wait_kernel[(1,)](self.flags[LANDED], self.num_ranks, self.epoch[LANDED:LANDED + 1], self.spin_limit,
                           self.status, KIND=LANDED + 1)

    def raise_on_timeout(self) -> None:
        """FlagTimeoutError if a wait ran out (reads the status word: a sync on a GPU)."""
        peer, seen, kind = (int(v) for v in self.status.tolist())
        if peer:
            self.broken = True
            k = kind - 1
            raise FlagTimeoutError(
                f"rank {self.rank} waited for rank {peer - 1}'s {FLAG_NAMES[k]} flag of call {self.calls[k]} and "
                f"read {seen} after {self.spin_limit} polls (the spin limit): rank {peer - 1} did not signal this "
                f"call (it raised, hangs, or runs another call). These buffers are unusable now: make new ones.")


def _check_traffic(traffic, num_ranks: int, rank: int, send_counts: np.ndarray) -> np.ndarray:
    t = np.asarray(traffic)
    if t.shape != (num_ranks, num_ranks) or t.dtype.kind not in "iu" or (t.size and t.min() < 0):
        raise EPInputError(f"traffic must be an (R, R) = ({num_ranks}, {num_ranks}) array of row counts >= 0, got "
                           f"{t.dtype} {list(t.shape)}")
    if not np.array_equal(t[rank], send_counts):
        raise EPInputError(f"traffic row {rank} is {t[rank].tolist()} but this rank's routing sends "
                           f"{send_counts.tolist()} rows")
    return t.astype(np.int64)


class SymmetricStep:
    """One rank's part of one call, in phases called in this order: pack, pull, compute, push, finish.

    x: (T, H); topk_idx: (T, K) slot ids; topk_weights: (T, K); traffic: (R, R) rows [src, dst] or
    a callable from this rank's (R,) send counts. fused: pull, compute and push as one launch
    (kernels/ep_fused.py), needing ``slot_counts`` (R, P) or a callable from this rank's (P,) counts."""

    PHASES = ("pack", "pull", "compute", "push", "finish")

    def __init__(self, buffers: SymmetricBuffers, shard: EPShard, x: torch.Tensor, topk_idx, topk_weights, traffic, *,
                 max_rows: int | None = None, backend: str = "auto", num_programs: int | None = None,
                 fused: bool = False, slot_counts=None):
        if not isinstance(buffers, SymmetricBuffers):
            raise EPInputError(f"buffers must be SymmetricBuffers, got {type(buffers).__name__}")
        if buffers.broken:
            raise EPInputError(f"the buffers of rank {buffers.rank} are unusable after a flag timeout: make new ones")
        lay, rank, R = buffers.layout, buffers.rank, buffers.num_ranks
        if (shard.rank, shard.num_ranks) != (rank, R):
            raise EPInputError(f"shard is for rank {shard.rank} of {shard.num_ranks}, the buffers for rank {rank} of {R}")
        # the fused launch exists only as Triton kernels: "auto" takes them on the CPU too (the interpreter's)
        self.backend = "kernels" if fused and backend == "auto" else resolve_backend(backend, x)
        idx = check_routing(x, topk_idx, topk_weights)
        T, K = idx.shape
        if (x.shape[1], K, x.dtype) != (lay.hidden_size, lay.top_k, lay.dtype) or x.device != buffers.device:
            raise EPInputError(f"x is {x.dtype} [T, H={x.shape[1]}] on {x.device} with K={K}, the buffers are for "
                               f"{lay.dtype} H={lay.hidden_size}, K={lay.top_k} on {buffers.device}")
        self.buffers, self.shard, self.x, self.num_programs = buffers, shard, x, num_programs
        self.send = plan_send(idx, shard.slot_rank, R, rank)
        traffic = _check_traffic(traffic(self.send.send_counts) if callable(traffic) else traffic, R, rank,
                                 self.send.send_counts)
        self.fused = bool(fused)
        if self.fused and max_rows is None:  # cut the copies so that the launch's programs share them
            max_rows = auto_max_rows(traffic, num_programs or fused_programs(x.device))
        meta = K * (META_BYTES_PER_PICK if self.fused else 12)  # topk_idx and weights (and the fused positions)
        self.plan = plan_pull(traffic, lay.hidden_size, x.element_size(), max_rows=max_rows, meta_bytes=meta)
        buffers.check_fits(self.plan)
        dev = x.device
        self.pulls = copy_table(self.plan, push=False)[self.plan.pulls(rank)]
        self.pushes = copy_table(self.plan, push=True)[self.plan.pushes(rank)]
        self._pulls_dev = torch.from_numpy(self.pulls).to(dev)
        self._pushes_dev = torch.from_numpy(self.pushes).to(dev)
        self.idx = torch.from_numpy(idx).to(dev)
        self.w = topk_weights.to(device=dev, dtype=torch.float32).reshape(T, K)
        self.partial = None
        self._next = 0
        self.trace = None  # fused: an int64 (tasks, 4) GPU tensor set before pull() records the launch's tasks
        if self.fused:
            if self.backend != "kernels":
                raise EPInputError(f"fused=True runs the Triton kernels: backend must be 'kernels' or 'auto', got "
                                   f"{backend!r}")
            if x.device.type == "cpu" and not _interpreting():
                raise EPInputError("fused=True on CPU tensors runs the Triton kernels under the interpreter only: set "
                                   "TRITON_INTERPRET=1 before triton is imported")
            P = shard.num_slots
            mine = slot_pair_counts(idx, P)
            counts = np.asarray(slot_counts(mine) if callable(slot_counts) else slot_counts)
            if slot_counts is None or counts.shape != (R, P) or counts.dtype.kind not in "iu":
                raise EPInputError(f"fused=True needs slot_counts: the (R, P) = ({R}, {P}) integer rows of every "
                                   f"rank per slot, got {None if slot_counts is None else list(counts.shape)}")
            if not np.array_equal(counts[rank], mine):
                raise EPInputError(f"slot_counts row {rank} is {counts[rank].tolist()} but this rank's routing has "
                                   f"{mine.tolist()} rows per slot")
            self.pos = torch.from_numpy(pair_positions(idx, P)).to(dev)
            self.fused_plan, self.tiles = plan_for(shard, self.plan, counts.astype(np.int64), K, x.dtype, dev)
            self.fused_buffers = device_plan(self.fused_plan, shard.slot_rank, int(self.plan.recv_rows[rank]), x.dtype,
                                             dev)

    def _enter(self, phase: str) -> None:
        want = self.PHASES[self._next] if self._next < len(self.PHASES) else "none (the call is over)"
        if phase != want:
            raise RuntimeError(f"rank {self.buffers.rank}: phase {phase!r} called out of order, the next is {want!r}")
        self._next += 1

    def pack(self) -> None:
        """This rank's rows into its send buffers; signal READY."""
        self._enter("pack")
        b, n = self.buffers, self.send.num_send
        if n:
            tok = torch.from_numpy(self.send.send_token).to(self.x.device)
            b.send_x[:n] = self.x[tok]
            b.send_idx[:n] = self.idx[tok]
            b.send_w[:n] = self.w[tok]
            if self.fused:
                b.send_pos[:n] = self.pos[tok]
        b.signal(READY)

    def pull(self) -> None:
        """The rows for this rank from every peer, each after that peer's READY flag."""
        self._enter("pull")
        b = self.buffers
        if self.fused:  # pulls, the local experts and the push-backs: one launch
            launch_fused(self.fused_plan, self.tiles, self.fused_buffers, self.shard, b, self._pulls_dev,
                         self._pushes_dev, int(self.plan.recv_rows[b.rank]), num_programs=self.num_programs,
                         trace=self.trace)
            return
        for i, (local, name) in enumerate(((b.recv_idx, "send_idx"), (b.recv_w, "send_w"), (b.recv_x, "send_x"))):
            launch_copies(self.pulls, local, b.peers[name], push=False, aligned=b.aligned[name],
                          num_programs=self.num_programs, copies_dev=self._pulls_dev,
                          ready=b.ready_wait() if i == 0 else None)

    def compute(self) -> None:
        """The local experts on the received rows (host planning, as ep_moe_experts)."""
        self._enter("compute")
        if self.fused:  # done by the pull phase's launch
            return
        b, rank = self.buffers, self.buffers.rank
        b.raise_on_timeout()
        n = int(self.plan.recv_rows[rank])
        self.partial = local_partials(b.recv_x[:n], b.recv_idx[:n].cpu().numpy(), b.recv_w[:n],
                                      self.plan.traffic[:, rank], self.shard, self.backend, self.x.dtype)

    def push(self) -> None:
        """The partial rows into their sources' combine buffers; signal LANDED."""
        self._enter("push")
        b = self.buffers
        if self.fused:  # the launch pushed; publish it
            b.signal(LANDED)
            return
        launch_copies(self.pushes, self.partial, b.peers["combine"], push=True, aligned=b.aligned["combine"],
                      num_programs=self.num_programs, copies_dev=self._pushes_dev)
        b.signal(LANDED)

    def finish(self) -> torch.Tensor:
        """Wait for every rank's pushes, then y (T, H) in x's dtype."""
        self._enter("finish")
        b = self.buffers
        b.wait_landed()
        b.raise_on_timeout()
        return combine_partials(b.combine[:self.send.num_send], self.send.combine_row, self.x.dtype)


def _gather_traffic(group, device):
    """A callable: this rank's (R,) send counts -> the (R, R) traffic, all-gathered over ``group``."""
    def gather(counts: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(counts).to(device)
        rows = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(rows, t, group=group)
        return torch.stack(rows).cpu().numpy()
    return gather


def ep_moe_experts_symmetric(x: torch.Tensor, topk_idx, topk_weights: torch.Tensor, shard: EPShard,
                             buffers: SymmetricBuffers, group=None, *, traffic=None, max_rows: int | None = None,
                             backend: str = "auto", num_programs: int | None = None,
                             fused: bool = False) -> torch.Tensor:
    """The routed experts, expert-parallel, one-sided: bitwise ``kernels.ep.ep_moe_experts``' y.

    x: (T, H); topk_idx: (T, K) slot ids; topk_weights: (T, K) -> y (T, H) in x's dtype. Collective:
    every rank of ``group`` calls it with its own T (0 allowed) on ``SymmetricBuffers.allocate``'s
    buffers. traffic: (R, R) if known, else all-gathered; fused: one launch (kernels/ep_fused.py)."""
    check_transport_env()
    if isinstance(buffers, SymmetricBuffers) and buffers.emulated and buffers.num_ranks > 1:
        raise EPInputError("these buffers are emulated (every rank in this process): run them with "
                           "ep_moe_experts_emulated")
    rank, R = dist.get_rank(group), dist.get_world_size(group)
    if isinstance(buffers, SymmetricBuffers) and (rank, R) != (buffers.rank, buffers.num_ranks):
        raise EPInputError(f"buffers are for rank {buffers.rank} of {buffers.num_ranks}, this is rank {rank} of {R}")
    if fused:
        idx = check_routing(x, topk_idx, topk_weights)
        mine = np.concatenate([plan_send(idx, shard.slot_rank, R, rank).send_counts,
                               slot_pair_counts(idx, shard.num_slots)])
        both = _gather_traffic(group, x.device)(mine)  # (R, R + P): send counts, then rows per slot
        traffic, slot_counts = both[:, :R], both[:, R:]
    else:
        slot_counts = None
    step = SymmetricStep(buffers, shard, x, topk_idx, topk_weights,
                         _gather_traffic(group, x.device) if traffic is None else traffic,
                         max_rows=max_rows, backend=backend, num_programs=num_programs, fused=fused,
                         slot_counts=slot_counts)
    step.pack()
    step.pull()
    step.compute()
    step.push()
    return step.finish()


def ep_moe_experts_emulated(xs, topk_idx, topk_weights, shards, buffers, *, max_rows: int | None = None,
                            backend: str = "torch", num_programs: int | None = None, fused: bool = False,
                            steps_out: list | None = None) -> list[torch.Tensor]:
    """Every rank of ``SymmetricBuffers.emulated`` in this process, phase by phase -> R arrays y (T_r, H)."""
    R = len(buffers)
    if not R or any(not isinstance(b, SymmetricBuffers) or not b.emulated for b in buffers):
        raise EPInputError("buffers must be the list SymmetricBuffers.emulated returned")
    if [b.rank for b in buffers] != list(range(R)) or buffers[0].num_ranks != R:
        raise EPInputError(f"buffers must be ranks 0..{buffers[0].num_ranks - 1} in order, got ranks "
                           f"{[b.rank for b in buffers]}")
    for name, v in (("xs", xs), ("topk_idx", topk_idx), ("topk_weights", topk_weights), ("shards", shards)):
        if len(v) != R:
            raise EPInputError(f"need one of {name} per rank: got {len(v)} for {R} ranks")
    idx = [check_routing(xs[r], topk_idx[r], topk_weights[r]) for r in range(R)]
    traffic = np.stack([plan_send(idx[r], shards[r].slot_rank, R, r).send_counts for r in range(R)])
    slots = np.stack([slot_pair_counts(idx[r], shards[r].num_slots) for r in range(R)]) if fused else None
    steps = [SymmetricStep(buffers[r], shards[r], xs[r], topk_idx[r], topk_weights[r], traffic, max_rows=max_rows,
                           backend=backend, num_programs=num_programs, fused=fused, slot_counts=slots)
             for r in range(R)]
    if steps_out is not None:
        steps_out.extend(steps)
    for phase in SymmetricStep.PHASES[:-1]:
        for s in steps:
            getattr(s, phase)()
    return [s.finish() for s in steps]


__all__ = ["EMULATED_SPIN_LIMIT", "GPU_SPIN_LIMIT", "LANDED", "READY", "BufferLayout", "FlagTimeoutError",
           "SymmetricBuffers", "SymmetricStep", "ep_moe_experts_emulated", "ep_moe_experts_symmetric"]


settle(globals())  # every JIT function's cache key, callees first (jit_keys.py)
