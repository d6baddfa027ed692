"""The expert-parallel layer over torch.distributed (gloo, CPU) against the float64 reference of the layer.

One spawn of R processes per world size runs every scenario (spawning costs seconds, the scenarios
milliseconds); each rank saves its output, the test process compares. Float32 on the CPU (the
torch expert path of kernels/ep.py), so the float32 row of reference/tolerance.py applies, with the
reference computed from the float32-rounded inputs and weights.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from megamoe.reference import MoEConfig, assert_close, moe_forward, random_weights, round_to_dtype  # noqa: E402
from megamoe.simulator.placement import Placement, contiguous, eplb  # noqa: E402

SCENARIOS = {
    # name: why
    "contiguous": "uneven tokens per rank (one rank has none), experts split in order, a shared expert",
    "skew_eplb": "routing skewed onto two experts, EPLB placement with replicas of the hot ones",
    "one_rank_all": "every slot on the last rank: the others send everything and compute nothing",
    "p2p": "the send/recv fallback transport on the contiguous case: bitwise equal to all_to_all",
}
CFG = MoEConfig(hidden_size=32, intermediate_size=16, num_experts=8, top_k=2, num_shared_experts=1,
                shared_intermediate_size=16)


def _tokens(R: int) -> list[int]:
    return [9, 16] if R == 2 else [12, 0, 7, 21]


def _inputs(name: str, R: int):
    """(weights rounded to float32, per-rank x rounded to float32, placement): the same in every process."""
    w = random_weights(CFG, seed=11)
    w = type(w)(**{k: None if v is None else round_to_dtype(v, "float32") for k, v in vars(w).items()})
    rng = np.random.default_rng(5)
    T = _tokens(R)
    x = rng.standard_normal((sum(T), CFG.hidden_size))
    if name == "skew_eplb":  # pull tokens towards experts 0 and 1: most pairs land there
        d = w.router_weight[0] + w.router_weight[1]
        x = x + 3.0 * d / np.linalg.norm(d) * np.sqrt(CFG.hidden_size) / 2
    x = round_to_dtype(x, "float32")
    xs = np.split(x, np.cumsum(T)[:-1])
    E = CFG.num_experts
    if name == "skew_eplb":
        load = np.bincount(moe_forward(x, w, CFG, details=True).routing.topk_idx.reshape(-1), minlength=E)
        placement = eplb(load, R, num_slots=E + R)
    elif name == "one_rank_all":
        s = np.arange(E, dtype=np.int64)
        placement = Placement("custom", E, R, s, np.full(E, R - 1, np.int64))
    else:
        placement = contiguous(E, R)
    return w, xs, placement


def _worker(rank: int, R: int, out_dir: str) -> None:
    from megamoe.ep import ep_layer, placement_arrays
    from megamoe.kernels.ep import shard_weights
    from megamoe.reference import MoEWeights

    for name in SCENARIOS:
        w, xs, placement = _inputs(name, R)
        wt = MoEWeights(**{k: None if v is None else torch.from_numpy(v).float() for k, v in vars(w).items()})
        shard = shard_weights(w, CFG, *placement_arrays(placement), rank, R, dtype=torch.float32, device="cpu")
        x = torch.from_numpy(xs[rank]).float()
        transport = "p2p" if name == "p2p" else "auto"
        y = ep_layer(x, wt, CFG, shard, placement, transport=transport)
        y2 = ep_layer(x, wt, CFG, shard, placement, transport=transport)
        assert torch.equal(y, y2), f"{name}: two runs differ"
        np.save(f"{out_dir}/{name}_{rank}.npy", y.numpy())
    dist.barrier()


@pytest.mark.parametrize("R", [2, 4], ids=["2-ranks", "4-ranks"])
def test_ep_layer_matches_reference(tmp_path, R):
    from megamoe.ep import launch

    launch(_worker, R, (str(tmp_path),), backend="gloo", timeout_s=600)  # a hang guard only
    for name in SCENARIOS:
        w, xs, placement = _inputs(name, R)
        for r in range(R):
            y = np.load(tmp_path / f"{name}_{r}.npy")
            assert y.shape == xs[r].shape and y.dtype == np.float32
            if xs[r].shape[0]:
                assert_close(y, moe_forward(xs[r], w, CFG), "float32", what=f"{name} rank {r} of {R}")
            if name == "p2p":
                assert np.array_equal(y, np.load(tmp_path / f"contiguous_{r}.npy")), "p2p differs from all_to_all"
    # the skewed scenario is skewed and EPLB replicated its hot experts
    w, xs, placement = _inputs("skew_eplb", R)
    load = np.bincount(moe_forward(np.concatenate(xs), w, CFG, details=True).routing.topk_idx.reshape(-1),
                       minlength=CFG.num_experts)
    assert load.max() > 2.5 * load.mean() and placement.num_slots > CFG.num_experts


def _hang(rank: int, R: int) -> None:
    if rank == 0:
        dist.barrier()  # rank 1 never joins: a hang
    else:
        import time

        time.sleep(60)


def test_launch_times_out_instead_of_hanging():
    from megamoe.ep import launch

    with pytest.raises(TimeoutError, match="did not finish"):
        launch(_hang, 2, backend="gloo", timeout_s=5)


def _worker_kernels(rank: int, R: int, out_dir: str) -> None:
    """The contiguous scenario with the single-GPU kernels (moe_experts) as the local expert path."""
    from megamoe.ep import ep_layer, placement_arrays
    from megamoe.kernels.ep import shard_weights
    from megamoe.reference import MoEWeights

    w, xs, placement = _inputs("contiguous", R)
    wt = MoEWeights(**{k: None if v is None else torch.from_numpy(v).float() for k, v in vars(w).items()})
    shard = shard_weights(w, CFG, *placement_arrays(placement), rank, R, dtype=torch.float32, device="cpu")
    y = ep_layer(torch.from_numpy(xs[rank]).float(), wt, CFG, shard, placement, backend="kernels")
    np.save(f"{out_dir}/kernels_{rank}.npy", y.numpy())


@pytest.mark.interpret
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through the kernels need the interpreter")
def test_ep_layer_with_the_kernels_under_the_interpreter(tmp_path):
    """The GPU's local path (moe_experts, top-1 per pair) run by Triton's interpreter in each rank."""
    import os

    from megamoe.ep import launch

    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by conftest; the spawned ranks inherit it
    R = 2
    launch(_worker_kernels, R, (str(tmp_path),), backend="gloo", timeout_s=600)  # a hang guard only
    w, xs, _ = _inputs("contiguous", R)
    for r in range(R):
        assert_close(np.load(tmp_path / f"kernels_{r}.npy"), moe_forward(xs[r], w, CFG), "float32",
                     what=f"kernels backend rank {r}")
