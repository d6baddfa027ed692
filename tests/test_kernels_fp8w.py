"""Weight-only FP8 at prefill through the persistent TMA GEMMs (fp8w_tma._gemm1_fp8w_tma_kernel /
_gemm2_fp8w_tma_kernel: each K tile's block scale folded into the e4m3 weights before the dot) against
the reference's FP8 layer (weight-only: ``fp8_activations=False``), and the entry that selects them
(a "tma_persistent" entry through fp8_plan.fp8_entry; FP8Options.swap_ab the operand order).

Under the interpreter x is float32 (the folded weight is code x s rounded to float32, so the
``float32`` row holds too) and float16 (the weight rounded to float16 once: the ``fp8_e4m3`` row);
on CUDA bfloat16 and float16 (the inline-PTX fold, CVT 2).

Sizes: H = 208 and I = 144 are multiples of 16 (TMA's 16-byte rows of e4m3 codes) but not of 128:
every matrix's last scale block is partial and GEMM 1's up rows start at row 144, mid-block; with
128-row bands the up band straddles two scale blocks. H = 200 (8-byte e4m3 rows) is refused by TMA:
the plan keeps the pointer kernels there and the launcher names the depth.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from launches import LaunchRecorder

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward
from megamoe.reference.fp8 import e4m3_decode

pytestmark = pytest.mark.interpret

import triton  # noqa: E402  (after conftest.py chose the interpreter)
import triton.language as tl  # noqa: E402
from pairs import pair_rows_reference  # noqa: E402

from megamoe.kernels.fp8w_tma import _e4m3_folded  # noqa: E402

TMA_BASE = dict(hidden_size=208, intermediate_size=144, num_experts=5, top_k=2)

#: name -> (T, routing, why)
GEMM_CASES = {
    "random": (21, "random", "distinct random experts per token; 3 programs walk several tiles each"),
    "one_expert": (37, "one", "every token on expert 3 first, then expert 1: three experts get no rows"),
    "one_token": (1, "random", "a single token: one row block per expert used, most of it padding"),
    "no_tokens": (0, "random", "T = 0: nothing launched, nothing written"),
}


def _entry(device, dtype: str, H: int, I: int, *, block_n: int | None = None, swap: bool | None = None) -> dict:
    """The weight-only persistent entry fp8_plan.fp8_entry makes from a "tma_persistent" bf16 entry (the
    interpreter's tiny tiles, or the H200's 128-row ones); ``block_n`` overrides both GEMMs' BLOCK_N
    before fp8_entry, ``swap`` FP8Options.swap_ab (None: the default)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import FP8Options, fp8_entry

    base = cfgs.tma_entry(16, interpret=True) if device.name == "cpu" else cfgs.tma_entry(128)
    if block_n:
        base = {g: dict(c, BLOCK_N=block_n) for g, c in base.items()}
    opts = FP8Options() if swap is None else FP8Options(swap_ab=swap)
    entry = fp8_entry(base, "weights", dtype, depths=(H, I), options=opts)
    assert entry["gemm1"]["variant"] == entry["gemm2"]["variant"] == "tma_persistent"
    return entry


def _routing(rng, T: int, E: int, K: int, kind: str) -> np.ndarray:
    if kind == "one":
        return np.tile(np.array([3, 1]), (T, 1))
    return np.array([rng.permutation(E)[:K] for _ in range(T)], dtype=np.int64).reshape(T, K)


