"""fp8_act_tma's persistent FP8 GEMMs (FP8 weights and activations at a "tma_persistent" entry)
against the reference's FP8 layer and against fp8_gemm's pointer FP8 GEMMs.

Under the interpreter x is float32 and the e4m3 dot is exact in fp32, so these check the tile walk,
the scale indexing (one weight scale per 128-row band, the up band's per-column fallback when
I % 128 != 0), the carried product of PIPE and the epilogues at float32 precision; on CUDA the same
tests run in bfloat16 (the GPU tests of issue 12). Sizes are odd on purpose: H = 208 (the last K
step partial), I = 144 (GEMM 1's up band straddling two scale blocks) or 256 (one block per band).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pairs import assert_fp8a_gemms_close_on_gpu, assert_fp8a_pairs_match_reference, dequantized_rows  # noqa: E402

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

pytestmark = pytest.mark.interpret

#: name -> (T, routing, I, why)
GEMM_CASES = {
    "random": (21, "random", 144, "random distinct experts per token; the up band straddles two scale blocks"),
    "one_expert": (37, "one", 256, "I % 128 == 0 (one weight scale per band and K step, as the H200 presets); "
                                   "every token on experts 3 and 1: three experts get no rows"),
}


def _entries(H: int, I: int, device, pipe: int = 1, pipe2: int | None = None,
             tiles: str | None = None) -> tuple[dict, dict]:
    """(pointer, fp8a) FP8-activation entries (fp8_plan.fp8_entry) from one bf16 entry, "pointer" and
    "tma_persistent"; the fp8a one with PIPE ``pipe`` (GEMM 2: ``pipe2`` if given), or with ``tiles`` a
    tile set of fp8_plan.FP8A_TILE_CANDIDATES as fp8_entry makes it (FP8Options.fp8a_tiles)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import FP8A_NO_CANDIDATE, FP8Options, fp8_entry

    base = cfgs.tma_entry(16, interpret=True) if device.name == "cpu" else cfgs.tma_entry(128)
    ptr = fp8_entry({g: dict(c, variant="pointer") for g, c in base.items()}, "weights+act", device.dtype,
                    depths=(H, I))
    new = fp8_entry(base, "weights+act", device.dtype, depths=(H, I),
                    options=FP8Options(fp8a_tiles=tiles or FP8A_NO_CANDIDATE))
    assert ptr["gemm1"]["variant"] == ptr["gemm2"]["variant"] == "pointer"
    assert new["gemm1"]["FP8A"] == new["gemm2"]["FP8A"] == 1
    if tiles is None:
        new = {"gemm1": dict(new["gemm1"], PIPE=pipe), "gemm2": dict(new["gemm2"], PIPE=pipe if pipe2 is None else pipe2)}
    return ptr, new


