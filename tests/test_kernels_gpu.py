"""GPU-only checks of megamoe.kernels (skipped without CUDA): bf16 numerics on every preset at full
size, every tuned T bucket of the benchmarked presets (so each tuned config meets the reference),
bitwise determinism, CUDA-graph capture and torch.compile, each against the float64 reference.
The kernel tests shared with the interpreter (test_kernels_moe, _align, _hf, _checks, _bench) run
here too, on CUDA, through the ``device`` fixture.

Full-size presets use random bf16 weights made on the device; the reference runs on a few sampled
tokens with only the experts they pick (megamoe.numerics), in float64 on the same rounded values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import PRESETS, MoEConfig, assert_close, random_weights, round_to_dtype
from megamoe.reference import moe_forward as ref_forward

pytestmark = pytest.mark.gpu


def _layer(name):
    from megamoe.kernels.bench import random_device_weights

    cfg = MoEConfig.preset(name)
    return cfg, random_device_weights(cfg, seed=11)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_bf16(name):
    """Every preset at full size, T = 1, an odd T = 97 and T = 600 (past 16 routing blocks: the prefill
    router's logits launch where the preset takes it; run BU found Kimi-K2's out of shared memory there,
    a preset the tuned-bucket tests do not run): within the bf16 tolerance on sampled tokens, and the
    kernels' routing equals the reference's on them."""
    from megamoe.kernels import moe_forward, moe_forward_details
    from megamoe.numerics import check_numerics

    cfg, w = _layer(name)
    for T in (1, 97, 600):
        x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        y = moe_forward(x, w, cfg)
        d = moe_forward_details(x, w, cfg)
        rep = check_numerics(x, y, w, cfg, dtype="bfloat16", sample=4, topk_idx=d["topk_idx"])
        print(f"NUMERICS {name} T={T} max_err={rep.error.max_err:.3e} rms_err={rep.error.rms_err:.3e} "
              f"routing_agreement={rep.routing_agreement}")
        assert rep.routing_agreement == 1.0, (T, rep.to_dict())
        assert rep.ok, (T, rep.to_dict())
    del w
    torch.cuda.empty_cache()


@pytest.mark.parametrize("router", ["softmax_topk", "topk_softmax", "sigmoid_grouped_topk", "sigmoid_top1_input"])
def test_small_odd_shapes_bf16(router):
    """Tiny odd shapes in bf16 on the GPU, against the full reference."""
    from megamoe.kernels import moe_forward

    fields = dict(hidden_size=200, intermediate_size=72, num_experts=7, top_k=1 if router == "sigmoid_top1_input" else 3,
                  router=router, num_shared_experts=1, shared_intermediate_size=48)
    if router == "sigmoid_grouped_topk":
        fields.update(n_group=4, topk_group=2, score_bias=True, num_experts=8)
    cfg = MoEConfig(**fields)
    w = random_weights(cfg, seed=2)
    x = np.random.default_rng(3).standard_normal((13, cfg.hidden_size))
    y = moe_forward(torch.from_numpy(x).cuda().bfloat16(), w.to_torch("cuda", torch.bfloat16), cfg)
    ref = ref_forward(round_to_dtype(x, "bfloat16"), w.round_to("bfloat16"), cfg)
    assert_close(y, ref, "bfloat16", f"{router} bf16")


@pytest.fixture(scope="module", params=("mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
                                        "gpt-oss-120b"))
def bench_layer(request):
    """A benchmarked preset as benchmarked (kernels.bench.bench_config), weights made once per module."""
    from megamoe.kernels.bench import bench_config, random_device_weights

    cfg = bench_config(request.param)
    w = random_device_weights(cfg, seed=5)
    yield cfg, w
    del w
    torch.cuda.empty_cache()


@pytest.mark.parametrize("T", (1, 8, 64, 512, 4096, 16384))  # kernels/configs.py T_BUCKETS
def test_tuned_buckets_bf16(bench_layer, T):
    """Each tuned bucket's config (decode 16-row tiles with split-K; prefill BLOCK_M 128, 8 warps,
    BLOCK_N 256) runs the layer within the bf16 tolerance of the float64 reference on sampled tokens."""
    import triton

    from megamoe.kernels import configs as cfgs
    from megamoe.kernels import moe_forward, moe_forward_details
    from megamoe.kernels.moe import kernel_config
    from megamoe.numerics import check_numerics

    assert cfgs.T_BUCKETS == (1, 8, 64, 512, 4096, 16384)
    cfg, w = bench_layer
    x = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    used = kernel_config(cfg, T, torch.bfloat16, x.device)
    tuned = cfgs.select_config(cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.top_k, T,
                               gpu=torch.cuda.get_device_name(0), dtype="bfloat16", triton_version=triton.__version__)
    assert used == tuned
    y = moe_forward(x, w, cfg)
    d = moe_forward_details(x, w, cfg)
    rep = check_numerics(x, y, w, cfg, dtype="bfloat16", sample=8, seed=T, topk_idx=d["topk_idx"])
    print(f"BUCKET {cfg.name} T={T} gemm1={used['gemm1']} gemm2={used['gemm2']} max_err={rep.error.max_err:.3e} "
          f"rms_err={rep.error.rms_err:.3e} routing_agreement={rep.routing_agreement}")
    assert rep.ok, (T, used, rep.to_dict())


def test_deterministic_bitwise_and_atomic_close():
    """Bitwise equal from run to run, and both combines within the bf16 tolerance of the reference."""
    from megamoe.kernels import moe_forward
    from megamoe.numerics import check_numerics

    cfg, w = _layer("qwen3-30b-a3b")
    x = torch.randn(512, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    a = moe_forward(x, w, cfg)
    for _ in range(3):
        assert torch.equal(a, moe_forward(x, w, cfg))
    b = moe_forward(x, w, cfg, deterministic=False)
    for y, what in ((a, "deterministic"), (b, "atomic")):
        rep = check_numerics(x, y, w, cfg, dtype="bfloat16", sample=8)
        assert rep.ok, (what, rep.to_dict())


def test_cuda_graph_capture_and_compile():
    """Captured in a CUDA graph (no host sync inside), replayed on new inputs; and under torch.compile."""
    from megamoe.kernels import moe_forward

    cfg, w = _layer("deepseek-v3")
    T = 64
    xs = torch.randn(T, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        moe_forward(xs, w, cfg)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = moe_forward(xs, w, cfg, check=False)
    from megamoe.numerics import check_numerics

    for _ in range(2):
        xn = torch.randn_like(xs)
        xs.copy_(xn)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(ys, moe_forward(xn, w, cfg))
        rep = check_numerics(xn, ys, w, cfg, dtype="bfloat16", sample=8)  # the replay against the reference
        assert rep.ok, rep.to_dict()
    from megamoe.kernels import bind

    f = torch.compile(bind(w, cfg), fullgraph=True)
    xn = torch.randn_like(xs)
    yc = f(xn)
    assert torch.equal(yc, moe_forward(xn, w, cfg))
    assert check_numerics(xn, yc, w, cfg, dtype="bfloat16", sample=8).ok
