"""The FP8 paths of both backends (kernels/fp8_gemm.py's tiles, launched one GEMM at a time or run
by the megakernel) against the reference's FP8 layer.

Under the interpreter x is float32: the interpreter loads float8_e4m3fn tensors and converts every
finite code exactly, and its e4m3 dot is exact in fp32, so these tests check the kernels' scale
indexing and quantization at float32 precision (the ``fp8_e4m3`` row is the contract; weight-only
FP8 is also held to ``float32``'s). On CUDA the same tests run in bfloat16.

Sizes are odd on purpose: H = 200 and I = 136 are not multiples of 128, so the last scale block of
every matrix is partial, and GEMM 1's up rows start at row 136 of the fused [2I, H] weight, in the
middle of a scale block.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import MoEConfig, assert_close, random_weights, round_to_dtype, tolerance_for
from megamoe.reference import moe_forward as ref_forward
from megamoe.reference.fp8 import e4m3_decode, quantize_activations

pytestmark = pytest.mark.interpret

import triton  # noqa: E402  (after conftest.py chose the interpreter)
import triton.language as tl  # noqa: E402
from pairs import (  # noqa: E402
    pair_rows_reference,
)

from megamoe.kernels.fp8_common import _e4m3_to, _quantize_groups  # noqa: E402

BASE = dict(hidden_size=200, intermediate_size=136, num_experts=5, top_k=2)

#: name -> (config fields, why)
CASES = {
    "deepseek": (dict(num_experts=8, router="sigmoid_grouped_topk", n_group=4, topk_group=2, routed_scaling_factor=2.5,
                      score_bias=True, num_shared_experts=1, shared_intermediate_size=72),
                 "DeepSeek-V3's layer: grouped sigmoid router, a shared MLP with its own FP8 weights (Is=72 < 128)"),
    "swiglu_bias": (dict(router="topk_softmax", router_bias=True, activation="clamped_swiglu", expert_bias=True,
                         swiglu_limit=1.5), "gpt-oss epilogue: biases and the clamp act before h is quantized"),
    "input_scaled": (dict(router="sigmoid_top1_input", top_k=1, num_shared_experts=1, shared_intermediate_size=24),
                     "Llama 4: the routing weight scales x before it is quantized; top-1 writes y directly"),
}


@triton.jit
def _quant(src, dst, dst_s, M: tl.constexpr, N: tl.constexpr):
    """The quantizer alone on an (M, N) fp32 block: codes and one scale per row."""
    m = tl.arange(0, M)
    n = tl.arange(0, N)
    q, s = _quantize_groups(tl.load(src + m[:, None] * N + n[None, :]))
    tl.store(dst + m[:, None] * N + n[None, :], q)
    tl.store(dst_s + m, s)


def _run(device, cfg, x, w8, fp8_activations, **kw):
    from megamoe.kernels import moe_forward

    y = moe_forward(device.tensor(x), w8.to_torch(device.name, device.torch_dtype()), cfg,
                    fp8_activations=fp8_activations, **kw)
    ref = ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg, fp8_activations=fp8_activations)
    assert y.dtype == device.torch_dtype() and y.shape == ref.shape
    return y.cpu(), ref


def _check(device, y, ref, fp8_activations, what):
    rep = assert_close(y, ref, "fp8_e4m3", what)
    if device.dtype == "float32" and not fp8_activations:  # nothing quantized in the kernel: float32's arithmetic
        assert_close(y, ref, "float32", what)
    return rep


@pytest.mark.parametrize("case,fp8_activations,backend", [
    ("deepseek", True, "multi"),  # grouped router and a shared MLP, both quantized
    ("deepseek", False, "megakernel"),  # weight-only FP8 in the megakernel, shared MLP included
    ("swiglu_bias", False, "multi"),  # biases and clamp on the weight-only path
    ("swiglu_bias", True, "megakernel"),  # ... before h is quantized, in the megakernel
    ("input_scaled", True, "multi"),  # Llama 4: x scaled by the routing weight before it is quantized
    ("input_scaled", True, "megakernel"),  # the same in the megakernel
])
def test_layer_matches_fp8_reference(case, fp8_activations, backend, rng, device):
    cfg = MoEConfig(**{**BASE, **CASES[case][0]})
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    x = rng.standard_normal((13, cfg.hidden_size))  # T % 3 == 1: the interpreter's GEMM 2 splits K in two
    y, ref = _run(device, cfg, x, w8, fp8_activations, backend=backend)
    _check(device, y, ref, fp8_activations, f"{case} fp8_activations={fp8_activations} {backend}")


@pytest.mark.parametrize("T", [0, 29])
def test_megakernel_fp8_edges_and_plan(T, rng, device):
    """The FP8 megakernel: T = 0 and every token on expert 3 (most experts empty); the
    tasks it ran are the plan's; its output within the FP8 tolerance and repeated bitwise."""
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward
    from megamoe.reference.tiles import KINDS, task_plan

    cfg = MoEConfig(**{**BASE, "num_experts": 7, "num_shared_experts": 1, "shared_intermediate_size": 72})
    w8 = random_weights(cfg, seed=17, fp8=True)
    rw = np.full_like(w8.router_weight, -1.0)
    rw[3], rw[5] = 1.0, 0.5
    w8 = type(w8)(**{**w8.arrays(), "router_weight": rw})
    x = np.abs(rng.standard_normal((T, cfg.hidden_size)))
    wt = w8.to_torch(device.name, device.torch_dtype())
    for fp8 in ("weights+act", "weights"):
        out = torch.full((T, cfg.hidden_size), float("nan"), device=device.name, dtype=device.torch_dtype())
        record = device.name == "cpu"  # the task record runs under the interpreter
        res = megakernel_forward(device.tensor(x), wt, cfg, fp8=fp8, out=out, record=record)
        y = res[0] if record else res
        ref = ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg,
                          fp8_activations=fp8 == "weights+act")
        _check(device, y.cpu(), ref, fp8 == "weights+act", f"megakernel {fp8} T={T}")
        again = megakernel_forward(device.tensor(x), wt, cfg, fp8=fp8)
        assert torch.equal(y, again)
        if record and T:
            mk = megakernel_config(cfg, T, device.torch_dtype(), torch.device(device.name), fp8=fp8)
            counts = np.bincount(ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg,
                                             details=True).routing.topk_idx.ravel(), minlength=7)
            plan = task_plan(cfg, counts, T, mk["tiles"], num_programs=res[1]["programs"])
            assert {k: res[1][k] for k in KINDS} == plan.tasks_per_kind()
            assert mk["tiles"]["gemm1"]["BLOCK_K"] == 128