def _gemms(device, wt, x, idx, tw, entry, E, K, H, I, num_sms):
    """Both FP8-activation GEMMs on a given routing (x quantized once, as the layer does), the
    activation codes, scales and pairs poisoned with NaN; (valid act codes, their scales, pairs)."""
    from megamoe.kernels.fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8, launch_quantize_x
    from megamoe.kernels.moe import align_only
    from megamoe.kernels.plan import quantize_launch

    T = x.shape[0]
    block_m = entry["gemm1"]["BLOCK_M"]
    meta = align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), E, block_m)
    P_max, B_max = meta["padded_token"].shape[0], meta["block_expert"].shape[0]
    nan = float("nan")
    act = torch.full((P_max, I), nan, device=device.name, dtype=torch.float8_e4m3fn)
    act_s = torch.full((P_max, -(-I // 128)), nan, device=device.name, dtype=torch.float32)
    pairs = torch.full((T * K, H), nan, device=device.name, dtype=device.torch_dtype())
    topk_w = device.tensor(tw, "float32")
    xt = device.tensor(x)
    xq = torch.empty((T, H), device=device.name, dtype=torch.float8_e4m3fn)
    xs = torch.empty((T, -(-H // 128)), device=device.name, dtype=torch.float32)
    launch_quantize_x(xt, xq, xs, quantize_launch(T, H, interpret=device.name == "cpu"))
    launch_gemm1_fp8(xt, wt.gate_up, wt.gate_up_scale_inv, None, act, act_s, meta, topk_w, entry["gemm1"],
                     activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False, num_m=B_max,
                     num_sms=num_sms, x_q=(xq, xs))
    launch_gemm2_fp8(act, act_s, wt.down, wt.down_scale_inv, None, pairs, meta, topk_w, entry["gemm2"], T=T, K=K,
                     KS=K, dense=False, atomic=False, num_m=B_max, num_sms=num_sms)
    n_rows = int(meta["padded_offsets"][E])
    valid = (meta["padded_token"][:n_rows] >= 0).cpu()
    return act.cpu()[:n_rows][valid], act_s.cpu()[:n_rows][valid], pairs.cpu()


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("case", list(GEMM_CASES))
def test_fp8a_gemms_match_reference_and_pointer(case, rng, device):
    """The fp8a GEMMs (PIPE on) against the FP8 reference per pair and against the pointer FP8 GEMMs
    (the same codes and sums up to the order of two fp32 roundings per K step), every output
    poisoned: every valid activation row and pair row is written."""
    T, routing, I, _why = GEMM_CASES[case]
    cfg = MoEConfig(hidden_size=208, intermediate_size=I, num_experts=5, top_k=2)
    E, K, H = cfg.num_experts, cfg.top_k, cfg.hidden_size
    idx = np.tile(np.array([3, 1]), (T, 1)) if routing == "one" else np.stack([rng.permutation(E)[:K]
                                                                                 for _ in range(T)])
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w8 = random_weights(cfg, seed=21, fp8=True)
    wt = w8.to_torch(device.name, device.torch_dtype())
    ptr, new = _entries(H, I, device)
    sms = 3 if device.name == "cpu" else None
    got = _gemms(device, wt, x, idx, tw, new, E, K, H, I, sms)
    want = _gemms(device, wt, x, idx, tw, ptr, E, K, H, I, sms)
    assert np.isfinite(got[2].double().numpy()).all(), "a pair row was left unwritten"
    assert torch.isfinite(got[0].float()).all() and torch.isfinite(got[1]).all(), "an activation row was left unwritten"
    assert new["gemm1"]["BLOCK_M"] == ptr["gemm1"]["BLOCK_M"]  # the same padded row order
    if device.name == "cpu":  # one e4m3 step where an fp32 sum's last bit moved a code
        h_got, h_want = dequantized_rows(got[0], got[1], I), dequantized_rows(want[0], want[1], I)
        torch.testing.assert_close(h_got, h_want, rtol=2**-3, atol=1e-6)
        torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)
    else:
        assert_fp8a_gemms_close_on_gpu(got, want, I)
    assert_fp8a_pairs_match_reference(got[2], x, w8, idx, tw, cfg, device.dtype, f"fp8a GEMMs, {case}")


def _assert_same(got, want) -> None:
    """Two runs of both GEMMs, (h codes, h scales, pair rows) each, bit for bit."""
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[2], want[2])


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_fp8a_pipe_modes_equal_pipe_on(rng, device):
    """PIPE (the gate product, and GEMM 2's first half, carried to the next K step) and GEMM 2's CHAIN
    (half 1's product started from half 0's scaled sum x 0) change when each product is scaled, not
    what is added: the same codes, scales and pairs bit for bit as PIPE on (GEMM 1 PIPE 0, GEMM 2 CHAIN:
    the two modes the 128-row tile sets run)."""
    pipe, pipe2 = 0, 2
    T, I = 21, 144
    cfg = MoEConfig(hidden_size=208, intermediate_size=I, num_experts=5, top_k=2)
    E, K, H = cfg.num_experts, cfg.top_k, cfg.hidden_size
    idx = np.stack([rng.permutation(E)[:K] for _ in range(T)])
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    wt = random_weights(cfg, seed=5, fp8=True).to_torch(device.name, device.torch_dtype())
    sms = 3 if device.name == "cpu" else None
    on = _gemms(device, wt, x, idx, tw, _entries(H, I, device, pipe=1)[1], E, K, H, I, sms)
    other = _gemms(device, wt, x, idx, tw, _entries(H, I, device, pipe=pipe, pipe2=pipe2)[1], E, K, H, I, sms)
    _assert_same(other, on)


#: name -> (T, routing, H, I, why): the 128-row tile candidates' cases
TILE_CASES = {
    "odd": (21, "random", 208, 144, "the last K step partial, the up band straddling two scale blocks, GEMM 2's "
                                    "last column tile partial"),
    "one_expert": (133, "one", 208, 256, "every token on expert 3 first, then expert 1: three experts get no rows, "
                                         "two get every token, 5 rows past their first 128-row block"),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("tiles,case", [("m128", "odd"), ("m128c", "one_expert")])
def test_fp8a_tile_candidates_match_default_and_reference(tiles, case, rng, device):
    """Each 128-row tile candidate (fp8_plan.FP8A_TILE_CANDIDATES: GEMM 1 128 x 128 with PIPE 0, GEMM 2
    128 x 128 with PIPE or 128 x 256 with CHAIN) against the FP8 reference per pair and against the
    default fp8a tiles (the same sums per K step in the same order; the valid rows in the same padded
    order): under the interpreter the same h codes and scales bit for bit and the pairs within a few
    fp32 ulps (NumPy's float32 matmul, the interpreter's dot, sums in an order that depends on the
    tile's shape: GEMM 2's columns here 8 per half by default, 64 or 128 in the candidates), on a GPU
    within an e4m3 step and a bf16 rounding; every output poisoned: every valid row is written."""
    from megamoe.kernels import fp8_plan

    T, routing, H, I, _why = TILE_CASES[case]
    assert tiles in fp8_plan.FP8A_TILE_CANDIDATES
    cfg = MoEConfig(hidden_size=H, intermediate_size=I, num_experts=5, top_k=2)
    E, K = cfg.num_experts, cfg.top_k
    idx = np.tile(np.array([3, 1]), (T, 1)) if routing == "one" else np.stack([rng.permutation(E)[:K]
                                                                                 for _ in range(T)])
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w8 = random_weights(cfg, seed=23, fp8=True)
    wt = w8.to_torch(device.name, device.torch_dtype())
    _, cand = _entries(H, I, device, tiles=tiles)
    _, default = _entries(H, I, device)
    want = fp8_plan.fp8a_tiles(tiles)
    for g in ("gemm1", "gemm2"):
        assert {k: cand[g][k] for k in want[g]} == want[g] and cand[g]["BLOCK_M"] == 128
    sms = 3 if device.name == "cpu" else None
    got = _gemms(device, wt, x, idx, tw, cand, E, K, H, I, sms)
    ref = _gemms(device, wt, x, idx, tw, default, E, K, H, I, sms)
    assert np.isfinite(got[2].double().numpy()).all(), "a pair row was left unwritten"
    assert torch.isfinite(got[0].float()).all() and torch.isfinite(got[1]).all(), "an activation row was left unwritten"
    if device.name == "cpu":
        assert torch.equal(got[0].view(torch.uint8), ref[0].view(torch.uint8)) and torch.equal(got[1], ref[1])
        torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=1e-6)
    else:
        assert_fp8a_gemms_close_on_gpu(got, ref, I)
    assert_fp8a_pairs_match_reference(got[2], x, w8, idx, tw, cfg, device.dtype, f"fp8a tiles {tiles}, {case}")


#: name -> (config fields, why)
LAYER_CASES = {
    "deepseek": (dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                      score_bias=True, num_shared_experts=1, shared_intermediate_size=80),
                 "DeepSeek-V3's layer: the shared MLP's dense GEMMs run the fp8a kernels too (Is = 80)"),
    "swiglu_bias": (dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
                         swiglu_limit=1.5), "gpt-oss epilogue: biases and the clamp act before h is quantized"),
    "input_scaled": (dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=24),
                     "Llama 4: x scaled before it is quantized: GEMM 1 runs fp8_gemm's pointer kernel"),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("case,tiles,T", [
    ("deepseek", None, 19),  # grouped router, the shared MLP's dense GEMMs on the fp8a kernels too
    ("swiglu_bias", "m128c", 19),  # biases and clamp before h is quantized, at the default prefill tile set
    ("input_scaled", None, 19),  # Llama 4: the pointer GEMM 1 (x scaled before quantizing) beside the fp8a GEMM 2
    ("deepseek", "m128", 0),  # T = 0 launches nothing; the other tile set
])
def test_fp8a_layer_matches_reference(case, tiles, T, rng, device):
    """The layer with a "tma_persistent" entry: the routed (and shared) GEMMs run fp8_act_tma's kernels
    and the output matches the FP8 reference. With ``tiles`` a 128-row tile set (FP8Options.fp8a_tiles)
    on every fp8a GEMM, the shared MLP's too."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe as kmoe
    from megamoe.kernels import plan
    from megamoe.kernels.fp8_plan import FP8Options

    cfg = MoEConfig(**{**dict(hidden_size=208, intermediate_size=144, num_experts=5, top_k=2), **LAYER_CASES[case][0]})
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    x = rng.standard_normal((T, cfg.hidden_size))
    entry = cfgs.tma_entry(16, interpret=True) if device.name == "cpu" else cfgs.tma_entry(128)
    xt = device.tensor(x)
    sp = plan.static_plan(cfg, T, dtype=kmoe.DTYPES[xt.dtype], device_name=kmoe.device_name(xt.device),
                          num_sms=kmoe.device_sms(xt.device), gemm=entry, shared_gemm=entry, fp8="weights+act",
                          fp8_options=FP8Options(fp8a_tiles=tiles))
    assert sp.gemm["gemm2"]["FP8A"] == 1 and sp.gemm["gemm1"].get("FP8A", 0) == int(not cfg.weight_on_input)
    if tiles:
        assert sp.gemm["gemm1"]["BLOCK_M"] == sp.gemm["gemm2"]["BLOCK_M"] == 128
        assert sp.shared is None or sp.shared["gemm1"]["BLOCK_M"] == 128
    y = kmoe._forward(xt, w8.to_torch(device.name, device.torch_dtype()), cfg, True, plan=sp, fp8_activations=True)
    assert tuple(y.shape) == (T, cfg.hidden_size)
    if T:
        ref = ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg, fp8_activations=True)
        assert_close(y.cpu(), ref, "fp8_e4m3", f"fp8a layer {case}")


# --------------------------------------------------------------------------- the plan (no kernel runs)
def _shipped_persistent_entry(preset: str, T: int):
    """(config, H, I, the tuned bf16 entry shipped for the H200) of ``preset`` at T; skipped where that entry is not
    the persistent TMA one (fp8a's GEMMs take its place only there)."""
    from megamoe.kernels import configs as cfgs

    cfg = MoEConfig.preset(preset)
    H, I = cfg.hidden_size, cfg.intermediate_size
    base = cfgs.select_config(cfg.num_experts, H, I, cfg.top_k, T, gpu="NVIDIA H200", dtype="bfloat16",
                              triton_version="3.6.0")
    if base["gemm1"].get("variant") != "tma_persistent":
        pytest.skip("the shipped entry is not persistent here")
    return cfg, H, I, base


@pytest.mark.parametrize("preset,T", [("qwen3-30b-a3b", 4096), ("deepseek-v3", 4096), ("deepseek-v3", 16384),
                                      ("mixtral-8x7b", 16384)])
def test_fp8a_entry_on_the_h200_table(preset, T):
    """fp8_entry on the shipped H200 table's prefill entries, with the 64-row tiles (FP8A_NO_CANDIDATE):
    both GEMMs persistent with FP8A and PIPE, BLOCK_M 64, GEMM 1 128 x 128 (whole h groups), GEMM 2 at
    most 256 columns in halves within one scale block, 4 stages within the shared-memory budget; the
    launch plan names fp8_act_tma's kernels. By default these 128-row entries take FP8A_DEFAULT_TILES,
    unless the layer does not quantize x once (then its GEMM 1 is the pointer one)."""
    from megamoe.kernels import fp8_plan as fp
    from megamoe.kernels import plan

    cfg, H, I, base = _shipped_persistent_entry(preset, T)
    assert base["gemm1"]["BLOCK_M"] >= fp.FP8A_DEFAULT_TILES_MIN_M
    by_default = fp.fp8_entry(base, "weights+act", depths=(H, I))
    assert by_default == fp.fp8_entry(base, "weights+act", depths=(H, I),
                                      options=fp.FP8Options(fp8a_tiles=fp.FP8A_DEFAULT_TILES))
    assert by_default["gemm1"]["BLOCK_M"] == by_default["gemm2"]["BLOCK_M"] == 128
    e = fp.fp8_entry(base, "weights+act", depths=(H, I), options=fp.FP8Options(fp8a_tiles=fp.FP8A_NO_CANDIDATE))
    not_once = fp.fp8_entry(base, "weights+act", depths=(H, I), x_once=False)
    assert not_once["gemm1"]["variant"] == "pointer" and not_once["gemm2"] == dict(e["gemm2"], BLOCK_M=64)
    g1, g2 = e["gemm1"], e["gemm2"]
    assert g1["variant"] == g2["variant"] == "tma_persistent" and g1["FP8A"] == g2["FP8A"] == g1["PIPE"] == 1
    assert g1["BLOCK_M"] == g2["BLOCK_M"] <= fp.FP8A_MAX_BLOCK_M
    assert (g1["BLOCK_N"], g1["BLOCK_K"], g2["BLOCK_K"]) == (128, 128, 128)
    assert g2["BLOCK_N"] <= 256 and 128 % (g2["BLOCK_N"] // 2) == 0
    for g, w in ((g1, 2), (g2, 1)):
        stage = g["BLOCK_M"] * 128 + w * g["BLOCK_N"] * 128
        assert g["num_stages"] == min(fp.FP8A_STAGES, fp.FP8_SMEM_BUDGET_BYTES // stage) >= 3
    kinds = {g: plan.GEMM_KERNELS[g, plan._kernel_key(c, "weights+act")] for g, c in (("gemm1", g1), ("gemm2", g2))}
    assert kinds == {"gemm1": "_gemm1_fp8a_kernel", "gemm2": "_gemm2_fp8a_kernel"}


def test_fp8a_launchers_refuse_other_tiles():
    """check_fp8a: BLOCK_K 128, GEMM 1 BLOCK_N 128, GEMM 2 halves dividing 128, no split-K, 16-code rows,
    PIPE 0 or 1 (GEMM 2 also 2, CHAIN)."""
    from megamoe.kernels.fp8_act_tma import check_fp8a

    ok1 = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=128)
    check_fp8a(ok1, "gemm1", 2048)
    check_fp8a(dict(ok1, BLOCK_N=256), "gemm2", 768)
    check_fp8a(dict(ok1, BLOCK_M=128, BLOCK_N=256, PIPE=2), "gemm2", 768)
    for bad, gemm, depth in ((dict(ok1, BLOCK_K=64), "gemm1", 2048), (dict(ok1, BLOCK_N=256), "gemm1", 2048),
                             (dict(ok1, BLOCK_N=512), "gemm2", 768), (dict(ok1, SPLIT_K=2), "gemm2", 768),
                             (ok1, "gemm1", 2056), (dict(ok1, PIPE=2), "gemm1", 2048),
                             (dict(ok1, PIPE=3), "gemm2", 768)):
        with pytest.raises(ValueError, match="fp8a persistent"):
            check_fp8a(bad, gemm, depth)


@pytest.mark.parametrize("tiles,preset,T", [("m128", "qwen3-30b-a3b", 4096), ("m128c", "deepseek-v3", 16384)])
def test_fp8a_tile_candidates_in_the_plan(tiles, preset, T):
    """FP8Options.fp8a_tiles sets a tile set (against the 64-row tiles, FP8A_NO_CANDIDATE) on the H200
    table's prefill fp8a entries: BLOCK_M 128 in both GEMMs and the align, the set's keys, stages within
    the shared-memory budget with x's e4m3 A tiles; the weight-only entry is untouched; the launch plan
    takes the options; an unknown name is refused."""
    from megamoe.kernels import fp8_plan as fp
    from megamoe.kernels import plan

    cfg, H, I, base = _shipped_persistent_entry(preset, T)
    default = fp.fp8_entry(base, "weights+act", depths=(H, I), options=fp.FP8Options(fp8a_tiles=fp.FP8A_NO_CANDIDATE))
    weights_only = fp.fp8_entry(base, "weights", depths=(H, I))
    e = fp.fp8_entry(base, "weights+act", depths=(H, I), options=fp.FP8Options(fp8a_tiles=tiles))
    assert e != default
    for g, n_w in (("gemm1", 2), ("gemm2", 1)):
        c = e[g]
        assert {k: c[k] for k in fp.FP8A_TILE_CANDIDATES[tiles][g]} == fp.FP8A_TILE_CANDIDATES[tiles][g]
        assert c["BLOCK_M"] == 128 and c["FP8A"] == 1 and c["BLOCK_K"] == 128
        stage = c["BLOCK_M"] * 128 + n_w * c["BLOCK_N"] * 128
        assert c["num_stages"] == min(fp.FP8A_STAGES, fp.FP8_SMEM_BUDGET_BYTES // stage) == 4
    assert fp.fp8_entry(base, "weights", depths=(H, I), options=fp.FP8Options(fp8a_tiles=tiles)) == weights_only
    counts = np.full(cfg.num_experts, T * cfg.top_k // cfg.num_experts)
    lp = plan.launch_plan(cfg, T, counts=counts, triton_version="3.6.0", fp8="weights+act",
                          fp8_options=fp.FP8Options(fp8a_tiles=tiles))
    assert lp.block_m == 128 and lp.stage("gemm2").kernel == "_gemm2_fp8a_kernel"
    assert lp.stage("gemm2").tile == plan.static_plan(cfg, T, triton_version="3.6.0", fp8="weights+act",
                                                      fp8_options=fp.FP8Options(fp8a_tiles=tiles)).gemm["gemm2"]
    with pytest.raises(ValueError, match="unknown fp8a tile set 'm256'"):
        fp.FP8Options(fp8a_tiles="m256")
