"""Tail tiles (GEMM config TAIL_M, kernels/grouped_gemm.py's tail walk) against the float64 reference.

With TAIL_M the align pads each expert to TAIL_M rows (not BLOCK_M), and the persistent TMA GEMMs
walk, per expert, BLOCK_M tiles and a last TAIL_M tile where at most TAIL_M rows are left.
On the ``device`` fixture: under TRITON_INTERPRET=1 on the CPU (float32; float16 once) with
BLOCK_M 32 / TAIL_M 16 and 3 persistent programs; on a GPU in bfloat16 with BLOCK_M 128 / TAIL_M
64. Shapes as tests/test_kernels_tma.py's: H = 40 and I = 24 fill no tile, yet are 16-byte strided.
Expected values come from the reference (outputs) and from hand-counted tiles (the walk).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

pytestmark = [pytest.mark.interpret,
              # GEMM 2 reads the activation's padding rows (never written: NaN in the poisoned test);
              # they only reach output rows that are masked
              pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")]

BASE = dict(hidden_size=40, intermediate_size=24, num_experts=7, top_k=3)


def _entry(device, tail_last: int = 0) -> dict:
    from megamoe.kernels import configs as cfgs

    cpu = device.name == "cpu"
    name = ("tma32:TAIL_M=16" if cpu else "tma128:TAIL_M=64") + (",TAIL_LAST=1" if tail_last else "")
    return cfgs.candidate_entry(name, interpret=cpu)


def _layer(device, cfg, x, w, dtype, entry, deterministic=True):
    """The layer with the tail entry's plan (the shared MLP keeps its own dense GEMMs), and the
    reference on the same rounded inputs."""
    from megamoe.kernels import moe as kmoe

    tdt = getattr(torch, dtype)
    xt = device.tensor(x, dtype)
    sp = kmoe.static_plan_for(cfg, x.shape[0], tdt, xt.device, deterministic, gemm=entry)
    y = kmoe._forward(xt, w.to_torch(device.name, tdt), cfg, deterministic, plan=sp)
    return y.cpu(), ref_forward(round_to_dtype(x, dtype), w.round_to(dtype), cfg), sp


#: name -> (config fields, T, why)
CASES = {
    "softmax_shared": (dict(num_shared_experts=1, shared_intermediate_size=24), 53,
                       "scan + scatter align at TAIL_M; the shared MLP's dense GEMMs walk no tail tiles"),
    "swiglu_biases": (dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
                           swiglu_limit=1.5), 13, "biases in both epilogues of both tile heights; one router chunk "
                                                  "aligns inside the router, at TAIL_M"),
    "input_scaled": (dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=16),
                     29, "K = 1: GEMM 1 scales its input rows by padded_pair (passed from the tile's first row)"),
}


@pytest.mark.parametrize("tail_last", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
def test_layer_matches_reference(case, tail_last, rng, device):
    fields, T, _why = CASES[case]
    cfg = MoEConfig(**{**BASE, **fields})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((T, cfg.hidden_size))
    entry = _entry(device, tail_last)
    y, ref, sp = _layer(device, cfg, x, w, device.dtype, entry)
    tm = entry["gemm1"]["TAIL_M"]
    assert sp.align_m == tm and sp.gemm["gemm2"]["TAIL_M"] == tm
    assert sp.shared is None or sp.shared["gemm1"]["TAIL_M"] == sp.shared["gemm2"]["TAIL_M"] == 0
    assert_close(y, ref, device.dtype, f"{case} TAIL_LAST={tail_last} {device.dtype}")


def test_layer_float16(rng, device):
    fields, T, _why = CASES["softmax_shared"]
    cfg = MoEConfig(**{**BASE, **fields})
    w = random_weights(cfg, seed=int(rng.integers(1 << 30)))
    y, ref, _ = _layer(device, cfg, rng.standard_normal((T, cfg.hidden_size)), w, "float16", _entry(device))
    assert_close(y, ref, "float16", "tail tiles, float16")


def test_empty_experts_and_one_expert_taking_all(rng, device):
    """Zero router weights: every token on experts 0..2, four empty, the atomic combine too; and
    top-1 with expert 5 always winning: 45 tokens, one expert of a full tile and a 13-row tail
    (interpreter: 32 + 13 rows; GPU: one 45-row tail tile), six empty."""
    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=4)
    w = type(w)(**{**w.arrays(), "router_weight": np.zeros_like(w.router_weight)})
    x = rng.standard_normal((29, cfg.hidden_size))
    for det in (True, False):
        y, ref, _ = _layer(device, cfg, x, w, device.dtype, _entry(device), deterministic=det)
        assert_close(y, ref, device.dtype, f"all tokens on experts 0..2, deterministic={det}")
    cfg1 = MoEConfig(**{**BASE, "top_k": 1})
    w1 = random_weights(cfg1, seed=5)
    rw = np.full_like(w1.router_weight, -1.0)
    rw[5] = 0.0
    w1 = type(w1)(**{**w1.arrays(), "router_weight": rw})
    x1 = np.abs(rng.standard_normal((45, cfg1.hidden_size)))
    y, ref, _ = _layer(device, cfg1, x1, w1, device.dtype, _entry(device, tail_last=1))
    assert_close(y, ref, device.dtype, "every token on expert 5")


@pytest.mark.parametrize("T", [0, 1])
def test_tiny_batches(T, rng, device):
    """T = 0: an empty output and no launch; T = 1: K tail tiles of one row, fewer than the programs."""
    cfg = MoEConfig(**BASE, num_shared_experts=1, shared_intermediate_size=24)
    w = random_weights(cfg, seed=3)
    x = rng.standard_normal((T, cfg.hidden_size))
    y, ref, _ = _layer(device, cfg, x, w, device.dtype, _entry(device))
    assert y.shape == (T, cfg.hidden_size)
    assert_close(y, ref, device.dtype, f"T={T}")


# --------------------------------------------------------------------------- the walk, tile by tile
def _value(v) -> int:
    """A scalar the interpreter passes to a tile function (a tl.tensor wrapping a NumPy value, or an int)."""
    h = getattr(v, "handle", None)
    return int(np.asarray(h.data).reshape(-1)[0]) if h is not None else int(v)


def _record_walks(monkeypatch, meta) -> dict:
    """Wrap the persistent GEMMs' tile functions: each tile they run appends (first padded row, rows,
    expert, N tile) to walks["gemm1"] / walks["gemm2"]. GEMM 1's row is its padded_token pointer's
    offset (the tail walk passes the row arrays from the tile's first row on), GEMM 2's its a_row0."""
    from megamoe.kernels import grouped_gemm as gg

    walks = {"gemm1": [], "gemm2": []}
    base = meta["padded_token"].data_ptr()
    g1, g2 = gg._gemm1_tma_tile, gg._gemm2_tma_tile

    def tile1(*a):  # (x, w_desc, bias, out, padded_token, padded_pair, topk_w, pid_m, pid_n, e, ..., BLOCK_M, BN, BK)
        walks["gemm1"].append(((_value(a[4]) - base) // 4, a[-3], _value(a[9]), _value(a[8])))
        return g1(*a)

    def tile2(*a):  # (a_desc, w_desc, bias, out, padded_pair, scale, pid_m, pid_n, e, a_row0, ..., BLOCK_M, BN, BK)
        walks["gemm2"].append((_value(a[9]), a[-3], _value(a[8]), _value(a[7])))
        return g2(*a)

    monkeypatch.setattr(gg, "_gemm1_tma_tile", tile1)
    monkeypatch.setattr(gg, "_gemm2_tma_tile", tile2)
    return walks


#: pairs per expert (K = 1), BLOCK_M 32 / TAIL_M 16: hand-counted (BLOCK_M tiles, TAIL_M tiles) of each
COUNTS = (0, 1, 16, 17, 32, 33, 48, 49)
TILES = ((0, 0), (0, 1), (0, 1), (1, 0), (1, 0), (1, 1), (1, 1), (2, 0))


@pytest.mark.parametrize("tail_last", [0, 1])
@pytest.mark.parametrize("num_sms", [1, 3, 1000])
def test_walk_equals_plan_and_reference(num_sms, tail_last, rng, device, monkeypatch):
    """The GEMMs alone on a routing whose experts hold 0, 1, 16, 17, 32, 33, 48 and 49 pairs, the
    activation and the pair buffer poisoned (NaN), one program walking every tile, three sharing
    them, more programs than tiles: each GEMM runs every tile of the hand count once (an empty
    expert none; a full last tile at 17 and 49, a tail at 1, 16, 33 and 48), each at its expert's
    row, and the launch plan counts the same tiles; every pair row is right, the activation's
    padding rows are left as they were."""
    if device.name != "cpu":
        pytest.skip("the walk is recorded through the interpreter's tile functions")
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.grouped_gemm import launch_gemm1, launch_gemm2
    from megamoe.kernels.moe import align_only
    from megamoe.kernels.plan import launch_plan
    from megamoe.reference import expert_ffn

    cfg = MoEConfig(**{**BASE, "num_experts": len(COUNTS), "top_k": 1})
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    idx = rng.permutation(np.repeat(np.arange(E), COUNTS))[:, None]
    T = idx.shape[0]
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w = random_weights(cfg, seed=6)
    entry = cfgs.check_entry({g: dict(c, TAIL_LAST=tail_last) for g, c in _entry(device).items()}, "test")
    bm, tm = entry["gemm1"]["BLOCK_M"], entry["gemm1"]["TAIL_M"]
    assert (bm, tm) == (32, 16)
    meta = align_only(torch.from_numpy(idx).to(torch.int32), E, tm)
    B_max = meta["block_expert"].shape[0]
    wt = w.to_torch("cpu", torch.float32)
    act = torch.full((meta["padded_token"].shape[0], I), float("nan"))
    pairs = torch.full((T * K, H), float("nan"))
    topk_w = torch.from_numpy(tw).float()
    walks = _record_walks(monkeypatch, meta)
    launch_gemm1(torch.from_numpy(x).float(), wt.gate_up, None, act, meta, topk_w, entry["gemm1"],
                 activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False, num_m=B_max,
                 num_sms=num_sms)
    launch_gemm2(act, wt.down, None, pairs, meta, topk_w, entry["gemm2"], T=T, K=K, KS=K, dense=False,
                 atomic=False, num_m=B_max, num_sms=num_sms)
    monkeypatch.undo()

    start = meta["padded_offsets"].numpy()
    plan = launch_plan(cfg, T, counts=np.array(COUNTS), dtype="float32", device_name="cpu-interpreter",
                       gemm=entry, num_sms=num_sms)
    for gemm, N in (("gemm1", I), ("gemm2", H)):
        nt = -(-N // entry[gemm]["BLOCK_N"])
        want = Counter()
        for e, (full, tail) in enumerate(TILES):
            for j in range(full + tail):
                for n in range(nt):
                    want[(int(start[e]) + j * bm, tm if j == full else bm, e, n)] += 1
        assert Counter(walks[gemm]) == want, gemm
        st = plan.stage(gemm)
        assert st.active_programs == len(walks[gemm]) and st.grid == (min(num_sms, B_max * nt),)
        assert st.tiles_per_expert == tuple(nt * (f + t) for f, t in TILES)
        assert st.tail["m"] == tm and st.tail["tiles_per_expert"] == tuple(nt * t for _, t in TILES)
        assert st.tail["tiles"] == sum(1 for _, m, _, _ in walks[gemm] if m == tm)
    if tail_last:  # every BLOCK_M tile before the first tail tile, on each program's walk (one program: in all)
        heights = [m for _, m, _, _ in walks["gemm1"]]
        assert num_sms != 1 or heights == sorted(heights, reverse=True)

    got = pairs.double().numpy()
    assert np.isfinite(got).all(), "a pair row was left unwritten or took NaN from a padding row"
    want = np.stack([tw[t, 0] * expert_ffn(x[t:t + 1], w.gate_up[idx[t, 0]], w.down[idx[t, 0]], cfg)[0]
                     for t in range(T)])
    assert_close(got, want, "float32", f"pair rows, {num_sms} programs")
    n_rows = int(start[E])
    pad = meta["padded_token"][:n_rows] < 0
    assert pad.any() and torch.isnan(act[:n_rows][pad]).all(), "padding rows were written"


# --------------------------------------------------------------------------- configs, plans, cost
def test_tail_configs_are_checked():
    """TAIL_M is half of BLOCK_M on persistent GEMMs, the same in both GEMMs (the align pads to it),
    and off (0) wherever a GEMM is not persistent, in the FP8 GEMMs and in every shipped table."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.plan import fp8_entry

    e = cfgs.candidate_entry("tma128:TAIL_M=64")
    assert e["gemm1"]["TAIL_M"] == e["gemm2"]["TAIL_M"] == 64 and cfgs.align_rows(e["gemm1"]) == 64
    assert cfgs.candidate_entry("tma128:TAIL_M=64,TAIL_LAST=1")["gemm2"]["TAIL_LAST"] == 1
    assert cfgs.align_rows(cfgs.tma_config("gemm1", 128)) == 128
    with pytest.raises(cfgs.KernelConfigError, match=r"gemm1.TAIL_M=64 and gemm2.TAIL_M=0"):
        cfgs.candidate_entry("tma128:g1.TAIL_M=64")
    with pytest.raises(cfgs.KernelConfigError, match="TAIL_M=32 must be half of BLOCK_M=128"):
        cfgs.candidate_entry("tma128:TAIL_M=32")
    good = dict(cfgs.tma_config("gemm1", 128), TAIL_M=64)
    for bad, msg in ((dict(good, variant="pointer"), "needs variant 'tma_persistent'"),
                     (dict(good, FLATTEN=1), "two tile loops"),
                     (dict(good, TAIL_M=0, TAIL_LAST=1), "needs TAIL_M > 0"),
                     (dict(good, TAIL_M=-64), "TAIL_M must be 0"), (dict(good, TAIL_M=True), "TAIL_M must be 0")):
        with pytest.raises(cfgs.KernelConfigError, match=msg):
            cfgs.check_gemm_config(bad, "x")
    # a GEMM whose rows TMA cannot read falls back to the pointer kernel: tail tiles off in both
    r = cfgs.resolve_variants(e, 2048, 36, "float16")
    assert (r["gemm1"]["variant"], r["gemm2"]["variant"]) == ("tma_persistent", "pointer")
    assert r["gemm1"]["TAIL_M"] == r["gemm2"]["TAIL_M"] == 0
    for fp8 in ("weights", "weights+act"):
        f = fp8_entry(e, fp8, depths=(2048, 768), tma=True, tma_weights=True)
        assert f["gemm1"]["TAIL_M"] == f["gemm2"]["TAIL_M"] == 0
    for E, H, I, K in ((8, 4096, 14336, 2), (128, 2048, 768, 8), (256, 7168, 2048, 8)):
        for T in cfgs.T_BUCKETS:
            s = cfgs.select_config(E, H, I, K, T, gpu="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
            assert s["gemm1"]["TAIL_M"] == s["gemm2"]["TAIL_M"] == 0, (E, T)


def test_plan_counts_tiles_of_both_heights():
    """Qwen3-30B-A3B at T = 4096 with a near-uniform routing: the align pads to TAIL_M (P_max and
    row blocks at 64 rows); GEMM 1 and GEMM 2 count tiles of 128 and of 64 rows from the counts,
    their FLOPs and row bytes exactly those of the rows the tiles hold (the stage's per-tile
    figures are means), the weights once per tile; the cost model prices fewer MMA rows lower, and
    a stage with no tail tile as without TAIL_M."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.plan import launch_plan, static_plan, tail_tiles
    from megamoe.simulator.cost import predict_stage, resolve_profile

    cfg = MoEConfig.preset("qwen3-30b-a3b")
    E, K, H, I, T = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size, 4096
    counts = np.random.default_rng(0).multinomial(T * K, np.full(E, 1.0 / E))
    tail, base = cfgs.candidate_entry("tma128:TAIL_M=64"), cfgs.candidate_entry("tma128")
    sp = static_plan(cfg, T, triton_version="3.6.0", gemm=tail)
    assert sp.align_m == 64 and sp.P_max == cfgs.max_padded_rows(T * K, E, 64) and sp.B_max == sp.P_max // 64
    tiles, tails = tail_tiles(counts, 128, 64)
    np.testing.assert_array_equal(tiles, -(-counts // 128))
    np.testing.assert_array_equal(tails, (counts % 128 > 0) & (counts % 128 <= 64))
    rows = int((tiles - tails).sum() * 128 + tails.sum() * 64)
    assert T * K < rows < int(tiles.sum()) * 128
    p, p0 = (launch_plan(cfg, T, counts=counts, triton_version="3.6.0", gemm=g) for g in (tail, base))
    assert p.stage("align_layout").tile["BLOCK_M"] == 64 and p0.stage("align_layout").tile["BLOCK_M"] == 128
    profile = resolve_profile("h200")
    for name, N, depth, gated in (("gemm1", I, H, 2), ("gemm2", H, I, 1)):
        st, st0 = p.stage(name), p0.stage(name)
        bn = st.tile["BLOCK_N"]
        nt = -(-N // bn)
        assert st.active_programs == st0.active_programs == int(tiles.sum()) * nt
        assert st.tail["tiles"] == int(tails.sum()) * nt and st.tail["m"] == 64
        assert st.total_flops == pytest.approx(2 * rows * gated * nt * bn * depth)
        ob = st.operand_bytes_per_tile
        assert ob["a"] * st.active_programs == pytest.approx(rows * nt * depth * 2)
        assert ob["b"] == st0.operand_bytes_per_tile["b"]
        t, t0 = predict_stage(st.to_dict(), profile).compute_us, predict_stage(st0.to_dict(), profile).compute_us
        assert t < t0, (name, t, t0)
        none = dict(st0.to_dict(), tail=dict(st.tail, tiles=0, tiles_per_expert=(0,) * E))
        assert predict_stage(none, profile) == predict_stage(st0.to_dict(), profile)


def test_launches_follow_the_plan(rng, monkeypatch, device):
    """The layer's launches are the plan's (kernels, grids), the align's at TAIL_M rows, and
    bench_prefill.py's candidate names the same plan."""
    if device.name != "cpu":
        pytest.skip("the launch recorder wraps the interpreter's kernels")
    import importlib

    from benchload import load_benchmark
    from launches import LaunchRecorder
    from test_kernels_plan import KERNEL_MODULES

    from megamoe.kernels import moe_forward_details
    from megamoe.kernels.plan import launch_plan

    cfg = MoEConfig(**BASE)
    w = random_weights(cfg, seed=1)
    x = rng.standard_normal((37, cfg.hidden_size))
    log: list = []
    names = dict(KERNEL_MODULES, _gemm1_tma_kernel="grouped_gemm", _gemm2_tma_kernel="grouped_gemm")
    for name, mod in names.items():
        m = importlib.import_module(f"megamoe.kernels.{mod}")
        monkeypatch.setattr(m, name, LaunchRecorder(getattr(m, name), name, log))
    entry = _entry(device)
    _layer(device, cfg, x, w, "float32", entry)
    monkeypatch.undo()
    d = moe_forward_details(torch.from_numpy(x).float(), w.to_torch("cpu", torch.float32), cfg)
    plan = launch_plan(cfg, topk_idx=d["topk_idx"].numpy(), dtype="float32", device_name="cpu-interpreter",
                       gemm=entry)
    assert [(s.kernel, s.grid) for s in plan.stages] == [(n, g) for n, g, _ in log]
    layout = [kw for n, _, kw in log if n == "_layout_kernel"]
    assert layout and layout[0]["BLOCK_M"] == 16 == plan.stage("align_layout").tile["BLOCK_M"]
    bp = load_benchmark("bench_prefill")
    sp = bp._plan(cfg, 37, "tma32:TAIL_M=16", torch.zeros(37, cfg.hidden_size))
    assert sp.align_m == 16 and sp.gemm == plan_entry(entry)


def plan_entry(entry):
    """``entry`` as a static plan holds it (variants resolved for the test's shapes, float32)."""
    from megamoe.kernels import configs as cfgs

    return cfgs.resolve_variants(entry, BASE["hidden_size"], BASE["intermediate_size"], "float32")