def test_default_follows_the_weights_and_atomic_combine(rng, device):
    """fp8_activations=None is the reference's default (quantize when the weights are FP8); the
    atomic GEMM 2 (deterministic=False) and T=12 (no split-K) go through the same FP8 GEMMs."""
    cfg = MoEConfig(**BASE, num_shared_experts=1, shared_intermediate_size=40)
    w8 = random_weights(cfg, seed=11, fp8=True)
    x = rng.standard_normal((12, cfg.hidden_size))
    y, ref = _run(device, cfg, x, w8, None, deterministic=False)
    _check(device, y, ref, True, "default fp8_activations, atomic GEMM 2")


def test_empty_experts_and_one_expert_takes_every_token(rng, device):
    """Router weights that send every token to expert 3 first (then one other): most experts get
    no rows, expert 3 gets 29 rows (two row blocks under the interpreter)."""
    cfg = MoEConfig(**{**BASE, "num_experts": 7})
    w8 = random_weights(cfg, seed=12, fp8=True)
    rw = np.full_like(w8.router_weight, -1.0)
    rw[3], rw[5] = 1.0, 0.5
    w8 = type(w8)(**{**w8.arrays(), "router_weight": rw})
    x = np.abs(rng.standard_normal((29, cfg.hidden_size)))
    for fp8_act in (True, False):
        y, ref = _run(device, cfg, x, w8, fp8_act)
        _check(device, y, ref, fp8_act, f"every token on expert 3, fp8_activations={fp8_act}")


@pytest.mark.parametrize("T", [0, 1])
def test_tiny_batches(T, rng, device):
    cfg = MoEConfig(**BASE, num_shared_experts=1, shared_intermediate_size=72)
    w8 = random_weights(cfg, seed=13, fp8=True)
    y, ref = _run(device, cfg, rng.standard_normal((T, cfg.hidden_size)), w8, True)
    assert y.shape == (T, cfg.hidden_size)
    _check(device, y, ref, True, f"T={T}")


def test_poisoned_buffers(rng, device):
    """The FP8 GEMMs alone on a given routing, the activation codes, their scales and the pair
    buffer poisoned with NaN: every pair row is written from the reference's quantized FFN, and
    the padding rows of the activation are never written."""
    from megamoe.kernels.fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8
    from megamoe.kernels.moe import align_only
    from megamoe.kernels.plan import static_plan

    cfg = MoEConfig(**BASE)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    T = 18  # T % 3 != 1: no split-K in GEMM 2, so it writes the (T*K, H) pair buffer itself
    idx = np.stack([rng.permutation(E)[:K] for _ in range(T)])
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    w8 = random_weights(cfg, seed=14, fp8=True)
    name = "cpu-interpreter" if device.name == "cpu" else "NVIDIA H200"
    g = static_plan(cfg, T, dtype=device.dtype, device_name=name, fp8="weights+act").gemm
    meta = align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), E, g["gemm1"]["BLOCK_M"])
    P_max, B_max = meta["padded_token"].shape[0], meta["block_expert"].shape[0]
    wt = w8.to_torch(device.name, device.torch_dtype())
    nan = float("nan")
    act = torch.full((P_max, I), nan, device=device.name, dtype=torch.float8_e4m3fn)
    act_s = torch.full((P_max, 2), nan, device=device.name, dtype=torch.float32)
    pairs = torch.full((T * K, H), nan, device=device.name, dtype=device.torch_dtype())
    topk_w = device.tensor(tw, "float32")
    launch_gemm1_fp8(device.tensor(x), wt.gate_up, wt.gate_up_scale_inv, None, act, act_s, meta, topk_w, g["gemm1"],
                     activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False, num_m=B_max)
    launch_gemm2_fp8(act, act_s, wt.down, wt.down_scale_inv, None, pairs, meta, topk_w, g["gemm2"], T=T, K=K, KS=K,
                     dense=False, atomic=False, num_m=B_max, split=g["gemm2"]["SPLIT_K"])
    got = pairs.cpu().double().numpy()
    assert np.isfinite(got).all(), "a pair row was left unwritten or took NaN from a padding row"
    xr, wd = round_to_dtype(x, device.dtype), w8.dequantize()
    want = pair_rows_reference(xr, wd, idx, tw, cfg, fp8_activations=True)
    assert_close(got, want, "fp8_e4m3", "pair rows")
    n_rows = int(meta["padded_offsets"][E])
    pad = (meta["padded_token"][:n_rows] < 0).cpu()
    assert pad.any()
    assert torch.isnan(act.cpu()[:n_rows][pad].float()).all() and torch.isnan(act_s.cpu()[:n_rows][pad]).all(), \
        "padding rows were written"


