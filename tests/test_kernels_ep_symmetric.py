"""The one-sided expert-parallel layer (kernels/ep_symmetric.py) against the all-to-all path, bitwise.

Emulated ranks (``SymmetricBuffers.emulated``: every rank's buffers in this process, phases run
rank after rank) on the ``device`` fixture: CPU tensors under the Triton interpreter here, one
GPU's memory with the compiled kernels (flags included) on a GPU machine. Routings and placements
are tests/test_reference_ep_pull.py's scenarios (R = 1..4, EPLB replicas, T = 0 on a rank, idle
ranks, one expert in every row). The bitwise target is the all-to-all path of kernels/ep.py
(``ep_moe_experts``' steps, local_partials and combine_partials, with its exchanges done by
reference.ep.all_to_all_rows, an exact copy); the float64 reference.ep.ep_experts_forward(transport=
"pull") is the accuracy check. Buffers start poisoned (every byte 0xFF: NaN, -1), so a row read
before it is written shows. The multi-GPU test at the bottom runs only with two GPUs or more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_reference_ep_pull import CFG, _scenario

from megamoe.reference import assert_close, round_to_dtype
from megamoe.reference.ep import all_to_all_rows, ep_experts_forward, plan_send, pull_rows, push_rows

pytestmark = pytest.mark.interpret

# (scenario of test_reference_ep_pull, max_rows, why)
CASES = [
    ("one-rank", None, "R = 1: every copy is the rank's own"),
    ("two-ranks", 1, "two ranks, copies of one row each"),
    ("three-eplb", None, "EPLB with replicas of the hot experts on other ranks"),
    ("three-random", 1, "a rank with T = 0, one-row copies"),
    ("four-rr", 3, "four ranks, one without tokens, copies of up to 3 rows"),
    ("four-empty", None, "T = 0 everywhere: nothing moves, the flags still advance"),
    ("four-hot", None, "one expert in every token's top-k"),
    ("four-one-rank", 1, "every slot on the last rank: ranks 0-2 compute nothing"),
]


def _rounded(name: str, dtype: str):
    """A scenario with its weights and tokens rounded to ``dtype``, its routing weights to float32."""
    w, xs, slots, tw, placement, _ = _scenario(name)
    w = type(w)(**{k: None if v is None else round_to_dtype(v, dtype) for k, v in vars(w).items()})
    return w, [round_to_dtype(x, dtype) for x in xs], slots, [round_to_dtype(t, "float32") for t in tw], placement


def _inputs(name: str, device):
    """(weights, xs, slots, topk weights, placement, shards), rounded to the device's dtype."""
    from megamoe.kernels.ep import shard_weights

    w, xs, slots, tw, placement = _rounded(name, device.dtype)
    R = len(xs)
    shards = [shard_weights(w, CFG, placement.slot_expert, placement.slot_rank, r, R, dtype=device.torch_dtype(),
                            device=device.name) for r in range(R)]
    return w, xs, slots, tw, placement, shards


def _tensors(xs, tw, device):
    return [device.tensor(x) for x in xs], [device.tensor(t, "float32") for t in tw]


def _a2a(bufs: list[torch.Tensor], counts: np.ndarray) -> list[torch.Tensor]:
    """all_to_all_single's delivery, through the reference (rows copied exactly, bf16 as its bits)."""
    dev, dt = bufs[0].device, bufs[0].dtype
    as_np = [b.detach().cpu().view(torch.int16).numpy() if dt == torch.bfloat16 else b.detach().cpu().numpy()
             for b in bufs]
    out = [torch.from_numpy(np.ascontiguousarray(a)) for a in all_to_all_rows(as_np, counts)]
    return [(o.view(torch.bfloat16) if dt == torch.bfloat16 else o).to(dev) for o in out]