def _fp8w_gemms(device, dtype: str, wt, x, idx, tw, entry, E: int, K: int, H: int, I: int):
    """Both weight-only FP8 GEMMs on a given routing (fp8_gemm.launch_gemm*_fp8 with ``entry``), the
    activation and the pair buffer poisoned with NaN -> (activation rows of the routed pairs, pairs)."""
    from megamoe.kernels.fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8
    from megamoe.kernels.moe import align_only

    T = x.shape[0]
    meta = align_only(torch.from_numpy(idx).to(torch.int32).reshape(T, K).to(device.name), E,
                      entry["gemm1"]["BLOCK_M"])
    P_max, B_max = meta["padded_token"].shape[0], meta["block_expert"].shape[0]
    dt = device.torch_dtype(dtype)
    act = torch.full((P_max, I), float("nan"), device=device.name, dtype=dt)
    pairs = torch.full((T * K, H), float("nan"), device=device.name, dtype=dt)
    topk_w = device.tensor(tw, "float32")
    sms = 3 if device.name == "cpu" else None
    launch_gemm1_fp8(device.tensor(x, dtype), wt.gate_up, wt.gate_up_scale_inv, None, act, None, meta, topk_w,
                     entry["gemm1"], activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False,
                     num_m=B_max, num_sms=sms)
    launch_gemm2_fp8(act, None, wt.down, wt.down_scale_inv, None, pairs, meta, topk_w, entry["gemm2"], T=T, K=K,
                     KS=K, dense=False, atomic=False, num_m=B_max, num_sms=sms)
    n_rows = int(meta["padded_offsets"][E])
    valid = (meta["padded_token"][:n_rows] >= 0).cpu()
    return act.cpu()[:n_rows][valid], pairs.cpu()


def _dtypes(device) -> list[str]:
    return [device.dtype, device.half]


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("case,swap", [("random", True), ("one_expert", False), ("one_token", True),
                                       ("no_tokens", False)])  # each routing once, both operand orders