def test_quantizer_codes_equal_the_reference(rng, device):
    """The in-kernel quantizer (GEMM 1's for x and h) gives reference.fp8's codes and scales bit
    for bit: every e4m3 value, every tie between two of them (subnormals included) and values just
    past the ties, at scale 1 (a 448 in each row) and scaled down; an all-zero row (AMAX_FLOOR);
    tiny random rows."""
    codes = np.arange(256, dtype=np.uint8)
    v = np.unique(e4m3_decode(codes[np.isfinite(e4m3_decode(codes))]))
    mids = (v[1:] + v[:-1]) / 2
    a = np.concatenate([v, mids, mids * (1 + 2**-20)])
    a = np.pad(a, (0, -len(a) % 127)).reshape(-1, 127)
    a = np.concatenate([np.full((len(a), 1), 448.0), a], axis=1)  # amax 448: scale 1
    a = np.concatenate([a, a * 3e-3, np.zeros((1, 128)), rng.standard_normal((4, 128)) * 1e-3]).astype(np.float32)
    M = triton.next_power_of_2(len(a))
    a = np.pad(a, ((0, M - len(a)), (0, 0)))
    q = torch.empty((M, 128), dtype=torch.float8_e4m3fn, device=device.name)
    s = torch.empty((M,), dtype=torch.float32, device=device.name)
    _quant[(1,)](torch.from_numpy(a).to(device.name), q, s, M=M, N=128)
    qr, sr = quantize_activations(a)
    np.testing.assert_array_equal(e4m3_decode(q.cpu().view(torch.uint8).numpy()), e4m3_decode(qr))  # -0 == +0
    np.testing.assert_array_equal(s.cpu().numpy(), sr[:, 0])


def test_unsupported_combinations_are_named(rng, device):
    from megamoe.kernels import moe_forward
    from megamoe.kernels.moe import KernelInputError, bind

    cfg = MoEConfig(**BASE)
    w8 = random_weights(cfg, seed=15, fp8=True)
    wt = w8.to_torch(device.name, device.torch_dtype())
    x = device.tensor(rng.standard_normal((3, cfg.hidden_size)))
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward

    mk = megakernel_config(cfg, 3, device.torch_dtype(), torch.device(device.name), fp8="weights")
    bad_mk = {**mk, "tiles": {**mk["tiles"], "gemm2": {**mk["tiles"]["gemm2"], "BLOCK_K": 64}}}
    with pytest.raises(ValueError, match=r"FP8 \(weights\) megakernel tiles need tiles\['gemm2'\]\['BLOCK_K'\] = 128"):
        megakernel_forward(x, wt, cfg, fp8="weights", mk=bad_mk)
    bind(wt, cfg, backend="megakernel")  # FP8 on the megakernel binds (its FP8 tiles)
    with pytest.raises(KernelInputError, match=r"\(activation-only FP8\) is not supported"):
        moe_forward(x, random_weights(cfg, seed=15).to_torch(device.name, device.torch_dtype()), cfg,
                    fp8_activations=True)
    with pytest.raises(KernelInputError, match=r"fp8_activations must be True, False or None, got 'yes'"):
        moe_forward(x, wt, cfg, fp8_activations="yes")
    bad = type(wt)(**{**wt.arrays(), "down_scale_inv": wt.down_scale_inv.to(torch.float16)})
    with pytest.raises(KernelInputError, match=r"weights.down_scale_inv has dtype torch.float16, expected "
                                               r"torch.float32: FP8 block scales are float32"):
        moe_forward(x, bad, cfg)
    bad = type(wt)(**{**wt.arrays(), "gate_up": wt.gate_up.to(device.torch_dtype())})
    with pytest.raises(KernelInputError, match=r"weights.gate_up has dtype .*, expected torch.float8_e4m3fn"):
        moe_forward(x, bad, cfg)
    # bind runs the same FP8 layer as moe_forward
    y = bind(wt, cfg)(x)
    torch.testing.assert_close(y, moe_forward(x, wt, cfg), rtol=0, atol=0)


