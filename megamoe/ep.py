"""The expert-parallel layer end to end, and the process launcher that every EP run goes through.

Shape legend: R ranks, T tokens on one rank, E experts, P slots, K top-k, H hidden.

``ep_layer``: one rank's layer (route its tokens, pick slots of a ``simulator.placement``, the
kernels' ``ep_moe_experts``, the shared MLP). ``launch``: one spawned process per rank with
``TRANSPORT_ENV`` set, joined on a free TCP port; TimeoutError (children killed) past ``timeout_s``.
"""

from __future__ import annotations

import os
import socket
import time


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, nprocs: int, port: int, backend: str, args: tuple, pg_timeout_s: float) -> None:
    import datetime

    from megamoe.kernels.ep import TRANSPORT_ENV, check_transport_env

    os.environ.update(TRANSPORT_ENV)
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nprocs,
                            timeout=datetime.timedelta(seconds=pg_timeout_s),
                            **({"device_id": torch.device("cuda", rank)} if backend == "nccl" else {}))
    check_transport_env()
    try:
        fn(rank, nprocs, *args)
        dist.barrier()  # every rank done before any tears down: gloo aborted a rank that was still sending
    finally:
        dist.destroy_process_group()


def launch(fn, nprocs: int, args: tuple = (), *, backend: str = "gloo", timeout_s: float = 120.0) -> None:
    """Run ``fn(rank, nprocs, *args)`` (a module-level function) in ``nprocs`` spawned processes of
    one process group. Raises the first child's error, or TimeoutError after ``timeout_s``."""
    import torch.multiprocessing as mp

    from megamoe.kernels.ep import TRANSPORT_ENV

    os.environ.update(TRANSPORT_ENV)  # children inherit them; _entry sets them again
    ctx = mp.start_processes(_entry, args=(fn, nprocs, free_port(), backend, tuple(args), max(timeout_s, 10.0)),
                             nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"expert-parallel run of {nprocs} processes did not finish in {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
        for p in ctx.processes:
            p.join(5)


def placement_arrays(placement):
    """(slot_expert, slot_rank): a simulator Placement as the two plain (P,) int64 arrays EP takes."""
    import numpy as np

    return np.asarray(placement.slot_expert, np.int64).copy(), np.asarray(placement.slot_rank, np.int64).copy()


def slots_for(topk_expert, rank: int, placement):
    """(T, K) expert ids of ``rank``'s tokens -> slot ids (a replica on this rank if there is one)."""
    import numpy as np

    from megamoe.simulator.placement import assign_slots

    e = np.asarray(topk_expert, np.int64)
    return assign_slots(e, np.full(e.shape[0], rank, np.int64), placement)


def shared_mlp(x, w, cfg):
    """The shared experts on this rank's own tokens (torch, x's dtype): (T, H) -> (T, H), or None."""
    import torch
    import torch.nn.functional as F

    if not cfg.num_shared_experts:
        return None
    Is = cfg.shared_intermediate_size
    h = x @ w.shared_gate_up.t()
    y = (F.silu(h[:, :Is]) * h[:, Is:]) @ w.shared_down.t()
    if w.shared_gate is not None:
        y = y * torch.sigmoid(x @ w.shared_gate)[:, None]
    return y


def ep_layer(x, w, cfg, shard, placement, group=None, *, transport: str = "auto", backend: str = "auto"):
    """The MoE layer on this rank's tokens, experts expert-parallel. x: (T, H) -> y (T, H), x's dtype.
    ``w``: the router and shared weights (tensors in x's dtype); ``shard``: ``kernels.ep.shard_weights``'s."""
    from megamoe.kernels.bench import torch_route
    from megamoe.kernels.ep import ep_moe_experts

    tw, ti = torch_route(x, w, cfg)
    slots = slots_for(ti.cpu().numpy(), shard.rank, placement)
    y = ep_moe_experts(x, slots, tw, shard, group, transport=transport, backend=backend)
    s = shared_mlp(x, w, cfg)
    return y if s is None else (y.float() + s.float()).to(x.dtype)