def _all_to_all_path(xs, slots, tws, shards) -> list[torch.Tensor]:
    """kernels.ep.ep_moe_experts' steps on R ranks in this process (its exchanges by the reference)."""
    from megamoe.kernels.ep import combine_partials, local_partials

    R = len(xs)
    sends = [plan_send(s, shards[r].slot_rank, R, r) for r, s in enumerate(slots)]
    traffic = np.stack([sp.send_counts for sp in sends])
    rows = [torch.from_numpy(sp.send_token).to(xs[0].device) for sp in sends]
    rx = _a2a([x[t] for x, t in zip(xs, rows)], traffic)
    ridx = _a2a([torch.from_numpy(np.asarray(s, np.int64))[t.cpu()] for s, t in zip(slots, rows)], traffic)
    rw = _a2a([w[t] for w, t in zip(tws, rows)], traffic)
    partials = [local_partials(rx[d], ridx[d].cpu().numpy(), rw[d], traffic[:, d], shards[d], "torch", xs[0].dtype)
                for d in range(R)]
    back = _a2a(partials, traffic.T)
    return [combine_partials(back[r], sends[r].combine_row, xs[0].dtype) for r in range(R)]


def _buffers(R: int, max_tokens: int, device, **kw):
    from megamoe.kernels.ep_symmetric import SymmetricBuffers

    bufs = SymmetricBuffers.emulated(R, max_tokens, CFG.hidden_size, CFG.top_k, device.torch_dtype(),
                                     device=device.name, **kw)
    for b in bufs:
        b.poison()
    return bufs


@pytest.mark.parametrize("name,max_rows", [c[:2] for c in CASES], ids=[c[0] for c in CASES])
def test_layer_equals_the_all_to_all_path(device, name, max_rows):
    """Bitwise the all-to-all path on every rank; close to the float64 layer of the reference."""
    from megamoe.kernels.ep_symmetric import ep_moe_experts_emulated

    w, xs, slots, tw, placement, shards = _inputs(name, device)
    R = len(xs)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(R, max(1, max(x.shape[0] for x in xs)), device)
    ys = ep_moe_experts_emulated(xt, slots, twt, shards, bufs, max_rows=max_rows)
    want = _all_to_all_path(xt, slots, twt, shards)
    ref = ep_experts_forward(xs, slots, tw, placement.slot_expert, placement.slot_rank, w, CFG, transport="pull",
                             max_rows=max_rows)
    for r in range(R):
        assert ys[r].shape == (xs[r].shape[0], CFG.hidden_size) and ys[r].dtype == device.torch_dtype()
        assert torch.equal(ys[r], want[r]), f"rank {r} differs from the all-to-all path"
        if xs[r].shape[0]:
            assert_close(ys[r].float().cpu().numpy(), ref[r], device.dtype, what=f"{name} rank {r}")
    assert all(b.epoch.tolist() == [1, 1] and (b.flags == 1).all() for b in bufs)


def test_phases_move_the_reference_rows(device):
    """Phase by phase (SymmetricStep): the receive buffers are reference.ep.pull_rows of the packed send
    buffers, the combine buffers push_rows of the partial rows; the rows past each rank's share stay poisoned."""
    from megamoe.kernels.ep_symmetric import SymmetricStep

    _, xs, slots, tw, _, shards = _inputs("four-rr", device)
    R = 4
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(R, 24, device)  # more room than needed: the tails must stay untouched
    counts = np.stack([plan_send(s, shards[r].slot_rank, R, r).send_counts for r, s in enumerate(slots)])
    # the local experts by the same torch GEMMs as _all_to_all_path ("auto" takes the Triton kernels on a GPU,
    # whose sums are not the torch GEMMs' bits: H200 run BV failed the last check below so, every copy equal)
    steps = [SymmetricStep(bufs[r], shards[r], xt[r], slots[r], twt[r], counts, max_rows=2, backend="torch")
             for r in range(R)]
    plan = steps[0].plan
    for s in steps:
        s.pack()
    for s in steps:
        s.pull()
    bits = [b.send_x[:n].cpu().view(torch.int32).numpy() for b, n in zip(bufs, plan.send_rows)]
    want = pull_rows(plan, bits)
    for d, b in enumerate(bufs):
        n = int(plan.recv_rows[d])
        np.testing.assert_array_equal(b.recv_x[:n].cpu().view(torch.int32).numpy(), want[d])
        assert torch.isnan(b.recv_x[n:].float()).all() and (b.recv_idx[n:] == -1).all()
        np.testing.assert_array_equal(b.recv_idx[:n].cpu().numpy(),
                                      pull_rows(plan, [c.send_idx[:m].cpu().numpy() for c, m in
                                                       zip(bufs, plan.send_rows)])[d])
    for s in steps:
        s.compute()
    for s in steps:
        s.push()
    back = push_rows(plan, [s.partial.cpu().view(torch.int32).numpy() for s in steps])
    for r, b in enumerate(bufs):
        n = int(plan.send_rows[r])
        np.testing.assert_array_equal(b.combine[:n].cpu().view(torch.int32).numpy(), back[r])
        assert torch.isnan(b.combine[n:].float()).all()
    ys = [s.finish() for s in steps]
    for r, (y, w) in enumerate(zip(ys, _all_to_all_path(xt, slots, twt, shards))):
        assert torch.equal(y, w), f"rank {r}: max |y - all-to-all| = {(y.float() - w.float()).abs().max().item():.3e}"
    with pytest.raises(RuntimeError, match="phase 'finish' called out of order, the next is 'none"):
        steps[0].finish()