def test_fp8_entry_sizes_the_tiles():
    """Block sizes come from fp8_plan.fp8_entry: K tiles of one scale block, GEMM 1 whole groups of h."""
    from megamoe.kernels.plan import static_plan

    cfg = MoEConfig(**BASE)
    for fp8, bn in (("weights", None), ("weights+act", 128)):
        sp = static_plan(cfg, 13, dtype="float32", device_name="cpu-interpreter", fp8=fp8)
        assert sp.fp8 == fp8 and sp.act is None
        assert sp.gemm["gemm1"]["BLOCK_K"] == sp.gemm["gemm2"]["BLOCK_K"] == 128
        assert sp.gemm["gemm1"]["SPLIT_K"] == 1 and sp.split2 == 2
        assert bn is None or sp.gemm["gemm1"]["BLOCK_N"] == bn
    # the H200's prefill tiles: BLOCK_M cut to 64 for both GEMMs (and the align), stages within the budget
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import FP8_MAX_BLOCK_M, FP8_SMEM_BUDGET_BYTES

    big = MoEConfig(hidden_size=7168, intermediate_size=2048, num_experts=256, top_k=8)
    pointer = cfgs.default_config(256, 7168, 2048, 8, 4096)  # the heuristic's 128-row pointer entry
    assert pointer["gemm1"]["BLOCK_M"] == 128 and pointer["gemm1"]["variant"] == "pointer"
    for fp8, a2 in (("weights", 2), ("weights+act", 1)):
        sp = static_plan(big, 4096, dtype="bfloat16", device_name="NVIDIA H200", fp8=fp8, gemm=pointer)
        g1, g2 = sp.gemm["gemm1"], sp.gemm["gemm2"]
        assert g1["BLOCK_M"] == g2["BLOCK_M"] <= FP8_MAX_BLOCK_M and sp.P_max % g1["BLOCK_M"] == 0
        assert g1["num_stages"] * (g1["BLOCK_M"] * 128 * 2 + 2 * g1["BLOCK_N"] * 128) <= FP8_SMEM_BUDGET_BYTES
        assert g2["num_stages"] * (g2["BLOCK_M"] * 128 * a2 + g2["BLOCK_N"] * 128) <= FP8_SMEM_BUDGET_BYTES
    with pytest.raises(ValueError, match=r"fp8 must be one of"):
        static_plan(cfg, 13, dtype="float32", device_name="cpu-interpreter", fp8="act")


@triton.jit
def _convert(src, dst, CVT: tl.constexpr, N: tl.constexpr):
    """fp8_common._e4m3_to alone: N codes to dst's dtype."""
    o = tl.arange(0, N)
    tl.store(dst + o, _e4m3_to(tl.load(src + o), dst.dtype.element_ty, CVT))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_e4m3_bit_moves_equal_the_cast(dtype, device):
    """The bit-move conversion of weight-only FP8 (megakernel config "fp8_convert": "bits"; CVT 1
    in Triton integer ops, CVT 2 in inline PTX on a GPU) gives the cast's bits for every finite
    e4m3 code, subnormals and -0 included."""
    if dtype == "bfloat16" and device.name == "cpu":
        pytest.skip("the interpreter computes bfloat16 on its uint16 bits (toolchain facts): GPU only")
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(device.name)
    finite = torch.isfinite(codes.float()).cpu()
    dt = getattr(torch, dtype)
    want = codes.float().to(dt).cpu()
    for cvt in (1, 2) if device.name == "cuda" else (1,):
        got = torch.empty(256, dtype=dt, device=device.name)
        _convert[(1,)](codes, got, CVT=cvt, N=256)
        bits = torch.int32 if dt == torch.float32 else torch.int16
        assert torch.equal(got.cpu()[finite].view(bits), want[finite].view(bits)), (dtype, cvt)


def _variants():
    from benchload import load_benchmark

    return load_benchmark("megakernel_variants")


#: (variant, fp8 mode, T, x dtype, why)
FP8_VARIANT_CASES = [
    ("ptrw", "weights+act", 13, None, "e4m3 weight tiles by pointer loads (the default: TMA), e4m3 x e4m3 products"),
    ("tmaw", "weights", 1, None, "TMA weight tiles converted to the rows' dtype, one token"),
    ("tmaw", "weights", 13, "float16", "TMA weight tiles converted to float16"),
    ("tmaw", "weights", 0, None, "no tokens"),
]


@pytest.mark.parametrize("variant,fp8,T,xdt", [c[:4] for c in FP8_VARIANT_CASES],
                         ids=[f"{c[0]}-{c[1]}-T{c[2]}" + (f"-{c[3]}" if c[3] else "") for c in FP8_VARIANT_CASES])