def test_fp8w_gemms_match_the_fp8_reference(case, swap, rng, device):
    """The weight-only persistent GEMMs on a given routing, every output poisoned with NaN: every
    routed activation row and every pair row written, the pairs within the FP8 tolerance of the
    reference's weight-only FP8 expert FFN (float32: within float32's too), both operand orders."""
    T, routing, _why = GEMM_CASES[case]
    cfg = MoEConfig(**TMA_BASE)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    idx = _routing(rng, T, E, K, routing)
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    wd = w8.dequantize()
    for dtype in (_dtypes(device) if case == "random" else [device.dtype]):  # the half dtype once
        wt = w8.to_torch(device.name, device.torch_dtype(dtype))
        entry = _entry(device, dtype, H, I, swap=swap)
        assert entry["gemm1"]["SWAP_AB"] == entry["gemm2"]["SWAP_AB"] == int(swap)
        act, pairs = _fp8w_gemms(device, dtype, wt, x, idx, tw, entry, E, K, H, I)
        assert torch.isfinite(act.float()).all(), f"{dtype}: an activation row was left unwritten"
        assert torch.isfinite(pairs.float()).all(), f"{dtype}: a pair row was left unwritten"
        if T == 0:
            continue
        xr = round_to_dtype(x, dtype)
        want = pair_rows_reference(xr, wd, idx, tw, cfg)
        got = pairs.double().numpy()
        assert_close(got, want, "fp8_e4m3", f"fp8w GEMMs {case} {dtype} swap={swap}")
        if dtype == "float32":
            assert_close(got, want, "float32", f"fp8w GEMMs {case} float32 swap={swap}")


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_fp8w_bands_straddle_scale_blocks_and_equal_the_pointer_gemms(rng, device):
    """128-row bands (I = 144: GEMM 1's up band [144, 272) lies in two scale blocks, the second N tile
    holds 16 gate rows and 112 masked ones) with both operand orders: the same pair rows as the
    pointer FP8 GEMMs (which scale the fp32 products instead; float32 under the interpreter: within
    float32's rounding) and the FP8 reference."""
    from megamoe.kernels.fp8_plan import fp8_entry

    cfg = MoEConfig(**TMA_BASE)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    T = 19
    idx = _routing(rng, T, E, K, "random")
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w8 = random_weights(cfg, seed=29, fp8=True)
    dtype = device.dtype
    wt = w8.to_torch(device.name, device.torch_dtype(dtype))
    ptr = fp8_entry(_entry(device, dtype, H, I), "weights", dtype)  # no depths: pointer
    ptr = {g: dict(c, variant="pointer", BLOCK_K=128) for g, c in ptr.items()}
    _, want = _fp8w_gemms(device, dtype, wt, x, idx, tw, ptr, E, K, H, I)
    for swap in (True, False):
        entry = _entry(device, dtype, H, I, block_n=128, swap=swap)
        assert entry["gemm1"]["BLOCK_N"] == 128
        _, got = _fp8w_gemms(device, dtype, wt, x, idx, tw, entry, E, K, H, I)
        assert torch.isfinite(got.float()).all()
        if device.name == "cpu":
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        else:  # bf16: the folded weights are rounded to bf16 (the pointer GEMMs' are exact), so elements
            # near zero differ by more than any elementwise rtol; by the project's metric both are bf16
            # pipelines of the same layer. On an H200, elementwise rtol 2^-6 / atol 1e-3: 276 of 7904
            # elements (3.5%) apart, max 0.0117; a NumPy emulation of the two roundings (this seed):
            # 3.5%, max 0.0156, normalized error max 8.2e-3 / rms 4.6e-3
            assert_close(got.double().cpu().numpy(), want.double().cpu().numpy(), "bfloat16",
                         f"fp8w against the pointer FP8 GEMMs, swap={swap}")
    xr, wd = round_to_dtype(x, dtype), w8.dequantize()
    ref = pair_rows_reference(xr, wd, idx, tw, cfg)
    assert_close(got.double().numpy(), ref, "fp8_e4m3", "fp8w GEMMs, 128-row bands")


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("case", ["deepseek", "swiglu_bias", "input_scaled"])
def test_fp8w_layer_matches_the_fp8_reference(case, rng, device):
    """The layer with a "tma_persistent" entry: the routed and the shared MLP's GEMMs run the weight-only
    persistent kernels (the dense ones too) and match the reference's weight-only FP8 layer, in
    float32 and (DeepSeek-V3's layer) float16 (bfloat16 and float16 on CUDA)."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe as kmoe

    fields = {
        "deepseek": dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2,
                         routed_scaling_factor=2.5, score_bias=True, num_shared_experts=1, shared_intermediate_size=80),
        "swiglu_bias": dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
                            swiglu_limit=1.5),
        "input_scaled": dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=48),
    }[case]
    cfg = MoEConfig(**{**TMA_BASE, **fields})
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    x = rng.standard_normal((23, cfg.hidden_size))
    entry = cfgs.tma_entry(16, interpret=True) if device.name == "cpu" else cfgs.tma_entry(128)
    for dtype in (_dtypes(device) if case == "deepseek" else [device.dtype]):
        xt = device.tensor(x, dtype)
        sp = kmoe.static_plan_for(cfg, x.shape[0], xt.dtype, xt.device, True, gemm=entry, shared_gemm=entry,
                                  fp8="weights")
        assert sp.gemm["gemm1"]["variant"] == sp.gemm["gemm2"]["variant"] == "tma_persistent"
        if cfg.num_shared_experts:
            assert sp.shared["gemm1"]["variant"] == "tma_persistent"
        wt = w8.to_torch(device.name, device.torch_dtype(dtype))
        y = kmoe._forward(xt, wt, cfg, True, plan=sp, fp8_activations=False)
        ref = ref_forward(round_to_dtype(x, dtype), w8.round_to(dtype), cfg, fp8_activations=False)
        assert_close(y.cpu(), ref, "fp8_e4m3", f"fp8w layer {case} {dtype}")
        if dtype == "float32":
            assert_close(y.cpu(), ref, "float32", f"fp8w layer {case}")
        if case == "swiglu_bias":  # GEMM 2 adding into fp32 y with atomics (deterministic=False)
            spa = kmoe.static_plan_for(cfg, x.shape[0], xt.dtype, xt.device, False, gemm=entry, fp8="weights")
            assert spa.atomic and spa.gemm["gemm2"]["variant"] == "tma_persistent"
            ya = kmoe._forward(xt, wt, cfg, False, plan=spa, fp8_activations=False)
            assert_close(ya.cpu(), ref, "fp8_e4m3", f"fp8w layer {case} {dtype}, atomic GEMM 2")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="interpreter only")
@pytest.mark.parametrize("on", [True, False], ids=["persistent", "pointer"])
def test_entry_chooses_the_kernels_the_launch_plan_lists(on, rng, monkeypatch):
    """With a "tma_persistent" entry the weight-only layer launches _gemm*_fp8w_tma_kernel (routed and
    shared), with a "pointer" one the pointer FP8 GEMMs, and in both cases exactly what
    launch_plan(fp8="weights") lists, with its grids and block sizes."""
    import importlib

    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import launch_plan
    from megamoe.kernels import moe as kmoe

    cfg = MoEConfig(**{**TMA_BASE, "num_experts": 7, "top_k": 3, "num_shared_experts": 1,
                       "shared_intermediate_size": 80})
    w = random_weights(cfg, seed=31, fp8=True).to_torch("cpu", torch.float32)
    x = torch.from_numpy(rng.standard_normal((13, cfg.hidden_size))).float()
    entry = cfgs.tma_entry(16, interpret=True)
    if not on:
        entry = {g: dict(c, variant="pointer") for g, c in entry.items()}
    names = ("_gemm1_fp8w_tma_kernel", "_gemm2_fp8w_tma_kernel", "_gemm1_fp8_kernel", "_gemm2_fp8_kernel")
    kernels = {"_router_kernel": "routing", "_scan_experts_kernel": "align", "_layout_kernel": "align",
               "_scatter_pairs_kernel": "align", "_router_logits_kernel": "routing",
               "_combine_kernel": "grouped_gemm", **{n: "fp8w_tma" if "fp8w" in n else "fp8_gemm" for n in names}}
    log: list = []
    sp = kmoe.static_plan_for(cfg, 13, x.dtype, x.device, True, gemm=entry, shared_gemm=entry, fp8="weights")
    for name, mod in kernels.items():
        m = importlib.import_module(f"megamoe.kernels.{mod}")
        monkeypatch.setattr(m, name, LaunchRecorder(getattr(m, name), name, log))
    kmoe._forward(x, w, cfg, True, plan=sp, fp8_activations=False)
    topk_idx = kmoe.moe_forward_details(x, w, cfg)["topk_idx"].numpy()
    lp = launch_plan(cfg, topk_idx=topk_idx, dtype="float32", device_name="cpu-interpreter", fp8="weights",
                     gemm=entry, shared_gemm=entry)
    gemms = [(n, g, b) for n, g, b in log if "gemm" in n]
    want = ["_gemm1_fp8w_tma_kernel", "_gemm2_fp8w_tma_kernel"] * 2 if on else \
        ["_gemm1_fp8_kernel", "_gemm2_fp8_kernel"] * 2
    assert [n for n, _, _ in gemms] == want
    stages = [s for s in lp.stages if "gemm" in s.name]
    assert [(s.kernel, s.grid) for s in stages] == [(n, g) for n, g, _ in gemms]
    for st, (_, _, blocks) in zip(stages, gemms):
        for k, v in blocks.items():
            assert st.tile[k] == v, (st.name, k)
        assert (st.tile["variant"] == "tma_persistent") == on
        assert st.mma_dtype == "bf16" and st.loads.startswith("tma") == on


def test_fp8_entry_sizes_the_persistent_weight_only_gemms():
    """fp8_plan.fp8_entry, weight-only: the H200's prefill entry becomes 128-row persistent GEMMs with
    BLOCK_K = FP8W_TMA_BLOCK_K, SWAP_AB and GEMM 2's columns capped, stages within the budget with
    the converted tiles; either GEMM's depth not a multiple of 16 keeps both at the pointer kernels'
    64 rows; a "pointer" entry stays one (BLOCK_K 128, no SWAP_AB); the launch plan names the kernels."""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import fp8_plan as fp
    from megamoe.kernels import plan

    assert fp.FP8_BLOCK % fp.FP8W_TMA_BLOCK_K == 0
    entry = cfgs.select_config(128, 2048, 768, 8, 4096, gpu="NVIDIA H200", dtype="bfloat16", triton_version="3.6.0")
    assert entry["gemm1"]["variant"] == entry["gemm2"]["variant"] == "tma_persistent"
    on = fp.fp8_entry(entry, "weights", depths=(2048, 768))
    off = fp.fp8_entry({g: dict(c, variant="pointer", FLATTEN=0) for g, c in entry.items()}, "weights",
                       depths=(2048, 768))
    for g in ("gemm1", "gemm2"):
        c = on[g]
        assert c["variant"] == "tma_persistent" and c["BLOCK_M"] == fp.FP8W_TMA_MAX_BLOCK_M
        assert c["BLOCK_K"] == fp.FP8W_TMA_BLOCK_K and c["SWAP_AB"] == int(fp.FP8W_TMA_SWAP_AB)
        assert c["BLOCK_N"] <= fp.FP8W_TMA_SWAP_MAX_BLOCK_N or not fp.FP8W_TMA_SWAP_AB
        n_w = 2 if g == "gemm1" else 1
        w_tile = n_w * c["BLOCK_N"] * c["BLOCK_K"]
        assert c["num_stages"] * (c["BLOCK_M"] * c["BLOCK_K"] * 2 + w_tile) + 2 * w_tile <= fp.FP8_SMEM_BUDGET_BYTES
        assert off[g]["variant"] == "pointer" and off[g]["BLOCK_K"] == 128 and "SWAP_AB" not in off[g]
        assert off[g]["BLOCK_M"] == fp.FP8_MAX_BLOCK_M
    b_operand = fp.fp8_entry(entry, "weights", depths=(2048, 768), options=fp.FP8Options(swap_ab=False))
    assert b_operand["gemm2"]["SWAP_AB"] == 0 and b_operand["gemm2"]["BLOCK_N"] == entry["gemm2"]["BLOCK_N"]
    for depths in ((2056, 768), (2048, 776), None):  # 8-byte rows of e4m3 codes (or no depths): no TMA
        odd = fp.fp8_entry(entry, "weights", depths=depths)
        assert odd["gemm1"]["BLOCK_M"] == fp.FP8_MAX_BLOCK_M
        assert [odd[g]["variant"] for g in ("gemm1", "gemm2")] != ["tma_persistent"] * 2
    # the H200's launch plan of Qwen3-30B-A3B at T = 4096: the entry picks the kernels, e4m3 weight bytes
    cfg = MoEConfig.preset("qwen3-30b-a3b")
    counts = np.full(128, 4096 * 8 // 128)
    for gemm, kernels, bm in ((None, ("_gemm1_fp8w_tma_kernel", "_gemm2_fp8w_tma_kernel"), 128),
                              ({g: dict(c, variant="pointer", FLATTEN=0) for g, c in entry.items()},
                               ("_gemm1_fp8_kernel", "_gemm2_fp8_kernel"), 64)):
        lp = plan.launch_plan(cfg, 4096, counts=counts, fp8="weights", triton_version="3.6.0", gemm=gemm)
        g1, g2 = lp.stage("gemm1"), lp.stage("gemm2")
        assert (g1.kernel, g2.kernel) == kernels and lp.block_m == bm
        assert g1.operand_bytes_per_tile["b"] == pytest.approx(2 * g1.tile["BLOCK_N"] * 2048 * (1 + 4 / 128**2))
        assert (g1.grid == (132,)) == (gemm is None)  # persistent: one program per SM of an H200


@triton.jit
def _fold(src, s_ptr, dst, CVT: tl.constexpr, R: tl.constexpr, N: tl.constexpr):
    """fp8w_tma._e4m3_folded alone: an (R, N) tile of codes and R row scales -> dst's dtype."""
    r = tl.arange(0, R)
    n = tl.arange(0, N)
    w = tl.load(src + r[:, None] * N + n[None, :])
    tl.store(dst + r[:, None] * N + n[None, :], _e4m3_folded(w, tl.load(s_ptr + r), dst.dtype.element_ty, CVT))