def test_consecutive_calls_reuse_the_buffers(device):
    """Three calls on the same buffers, no reset: other routings each time, the data buffers poisoned
    between calls (only the flags and epochs carry over); each call equals fresh buffers' result."""
    from megamoe.kernels.ep_symmetric import ep_moe_experts_emulated

    bufs = _buffers(4, 24, device)
    for call, name in enumerate(["four-rr", "four-hot", "four-empty"], start=1):
        _, xs, slots, tw, _, shards = _inputs(name, device)
        xt, twt = _tensors(xs, tw, device)
        ys = ep_moe_experts_emulated(xt, slots, twt, shards, bufs, max_rows=4)
        assert all(torch.equal(y, w) for y, w in zip(ys, _all_to_all_path(xt, slots, twt, shards))), name
        assert all(b.epoch.tolist() == [call, call] and b.calls == [call, call] for b in bufs)
        assert all((b.flags == call).all() for b in bufs)
        for b in bufs:
            b.poison()


@pytest.mark.parametrize("skip", ["pack", "push"])
def test_a_flag_never_set_raises(device, skip):
    """Rank 1 skips a phase: rank 0's bounded wait gives up and names the rank, the peer, the flag and the call;
    the buffers then refuse further calls."""
    from megamoe.kernels.ep import EPInputError
    from megamoe.kernels.ep_symmetric import FlagTimeoutError, SymmetricStep, ep_moe_experts_emulated

    _, xs, slots, tw, _, shards = _inputs("two-ranks", device)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(2, 16, device)
    ep_moe_experts_emulated(xt, slots, twt, shards, bufs)  # call 1 goes through; the error names call 2
    counts = np.stack([plan_send(s, shards[r].slot_rank, 2, r).send_counts for r, s in enumerate(slots)])
    assert counts[1, 0] > 0  # rank 0 pulls from rank 1
    steps = [SymmetricStep(bufs[r], shards[r], xt[r], slots[r], twt[r], counts) for r in range(2)]
    phases = ("pack", "pull", "compute", "push")
    for phase in phases[:phases.index(skip)]:  # both ranks up to the skipped phase, then rank 0 alone
        for s in steps:
            getattr(s, phase)()
    if skip == "pack":
        steps[0].pack()
        steps[0].pull()  # its copies from rank 1 wait 8 polls, then go on; the status word has the peer
        with pytest.raises(FlagTimeoutError, match=r"rank 0 waited for rank 1's send-ready flag of call 2 and read 1 "
                                                   r"after 8 polls \(the spin limit\)"):
            steps[0].compute()
    else:
        steps[0].push()
        with pytest.raises(FlagTimeoutError, match=r"rank 0 waited for rank 1's push-landed flag of call 2 and read 1"):
            steps[0].finish()
    assert bufs[0].broken and not bufs[1].broken
    with pytest.raises(EPInputError, match="buffers of rank 0 are unusable after a flag timeout"):
        SymmetricStep(bufs[0], shards[0], xt[0], slots[0], twt[0], counts)