def test_megakernel_fp8_variants(variant, fp8, T, xdt, rng, device):
    """The FP8 decode variants of benchmarks/megakernel_variants.py (FP8_VARIANTS) against the FP8
    reference: odd sizes (H = 200, I = 136, Is = 72: partial scale blocks), a shared MLP, every
    token on expert 3 first (most experts empty)."""
    from megamoe.kernels.megakernel import megakernel_config, megakernel_forward

    mv = _variants()
    assert variant in mv.FP8_VARIANTS + mv.FP8A_VARIANTS
    cfg = MoEConfig(**{**BASE, "num_experts": 7, "num_shared_experts": 1, "shared_intermediate_size": 72})
    w8 = random_weights(cfg, seed=19, fp8=True)
    rw = np.full_like(w8.router_weight, -1.0)
    rw[3], rw[5] = 1.0, 0.5
    w8 = type(w8)(**{**w8.arrays(), "router_weight": rw})
    dtype = xdt or device.dtype
    x = np.abs(rng.standard_normal((T, cfg.hidden_size)))
    base = megakernel_config(cfg, T, device.torch_dtype(dtype), torch.device(device.name), fp8=fp8)
    mk = mv.VARIANTS[variant][0](base)
    assert mk != base
    wt = w8.to_torch(device.name, device.torch_dtype(dtype))
    y = megakernel_forward(device.tensor(x, dtype), wt, cfg, mk=mk, fp8=fp8)
    ref = ref_forward(round_to_dtype(x, dtype), w8.round_to(dtype), cfg, fp8_activations=fp8 == "weights+act")
    assert y.shape == ref.shape
    rep = assert_close(y.cpu(), ref, "fp8_e4m3", f"{variant} {fp8} T={T} {dtype}")
    if dtype == "float32" and fp8 == "weights":  # nothing quantized in the kernel: float32's arithmetic
        assert_close(y.cpu(), ref, "float32", f"{variant} T={T}")
    assert rep.max_err <= tolerance_for("fp8_e4m3")[0]


def test_both_backends_read_one_fp8_conversion_choice():
    """The e4m3 conversion is chosen in one place (configs.FP8_CONVERT_DEFAULT, fp8_common.FP8_CONVERT):
    the megakernel's config default and the multi-launch GEMMs' CVT come from it; FP8 activations
    convert nothing (CVT 0); an unknown name is refused by name."""
    from megamoe.kernels import fp8_gemm as fg
    from megamoe.kernels import megakernel_config as mkc
    from megamoe.kernels.megakernel import fp8_convert_code

    assert fg.convert_code("bits", True) == 2 and fg.convert_code("bits", False) == 1
    assert fg.convert_code("cast", True) == fg.convert_code("cast", False) == 0
    with pytest.raises(ValueError, match="'ptx'"):
        fg.convert_code("ptx", True)
    x = torch.zeros(2, 8)
    assert fg._multi_cvt(x, False) == fg.convert_code(mkc.FP8_CONVERT_DEFAULT, False)
    assert fg._multi_cvt(x, True) == 0
    assert fp8_convert_code(True) == fg.convert_code(mkc.FP8_CONVERT_DEFAULT, True)
    assert fp8_convert_code(False) == fg.convert_code(mkc.FP8_CONVERT_DEFAULT, False)


# --------------------------------------------------------------------------- x quantized once
#: sizes where the persistent FP8 GEMMs could run: e4m3 rows need 16-byte strides (H, I multiples of 16),
#: still not multiples of 128 (partial last scale blocks; GEMM 1's up rows start mid-block at 144)
TMA_BASE = dict(hidden_size=208, intermediate_size=144, num_experts=5, top_k=2)