def _ordered_bits(v):
    """16-bit floats v -> int32 in value order, one step per ulp: sign-magnitude bit patterns folded
    so that -0 and +0 are both 0 and the negatives count down from it."""
    b = v.view(torch.int16).int() & 0xFFFF
    mag = b & 0x7FFF
    return torch.where(b >= 0x8000, -mag, mag)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the NaN codes x the largest scale
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_fold_rounds_code_times_scale_once(dtype, device):
    """_e4m3_folded: every finite e4m3 code times block scales across the range (the smallest a
    quantized block can have, typical ones, ones with 24 significant bits, the largest taken) is
    code x s rounded once to the dtype: exactly the float32 product's rounding with Triton's ops (CVT
    1, the interpreter's; the cast, CVT 0), and with the inline PTX (CVT 2, GPU) within one ulp of
    code x s correctly rounded (bfloat16: nearly always equal to it; float16, whose correction
    term underflows for small weights: a few percent one ulp off)."""
    from megamoe.kernels.fp8w_tma import fold_scale_max

    if dtype == "bfloat16" and device.name == "cpu":
        pytest.skip("the interpreter computes bfloat16 on its uint16 bits (toolchain facts): GPU only")
    dt = getattr(torch, dtype)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = torch.isfinite(codes.float())
    lim = fold_scale_max(dt, 2 if device.name == "cuda" else 1)
    scales = np.array([1e-4 / 448, 2.0**-20 * 1.2345678, 3.1e-4, 1.0 / 3.0, 0.0123456789, 1.5, 7.0 / 3.0,
                       min(lim, 255.0), 2.0**-10], np.float32)
    R = triton.next_power_of_2(len(scales))
    s = np.pad(scales, (0, R - len(scales)), constant_values=1.0)
    tile = codes.view(1, 256).expand(R, 256).contiguous()
    want_f32 = torch.from_numpy(s).double()[:, None] * torch.from_numpy(e4m3_decode(np.arange(256, dtype=np.uint8)))
    want = torch.from_numpy(round_to_dtype(want_f32.numpy().astype(np.float32).astype(np.float64), dtype))
    exact = torch.from_numpy(round_to_dtype(want_f32.numpy(), dtype))
    for cvt in (0, 1, 2) if device.name == "cuda" else (1,):
        got = torch.empty((R, 256), dtype=dt, device=device.name)
        _fold[(1,)](tile.to(device.name), torch.from_numpy(s).to(device.name), got, CVT=cvt, R=R, N=256)
        g = got.cpu()[:len(scales), finite]
        if cvt < 2 or dtype == "float32":
            assert torch.equal(g.double(), want[:len(scales), finite]), (dtype, cvt)
        else:  # ulps apart: distance on the bit patterns laid out in value order (+0 and -0 both 0: the
            # negative zero code times a fold factor whose lo part is negative comes out +0, equal in value)
            e = exact[:len(scales), finite].to(dt)
            apart = (_ordered_bits(g) - _ordered_bits(e)).abs()
            assert (apart <= 1).all(), (dtype, cvt)
            # bfloat16: the correction c x lo keeps code x s to within 2^-17 of it (a NumPy emulation of the
            # PTX gives the correctly rounded value for every code at these scales); float16: c x lo falls
            # below float16's normal range for weights under ~0.125, so there the scale is in effect
            # rounded to float16 first (the emulation: 1.5% of these weights one ulp off)
            assert (apart != 0).float().mean() <= (0.01 if dtype == "bfloat16" else 0.05), (dtype, cvt)