def test_layout_and_the_worst_case(device):
    """Regions aligned and apart; a routing that sends every token to min(K, R) ranks, and one that sends
    every token of every rank to one rank, fill the buffers exactly; buffers for one token fewer are refused."""
    from megamoe.kernels.ep import EPInputError, shard_weights
    from megamoe.kernels.ep_symmetric import BufferLayout, ep_moe_experts_emulated

    lay = BufferLayout(3, 5, 16, 2, torch.float32)
    assert (lay.send_rows, lay.recv_rows) == (10, 15)
    spans = sorted((off, off + int(np.prod(shape)) * dt.itemsize) for off, shape, dt in lay.regions().values())
    assert all(off % 256 == 0 for off, _ in spans) and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert lay.total_bytes >= spans[-1][1] and lay.total_bytes % 256 == 0
    R, T, H, K = 3, 5, CFG.hidden_size, CFG.top_k
    w, *_ = _inputs("three-eplb", device)
    slot_rank = np.repeat(np.arange(R), CFG.num_experts // R + 1)[:CFG.num_experts]
    slot_expert = np.arange(CFG.num_experts)
    shards = [shard_weights(w, CFG, slot_expert, slot_rank, r, R, dtype=device.torch_dtype(), device=device.name)
              for r in range(R)]
    rng = np.random.default_rng(0)
    xt = [device.tensor(rng.standard_normal((T, H))) for _ in range(R)]
    twt = [device.tensor(np.full((T, K), 0.5), "float32") for _ in range(R)]
    spread = [np.tile([0, 3], (T, 1)) for _ in range(R)]  # slots 0 and 3: ranks 0 and 1, every token
    onto_two = [np.tile([6, 7], (T, 1)) for _ in range(R)]  # slots 6 and 7: both on rank 2
    for slots, most_sent, most_received in ((spread, lay.send_rows, lay.recv_rows), (onto_two, T, lay.recv_rows)):
        bufs = _buffers(R, T, device)
        ys = ep_moe_experts_emulated(xt, slots, twt, shards, bufs)
        assert all(torch.equal(y, wt) for y, wt in zip(ys, _all_to_all_path(xt, slots, twt, shards)))
        counts = np.stack([plan_send(s, slot_rank, R, r).send_counts for r, s in enumerate(slots)])
        assert (counts.sum(axis=1).max(), counts.sum(axis=0).max()) == (most_sent, most_received)
    bufs = _buffers(R, T - 1, device)
    with pytest.raises(EPInputError, match=r"buffers too small for this routing: rank 2 receives 15 rows, the buffers "
                                           r"hold 12 \(allocated for 4 tokens per rank\)"):
        ep_moe_experts_emulated(xt, onto_two, twt, shards, bufs)


def test_bad_inputs_are_named(device, monkeypatch):
    from megamoe.kernels.ep import TRANSPORT_ENV, EPInputError, TransportEnvError
    from megamoe.kernels.ep_symmetric import (
        BufferLayout,
        SymmetricBuffers,
        SymmetricStep,
        ep_moe_experts_emulated,
        ep_moe_experts_symmetric,
    )

    _, xs, slots, tw, _, shards = _inputs("two-ranks", device)
    xt, twt = _tensors(xs, tw, device)
    bufs = _buffers(2, 16, device)
    counts = np.stack([plan_send(s, shards[r].slot_rank, 2, r).send_counts for r, s in enumerate(slots)])

    def step(r=0, **kw):
        args = {"buffers": bufs[r], "shard": shards[r], "x": xt[r], "topk_idx": slots[r], "topk_weights": twt[r],
                "traffic": counts, **kw}
        return SymmetricStep(**args)

    with pytest.raises(EPInputError, match="shard is for rank 1 of 2, the buffers for rank 0 of 2"):
        step(shard=shards[1])
    with pytest.raises(EPInputError, match=r"x is torch.float16 \[T, H=16\] .* the buffers are for "
                                           rf"{device.torch_dtype()} H=16, K=2"):
        step(x=xt[0].half())
    with pytest.raises(EPInputError, match=r"the buffers are for .* H=16"):
        step(x=torch.zeros((xs[0].shape[0], 8), dtype=device.torch_dtype(), device=device.name))
    with pytest.raises(EPInputError, match=r"topk_idx and topk_weights must both be \[T=13, K\]"):
        step(topk_idx=slots[0][:3])
    with pytest.raises(EPInputError, match=r"traffic must be an \(R, R\) = \(2, 2\) array"):
        step(traffic=counts[:1])
    bad = counts.copy()
    bad[0, 1] += 1
    with pytest.raises(EPInputError, match=rf"traffic row 0 is {re_list(bad[0])} but this rank's routing sends "
                                           rf"{re_list(counts[0])} rows"):
        step(traffic=bad)
    with pytest.raises(EPInputError, match="buffers must be SymmetricBuffers, got list"):
        step(buffers=bufs)
    with pytest.raises(EPInputError, match="backend must be one of"):
        step(backend="cutlass")
    with pytest.raises(RuntimeError, match="phase 'pull' called out of order, the next is 'pack'"):
        step().pull()
    with pytest.raises(EPInputError, match="need one of shards per rank: got 1 for 2 ranks"):
        ep_moe_experts_emulated(xt, slots, twt, shards[:1], bufs)
    with pytest.raises(EPInputError, match=r"buffers must be ranks 0..1 in order, got ranks \[1, 0\]"):
        ep_moe_experts_emulated(xt, slots, twt, shards, bufs[::-1])
    with pytest.raises(EPInputError, match="the schedule is for 3 ranks, the buffers for 2"):
        bufs[0].check_fits(_three_rank_plan())
    for kw, msg in (({"max_tokens": -1}, "max_tokens must be an integer >= 0, got -1"),
                    ({"top_k": 0}, "top_k must be an integer >= 1, got 0"),
                    ({"dtype": torch.int32}, "dtype must be a floating torch.dtype")):
        with pytest.raises(EPInputError, match=msg):
            BufferLayout(**{"num_ranks": 2, "max_tokens": 4, "hidden_size": 8, "top_k": 2, "dtype": torch.float32,
                            **kw})
    # the GPU path: the environment first, then the buffers' kind
    for k in TRANSPORT_ENV:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(TransportEnvError, match="NCCL_NVLS_ENABLE"):
        ep_moe_experts_symmetric(xt[0], slots[0], twt[0], shards[0], bufs[0])
    with pytest.raises(EPInputError, match="expert parallelism needs"):
        SymmetricBuffers.allocate(16, 16, 2, torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(EPInputError, match="only with TRITON_INTERPRET=1"):
        SymmetricBuffers.emulated(2, 4, 8, 2, torch.float32)
    for k, v in TRANSPORT_ENV.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(EPInputError, match="these buffers are emulated"):
        ep_moe_experts_symmetric(xt[0], slots[0], twt[0], shards[0], bufs[0])
    with pytest.raises(EPInputError, match="needs torch.distributed initialized"):
        SymmetricBuffers.allocate(16, 16, 2, torch.float32)


def re_list(a) -> str:
    """A list's repr with its brackets escaped for pytest.raises(match=...)."""
    return str(a.tolist()).replace("[", r"\[").replace("]", r"\]")


def _three_rank_plan():
    from megamoe.reference.ep import plan_pull

    return plan_pull(np.ones((3, 3), np.int64), 16, 4)


_COMPILE = r"""
import json, re, sys
sys.path.insert(0, sys.argv[1])
from compile_report import compile_kernel  # drops TRITON_INTERPRET before triton loads
import torch
from megamoe.kernels import ep_pull, ep_symmetric as es

i64 = lambda n: torch.empty(n, dtype=torch.int64)
launches = {
    "signal": (es._signal_kernel, (i64(4), i64(1), 5), {"R": 4}),
    "wait": (es._wait_kernel, (i64(8), 4, i64(1), 1000, i64(3)), {"KIND": 2}),
    "pull": (ep_pull._copy_rows_kernel, (torch.empty((8, 64), dtype=torch.bfloat16), i64(4), i64(16), 0, 4, i64(4),
                                         i64(1), 1000, i64(3)),
             {"W": 64, "PUSH": False, "ALIGNED": True, "WAIT": True, "BLOCK_R": 8, "BLOCK_W": 64}),
}
out = {}
for name, (fn, args, kw) in launches.items():
    compile_kernel(fn, args, {"num_warps": 4, "num_stages": 1, **kw}, dump=(sys.argv[2], name))
    ptx = open(f"{sys.argv[2]}/{name}.ptx").read()
    out[name] = {"release.exch": len(re.findall(r"atom\.global\.sys\.release\.exch\.b64", ptx)),
                 "acquire.ld": len(re.findall(r"ld\.global\.sys\.acquire\.b64", ptx)),
                 "relaxed.cas": len(re.findall(r"atom\.global\.relaxed\.gpu\.cas\.b64", ptx))}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_flag_kernels_compile_for_hopper(tmp_path):
    """The flag kernels and the waiting copy kernel compiled for sm_90 by this Triton and its ptxas (no GPU;
    the interpreter accepts code the compiler refuses): one system-scope release exchange per peer, system-scope
    acquire loads for every poll, the status word's compare-and-swap."""
    import json
    import os
    import subprocess
    import sys

    from benchload import BENCH

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE, str(BENCH), str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["signal"] == {"release.exch": 4, "acquire.ld": 0, "relaxed.cas": 0}  # R = 4 peers, unrolled
    for name in ("wait", "pull"):  # the first poll and the loop's
        assert got[name]["acquire.ld"] >= 2 and got[name]["relaxed.cas"] == 1 and got[name]["release.exch"] == 0


# --------------------------------------------------------------------------- several GPUs (one process each)
GPU_SCENARIOS = {2: ["two-ranks"], 3: ["three-eplb", "three-random"], 4: ["four-rr", "four-hot", "four-one-rank"]}


def _gpu_worker(rank: int, R: int, out_dir: str) -> None:
    """Each scenario of R ranks in bf16 with the kernels: ep_moe_experts over NCCL, then the symmetric layer on
    buffers allocated once (traffic given and all-gathered, whole and one-row copies, two calls each)."""
    from megamoe.kernels.ep import ep_moe_experts, shard_weights
    from megamoe.kernels.ep_symmetric import SymmetricBuffers, ep_moe_experts_symmetric

    dev = torch.device("cuda", rank)
    names = GPU_SCENARIOS[R]
    max_tokens = max(len(x) for n in names for x in _scenario(n)[1])
    bufs = SymmetricBuffers.allocate(max_tokens, CFG.hidden_size, CFG.top_k, torch.bfloat16)
    for name in names:
        w, xs, slots, tw, placement = _rounded(name, "bfloat16")
        shard = shard_weights(w, CFG, placement.slot_expert, placement.slot_rank, rank, R, dtype=torch.bfloat16,
                              device=dev)
        x = torch.from_numpy(xs[rank]).to(dev, torch.bfloat16)
        t = torch.from_numpy(tw[rank]).to(dev, torch.float32)
        y = ep_moe_experts(x, slots[rank], t, shard, transport="all_to_all")
        traffic = np.stack([plan_send(s, placement.slot_rank, R, r).send_counts for r, s in enumerate(slots)])
        for kw in ({}, {"traffic": traffic}, {"max_rows": 1}, {"max_rows": 1, "num_programs": 2}):
            for _ in range(2):
                ys = ep_moe_experts_symmetric(x, slots[rank], t, shard, bufs, **kw)
                assert torch.equal(ys, y), f"{name} rank {rank} {kw}: the symmetric layer differs from all_to_all"
        np.save(f"{out_dir}/{name}_{rank}.npy", y.float().cpu().numpy())
    assert bufs.epoch.tolist() == [8 * len(names)] * 2


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs or more")
@pytest.mark.parametrize("R", [2, 3, 4])
def test_symmetric_layer_on_several_gpus(tmp_path, R):
    """The one-sided layer across R GPUs (torch symmetric memory, NCCL): bitwise ep_moe_experts, close to
    the float64 reference."""
    from megamoe.ep import launch

    if torch.cuda.device_count() < R:
        pytest.skip(f"needs {R} GPUs, found {torch.cuda.device_count()}")
    launch(_gpu_worker, R, (str(tmp_path),), backend="nccl", timeout_s=300)
    for name in GPU_SCENARIOS[R]:
        w, xs, slots, tw, placement = _rounded(name, "bfloat16")
        ref = ep_experts_forward(xs, slots, tw, placement.slot_expert, placement.slot_rank, w, CFG)
        for r in range(R):
            if xs[r].shape[0]:
                assert_close(np.load(tmp_path / f"{name}_{r}.npy"), ref[r], "bfloat16", what=f"{name} rank {r}")