def _fp8_gemms(device, wt, x, idx, tw, entry, block_m, E, K, H, I, num_sms, quantize_x=False):
    """Both FP8-activation GEMMs on a given routing, act codes, scales and pairs poisoned with NaN;
    ``quantize_x``: x quantized once first (fp8_gemm.launch_quantize_x), GEMM 1 reading the codes."""
    from megamoe.kernels.fp8_gemm import launch_gemm1_fp8, launch_gemm2_fp8
    from megamoe.kernels.moe import align_only

    T = x.shape[0]
    meta = align_only(torch.from_numpy(idx).to(torch.int32).to(device.name), E, block_m)
    P_max, B_max = meta["padded_token"].shape[0], meta["block_expert"].shape[0]
    nan = float("nan")
    act = torch.full((P_max, I), nan, device=device.name, dtype=torch.float8_e4m3fn)
    act_s = torch.full((P_max, -(-I // 128)), nan, device=device.name, dtype=torch.float32)
    pairs = torch.full((T * K, H), nan, device=device.name, dtype=device.torch_dtype())
    topk_w = device.tensor(tw, "float32")
    x_q = _quantized_x(device, device.tensor(x))[:2] if quantize_x else None
    launch_gemm1_fp8(device.tensor(x), wt.gate_up, wt.gate_up_scale_inv, None, act, act_s, meta, topk_w,
                     entry["gemm1"], activation="silu_gated", alpha=1.0, limit=1.0, scale_input=False, dense=False,
                     num_m=B_max, num_sms=num_sms, x_q=x_q)
    launch_gemm2_fp8(act, act_s, wt.down, wt.down_scale_inv, None, pairs, meta, topk_w, entry["gemm2"], T=T, K=K,
                     KS=K, dense=False, atomic=False, num_m=B_max, num_sms=num_sms)
    n_rows = int(meta["padded_offsets"][E])
    valid = (meta["padded_token"][:n_rows] >= 0).cpu()
    return act.cpu()[:n_rows][valid], act_s.cpu()[:n_rows][valid], pairs.cpu()


def _quantized_x(device, xt, rows_extra: int = 0):
    """x's codes and scales from fp8_gemm.launch_quantize_x with the plan's launch sizes; both buffers
    poisoned (NaN codes 0x7F, NaN scales) and ``rows_extra`` rows longer than T, views of the first T."""
    from megamoe.kernels.fp8_gemm import launch_quantize_x
    from megamoe.kernels.plan import quantize_launch

    T, H = xt.shape
    q = torch.full((T + rows_extra, H), 0x7F, device=device.name, dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = torch.full((T + rows_extra, -(-H // 128)), float("nan"), device=device.name, dtype=torch.float32)
    launch_quantize_x(xt, q[:T], s[:T], quantize_launch(T, H, interpret=device.name == "cpu"))
    return q[:T], s[:T], q, s


@pytest.mark.parametrize("T,H", [(13, 200), (8, 256), (1, 130)])
def test_quantize_x_equals_the_reference_and_the_k_loop(T, H, rng, device):
    """fp8_gemm._quantize_x_kernel: codes and scales bit-equal to reference.fp8.quantize_activations and
    to _quantize_groups on the K loop's zero-padded (rows, 128) tiles (what GEMM 1 quantized before);
    T not a multiple of BLOCK_T and H not of 128 (masked tails), an all-zero token (AMAX_FLOOR), a
    token far below 1 and one with 448-sized entries; rows past T left as they were."""
    x = rng.standard_normal((T, H)).astype(np.float32)
    x[0] *= 1e-6
    if T > 2:
        x[1] = 0.0
        x[2, ::7] = 448.0 * 3
    xt = device.tensor(x)
    q, s, q_all, s_all = _quantized_x(device, xt, rows_extra=3)
    xr = xt.cpu().double().numpy()
    qr, sr = quantize_activations(xr)
    np.testing.assert_array_equal(e4m3_decode(q.cpu().view(torch.uint8).numpy()), e4m3_decode(qr))
    np.testing.assert_array_equal(s.cpu().numpy(), sr)
    # the K loop's quantizer on the same tiles, zero past H (its masked K tail), bit for bit
    G, M = -(-H // 128), triton.next_power_of_2(T)
    pad = np.zeros((M, G * 128), np.float32)
    pad[:T, :H] = xt.cpu().float().numpy()
    for g in range(G):
        qk = torch.empty((M, 128), dtype=torch.float8_e4m3fn, device=device.name)
        sk = torch.empty((M,), dtype=torch.float32, device=device.name)
        _quant[(1,)](torch.from_numpy(np.ascontiguousarray(pad[:, g * 128:(g + 1) * 128])).to(device.name), qk, sk,
                     M=M, N=128)
        w = min(128, H - g * 128)
        assert torch.equal(q[:, g * 128:g * 128 + w].cpu().view(torch.uint8), qk[:T, :w].cpu().view(torch.uint8))
        assert torch.equal(s[:, g].cpu(), sk[:T].cpu())
    assert (q_all[T:].cpu().view(torch.uint8) == 0x7F).all() and torch.isnan(s_all[T:].cpu()).all(), \
        "rows past T were written"


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_gemm1_reading_quantized_x_equals_the_k_loop(rng, device):
    """The pointer FP8 GEMM 1 reading x's codes and scales (XQ) against the same GEMM quantizing x in its
    K loop, every output poisoned, every token on experts 3 and 1 (three experts get no rows): the same
    activation codes and scales bit for bit and the same pair rows under the interpreter. (fp8_act_tma's
    GEMM 1 always reads the codes: test_kernels_fp8a.)"""
    from megamoe.kernels import configs as cfgs
    from megamoe.kernels.fp8_plan import fp8_entry

    T = 37
    cfg = MoEConfig(**TMA_BASE)
    E, K, H, I = cfg.num_experts, cfg.top_k, cfg.hidden_size, cfg.intermediate_size
    idx = np.tile(np.array([3, 1]), (T, 1))
    tw = rng.uniform(0.1, 1.0, (T, K))
    x = rng.standard_normal((T, H))
    wt = random_weights(cfg, seed=23, fp8=True).to_torch(device.name, device.torch_dtype())
    base = cfgs.default_config(E, H, I, K, T, interpret=device.name == "cpu")
    entry = fp8_entry({g: dict(c, SPLIT_K=1) for g, c in base.items()}, "weights+act", device.dtype, depths=(H, I))
    bm = entry["gemm1"]["BLOCK_M"]
    got = _fp8_gemms(device, wt, x, idx, tw, entry, bm, E, K, H, I, None, quantize_x=True)
    want = _fp8_gemms(device, wt, x, idx, tw, entry, bm, E, K, H, I, None)
    assert torch.isfinite(got[0].float()).all() and torch.isfinite(got[1]).all(), "a row left unwritten"
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1])
    if device.name == "cpu":
        assert torch.equal(got[2], want[2])


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_layer_with_quantized_x_equals_the_k_loop(rng, device):
    """The layer with FP8 activations quantizes x once (plan stage "quantize_x") and both pointer GEMM 1s
    (routed, shared) read the codes: the output equals the K-loop quantization's (the plan's quant taken
    out; bitwise under the interpreter) and the FP8 reference; DeepSeek-V3's layer, T and H odd."""
    import dataclasses

    from megamoe.kernels import moe as kmoe

    cfg = MoEConfig(**{**TMA_BASE, **CASES["deepseek"][0], "shared_intermediate_size": 80})
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    x = rng.standard_normal((19, cfg.hidden_size))
    xt = device.tensor(x)
    sp = kmoe.static_plan_for(cfg, x.shape[0], xt.dtype, xt.device, True, fp8="weights+act")
    wt = w8.to_torch(device.name, device.torch_dtype())
    y = kmoe._forward(xt, wt, cfg, True, plan=sp, fp8_activations=True)
    y0 = kmoe._forward(xt, wt, cfg, True, plan=dataclasses.replace(sp, quant=None), fp8_activations=True)
    assert sp.quant is not None
    if device.name == "cpu":
        assert sp.gemm["gemm1"]["variant"] == "pointer"
        assert torch.equal(y, y0)
    else:
        torch.testing.assert_close(y, y0, rtol=2**-6, atol=1e-3)
    ref = ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg, fp8_activations=True)
    assert_close(y.cpu(), ref, "fp8_e4m3", "quantized x, deepseek")


def test_quantize_x_in_the_launch_plan_and_not_for_input_scaling():
    """The launch plan prices the x quantization (stage "quantize_x": x read, codes and scales written)
    and GEMM 1's gathered rows at e4m3 bytes (+ a scale per 128); Llama 4 (weight_on_input: the routing
    weight scales the rows before they are quantized) and weight-only FP8 keep the K-loop quantization
    (no stage, no quant, and the launcher refuses codes with scale_input)."""
    from megamoe.kernels.fp8_gemm import gemm1_fp8_launch
    from megamoe.kernels.plan import launch_plan, static_plan
    from megamoe.reference.sizes import row_bytes

    cfg = MoEConfig(hidden_size=2048, intermediate_size=768, num_experts=16, top_k=2, num_shared_experts=1,
                    shared_intermediate_size=512)
    T = 104
    counts = np.full(cfg.num_experts, T * cfg.top_k // cfg.num_experts)  # 13 pairs each
    p = launch_plan(cfg, T, counts=counts, fp8="weights+act")
    sp = static_plan(cfg, T, fp8="weights+act")
    names = [s.name for s in p.stages]
    assert names.index("quantize_x") < names.index("gemm1") < names.index("shared_gemm1")
    q = p.stage("quantize_x")
    assert q.grid == sp.quant["grid"] == (-(-T // sp.quant["BLOCK_T"]), 2048 // 128)
    assert q.total_bytes == q.active_programs * sp.quant["BLOCK_T"] * 128 * (2 + 1) + q.active_programs * \
        sp.quant["BLOCK_T"] * 4
    assert q.total_bytes >= T * 2048 * 3 + T * 16 * 4
    xb = row_bytes(2048, "fp8_e4m3") / 2048
    for name in ("gemm1", "shared_gemm1"):
        st = p.stage(name)
        assert st.operand_bytes_per_tile["a"] == st.tile["BLOCK_M"] * 2048 * xb
    before = launch_plan(cfg, T, counts=counts, fp8="weights")
    assert "quantize_x" not in [s.name for s in before.stages] and static_plan(cfg, T, fp8="weights").quant is None
    assert before.stage("gemm1").operand_bytes_per_tile["a"] == before.stage("gemm1").tile["BLOCK_M"] * 2048 * 2
    llama = MoEConfig(**{**TMA_BASE, **CASES["input_scaled"][0]})
    assert static_plan(llama, 19, fp8="weights+act").quant is None
    assert "quantize_x" not in [s.name for s in launch_plan(llama, 19, counts=np.array([19, 0, 0, 0, 0]),
                                                            fp8="weights+act").stages]
    f8 = torch.float8_e4m3fn
    x = torch.empty((4, 256))
    with pytest.raises(ValueError, match="scale_input"):
        gemm1_fp8_launch(x, torch.empty((2, 256, 256), dtype=f8), torch.empty((2, 2, 2)), None,
                         torch.empty((8, 128), dtype=f8), torch.empty((8, 1)), {}, None, sp.gemm["gemm1"],
                         activation="silu_gated", alpha=1.0, limit=1.0, scale_input=True, dense=True, num_m=1,
                         x_q=(torch.empty((4, 256), dtype=f8), torch.empty((4, 2))))


@pytest.mark.parametrize("case,fp8", [("deepseek", "weights+act"), ("swiglu_bias", "weights"),
                                     ("input_scaled", "weights+act")])  # each epilogue once, both modes
def test_fp8_tma_weights_compute_what_the_pointer_loads_compute(case, fp8, rng, device):
    """Config "tma_weights" with FP8 (kernels/fp8_tma_tiles.py): the routed GEMM tasks read their e4m3
    weight tiles through TMA descriptors and scale them by the same per-column values, so the layer
    is bitwise the pointer tiles' (the same products in the same order), and within the FP8
    tolerance of the reference; biases and the clamp, Llama 4's input scaling, a shared MLP. TMA
    needs rows of 16-byte multiples: H = 208 and I = 144 (e4m3: one byte a code) still end in
    partial scale blocks, and the up rows start mid-block."""
    from megamoe.kernels.megakernel import build_launch, constexpr_values, megakernel_config, megakernel_forward

    cfg = MoEConfig(**{**BASE, "hidden_size": 208, "intermediate_size": 144, **CASES[case][0]})
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    x = rng.standard_normal((13, cfg.hidden_size))
    wt = w8.to_torch(device.name, device.torch_dtype())
    base = megakernel_config(cfg, 13, device.torch_dtype(), torch.device(device.name), fp8=fp8)
    _g, _a, kwargs, _y, _s = build_launch(device.tensor(x), wt, cfg, {**base, "tma_weights": True}, fp8=fp8)
    assert constexpr_values(kwargs)["TMA_W"] is True
    ys = {}
    for tma in (False, True):
        out = torch.full((13, cfg.hidden_size), float("nan"), device=device.name, dtype=device.torch_dtype())
        ys[tma] = megakernel_forward(device.tensor(x), wt, cfg, mk={**base, "tma_weights": tma}, fp8=fp8, out=out)
    assert torch.equal(ys[True], ys[False]), f"{case} {fp8}: TMA weight tiles differ from the pointer tiles"
    ref = ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg,
                      fp8_activations=fp8 == "weights+act")
    _check(device, ys[True].cpu(), ref, fp8 == "weights+act", f"{case} {fp8} tma_weights")


def _tma_case(case: str, T: int, rng, device, tma: bool):
    """(config, FP8 weights, them on the device, the FP8-activation megakernel config with "tma_weights"
    ``tma``) of CASES[case] with rows TMA can copy (H = 208, I = 144: 16-byte multiples of e4m3 codes,
    still partial scale blocks); at T = 29 every token's top choice is expert 3."""
    from megamoe.kernels.megakernel import megakernel_config

    cfg = MoEConfig(**{**BASE, "hidden_size": 208, "intermediate_size": 144, **CASES[case][0]})
    w8 = random_weights(cfg, seed=int(rng.integers(1 << 30)), fp8=True)
    if T == 29:
        rw = np.full_like(w8.router_weight, -1.0)
        rw[3] = 1.0
        w8 = type(w8)(**{**w8.arrays(), "router_weight": rw})
    base = {**megakernel_config(cfg, T, device.torch_dtype(), torch.device(device.name), fp8="weights+act"),
            "tma_weights": tma}
    return cfg, w8, w8.to_torch(device.name, device.torch_dtype()), base


@pytest.mark.parametrize("case,T,tma", [
    ("deepseek", 13, True),  # split router: the logits tasks quantize their H range; TMA weight tiles
    ("swiglu_bias", 29, False),  # router not split: the top-k tasks quantize all of H; pointer weight tiles
    ("input_scaled", 1, True),  # Llama 4: x scaled per pair before quantizing, in GEMM 1
    ("deepseek", 0, False),  # no tokens
], ids=["split-tma", "whole-ptr", "input_scaled", "T0"])
def test_fp8_x_quantized_once_by_the_router_tasks(case, T, tma, rng, device):
    """FP8 activations: the router tasks quantize x once (the logits tasks their H range's groups where
    the router is split, T = 1 and 13 here; the top-k tasks all of H for their tokens where it is not,
    T = 29) and the GEMM 1 tasks load the codes, pointer and TMA weight tiles alike (H = 208, I = 144);
    the layer within the FP8 tolerance of the reference into a poisoned buffer. Llama 4's input scaling
    quantizes x times the routing weight, per pair, in GEMM 1. T = 0, and every token on expert 3 first
    at T = 29."""
    from megamoe.kernels.megakernel import build_launch, constexpr_values, megakernel_forward

    cfg, w8, wt, base = _tma_case(case, T, rng, device, tma)
    x = rng.standard_normal((T, cfg.hidden_size))
    if T:
        kwargs = constexpr_values(build_launch(device.tensor(x), wt, cfg, base, fp8="weights+act")[2])
        assert kwargs["XQ"] is (not cfg.weight_on_input)
        assert kwargs["TMA_W"] is tma
    out = torch.full((T, cfg.hidden_size), float("nan"), device=device.name, dtype=device.torch_dtype())
    y1 = megakernel_forward(device.tensor(x), wt, cfg, mk=base, fp8="weights+act", out=out)
    assert y1.shape == (T, cfg.hidden_size) and not y1.isnan().any()
    if T:
        ref = ref_forward(round_to_dtype(x, device.dtype), w8.round_to(device.dtype), cfg, fp8_activations=True)
        _check(device, y1.cpu(), ref, True, f"{case} T={T} x quantized once")