def test_bad_inputs_are_named(rng, device):
    """Clear errors: a block scale past fold_scale_max for x's dtype (float16: the folded weight
    past 65504; the check runs again after the scales change in place), a K tile that does not divide
    the scale block, an entry without SWAP_AB, e4m3 rows TMA cannot read (H = 200), split-K."""
    from megamoe.kernels.fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8
    from megamoe.kernels.fp8w_tma import fold_scale_max
    from megamoe.kernels.moe import align_only

    cfg = MoEConfig(**TMA_BASE)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    T = 6
    idx = _routing(rng, T, E, K, "random")
    half = device.torch_dtype(device.half)
    w8 = random_weights(cfg, seed=37, fp8=True)
    wt = w8.to_torch(device.name, half)
    entry = _entry(device, device.half, H, I)
    meta = align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), E, entry["gemm1"]["BLOCK_M"])
    B_max = meta["block_expert"].shape[0]
    x = device.tensor(rng.standard_normal((T, H)), device.half)
    act = torch.empty((meta["padded_token"].shape[0], I), device=device.name, dtype=half)
    kw = dict(activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False, num_m=B_max)

    def g1(w_scale, cfg1=entry["gemm1"], w=wt.gate_up, xx=x):
        launch_gemm1_fp8(xx, w, w_scale, None, act, None, meta, None, cfg1, **kw)

    g1(wt.gate_up_scale_inv)  # fine, and checked once
    lim = fold_scale_max(torch.float16, 2)
    assert lim == pytest.approx(65504 / 448)
    big = wt.gate_up_scale_inv.clone()
    big[2, 1, 0] = 150.0  # 448 x 150 > 65504: not a float16 weight
    with pytest.raises(ValueError, match=r"gate_up scale_inv: a weight block scale of 150 exceeds 146\.2.*float16"):
        g1(big)
    ok = wt.gate_up_scale_inv.clone()
    g1(ok)
    ok[0, 0, 0] = float("inf")  # changed in place after a passing check: checked again
    with pytest.raises(ValueError, match=r"a weight block scale of inf exceeds"):
        g1(ok)
    pairs = torch.empty((T * K, H), device=device.name, dtype=half)
    bad_down = wt.down_scale_inv.clone()
    bad_down[-1, -1, -1] = 1e3
    with pytest.raises(ValueError, match=r"down scale_inv: a weight block scale of 1000 exceeds"):
        launch_gemm2_fp8(act, None, wt.down, bad_down, None, pairs, meta, None, entry["gemm2"], T=T, K=K, KS=K,
                         dense=False, atomic=False, num_m=B_max)
    with pytest.raises(ValueError, match=r"needs BLOCK_K dividing 128.*got BLOCK_K=256"):
        g1(wt.gate_up_scale_inv, cfg1={**entry["gemm1"], "BLOCK_K": 256})
    no_swap = {k: v for k, v in entry["gemm1"].items() if k != "SWAP_AB"}
    with pytest.raises(ValueError, match=r"needs SWAP_AB 0 or 1 in its config, got None"):
        g1(wt.gate_up_scale_inv, cfg1=no_swap)
    odd = MoEConfig(**{**TMA_BASE, "hidden_size": 200})
    wo = random_weights(odd, seed=38, fp8=True).to_torch(device.name, half)
    with pytest.raises(ValueError, match=r"gate_up rows of 200 e4m3 codes.*200 is not a multiple of 16"):
        g1(wo.gate_up_scale_inv, w=wo.gate_up, xx=device.tensor(rng.standard_normal((T, 200)), device.half))
    with pytest.raises(ValueError, match=r"has no split-K, got split=2"):
        launch_gemm2_fp8(act, None, wt.down, wt.down_scale_inv, None, pairs, meta, None, entry["gemm2"], T=T, K=K,
                         KS=K, dense=False, atomic=False, num_m=B_max, split=2)


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_bench_fp8w_row_times_old_and_new_and_checks_both(monkeypatch, device):
    """benchmarks/bench_fp8w.py's row on a tiny layer under the interpreter (its CUDA-graph timer
    replaced by a constant): bf16, the pointer FP8 GEMMs and the persistent ones (both operand
    orders) each ran the layer, the FP8 ones within the FP8 reference's tolerance, from plans made
    with the entries and options they name, which the row records."""
    if device.name != "cpu":
        pytest.skip("the GPU run is the benchmark itself")
    from benchload import load_benchmark

    from megamoe.kernels import bench as kb
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import FP8W_TMA_SWAP_AB

    bf = load_benchmark("bench_fp8w")
    monkeypatch.setattr(kb, "graph_time_us", lambda fn, xs, reps: 100.0)
    cfg = MoEConfig(**TMA_BASE)
    w = random_weights(cfg, seed=41)
    weights = {"bf16": w.to_torch("cpu", torch.float32), "fp8": w.to_fp8().to_torch("cpu", torch.float32)}
    r = bf.bench_row("tiny", cfg, weights, 19, list(bf.VARIANTS), reps=1, sample=5, device="cpu",
                     gemm=cfgs.tma_entry(16, interpret=True))
    c = r["candidates"]
    assert all("error" not in c[v] for v in bf.VARIANTS), c
    assert all(c[v]["ok"] for v in ("fp8w_pointer", "fp8w_tma", "fp8w_tma_b")), c
    assert c["fp8w_pointer"]["config"]["gemm1"]["variant"] == "pointer"
    assert c["fp8w_tma"]["config"]["gemm1"]["SWAP_AB"] == int(FP8W_TMA_SWAP_AB)
    assert c["fp8w_tma_b"]["config"]["gemm2"]["SWAP_AB"] == 0
    assert c["fp8w_tma"]["speedup_vs_bf16"] == c["fp8w_tma"]["speedup_vs_fp8w_pointer"] == 1.0
    assert set(c["bf16"]["stage_us"]) == {"router+align", "gemm1", "gemm2", "combine"}
    assert bf.fmt_row(r)[0].startswith("tiny T=19")
