"""The routing check of moe_experts (kernels/checks.py): a bad routing made elsewhere gives a
KernelInputError naming the token, slot and value, and never an out-of-bounds access. The error
comes from the call itself under the interpreter and, on a GPU, from the next call or
``check_routing`` (``_reported`` runs both ways).

On the ``device`` fixture (CUDA where there is a GPU, else the Triton interpreter). The expected
outputs come from the float64 reference's experts on the good slots only.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megamoe.reference import (
    MoEConfig,
    Routing,
    assert_close,
    combine,
    experts_forward,
    plan_dispatch,
    random_weights,
    round_to_dtype,
)

pytestmark = pytest.mark.interpret

CFG = MoEConfig(hidden_size=16, intermediate_size=16, num_experts=7, top_k=3)  # small: one tile per GEMM
T = 6


@pytest.fixture
def layer(rng, device):
    from megamoe.kernels import checks

    checks._init(checks.flag_for(device.name, captured=True))  # no bad slot left by an earlier test
    w = random_weights(CFG, seed=1)
    x = rng.standard_normal((T, CFG.hidden_size))
    idx = np.stack([rng.permutation(CFG.num_experts)[:CFG.top_k] for _ in range(T)])
    tw = rng.uniform(0.1, 1.0, (T, CFG.top_k))
    return x, w, idx, tw


def _call(device, x, w, idx, tw, **kw):
    from megamoe.kernels import moe_experts

    t = w.to_torch(device.name, device.torch_dtype())
    return moe_experts(device.tensor(x), torch.as_tensor(idx).to(device.name),
                       torch.as_tensor(tw).to(device.name, torch.float32), t.gate_up, t.down, **kw)


def _reported(device, x, w, idx, tw, **kw):
    """``_call`` and then ``check_routing`` (where a GPU reports the call's bad routing)."""
    from megamoe.kernels import check_routing

    y = _call(device, x, w, idx, tw, **kw)
    check_routing(device.name)
    return y


def _reference(device, x, w, idx, tw):
    dt = device.dtype
    r = Routing(topk_idx=idx, topk_weights=tw, logits=np.zeros((T, CFG.num_experts)))
    plan = plan_dispatch(idx, CFG.num_experts)
    return combine(experts_forward(round_to_dtype(x, dt), r, plan, w.round_to(dt), CFG), plan, tw, CFG)


def _bad(kind, idx, tw):
    idx, tw = idx.copy(), tw.copy()
    if kind == "duplicate":  # token 2's slot 2 repeats its slot 0
        idx[2, 2] = idx[2, 0]
    elif kind == "out_of_range":  # E + 3
        idx[3, 1] = CFG.num_experts + 3
    elif kind == "minus_one":  # a masked slot, as some routers write
        idx[0, 1] = -1
    elif kind == "nan":
        tw[4, 0] = np.nan
    elif kind == "inf":
        tw[1, 2] = np.inf
    elif kind == "wraps_int32":  # 2^32 + 1 would wrap to expert 1 in a cast to int32
        idx[5, 0] = 2**32 + 1
    return idx, tw


BAD = {  # kind -> the message's words (token, slot, value)
    "duplicate": r"topk_idx\[2, 2\] = \d+: token 2 names expert \d+ twice \(slots 0 and 2\)",
    "out_of_range": r"topk_idx\[3, 1\] = 10 \(token 3, slot 1\) is outside \[0, 7\)",
    "minus_one": r"topk_idx\[0, 1\] = -1 \(token 0, slot 1\): masked slots \(-1\) are not supported yet",
    "nan": r"topk_weights\[4, 0\] = nan \(token 4, slot 0\) is not finite",
    "inf": r"topk_weights\[1, 2\] = inf \(token 1, slot 2\) is not finite",
    "wraps_int32": r"topk_idx\[5, 0\] = 4294967297 \(token 5, slot 0\) is outside \[0, 7\)",
}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_routing_is_named(kind, layer, device):
    from megamoe.kernels import KernelInputError

    x, w, idx, tw = layer
    bi, bw = _bad(kind, idx, tw)
    with pytest.raises(KernelInputError, match=BAD[kind]):
        _reported(device, x, w, bi, bw)


def test_several_bad_slots_counted(layer, device):
    from megamoe.kernels import KernelInputError

    x, w, idx, tw = layer
    bi, bw = _bad("out_of_range", *_bad("nan", *_bad("duplicate", idx, tw)))
    with pytest.raises(KernelInputError, match=r"topk_idx\[2, 2\].*3 bad slots in all: 1 out of range, 1 duplicate, "
                                               r"1 non finite weight"):
        _reported(device, x, w, bi, bw)


def test_good_routing_after_a_bad_one(layer, device):
    """The eager flag is reset per call: an error does not stick to the next, good call."""
    from megamoe.kernels import KernelInputError

    x, w, idx, tw = layer
    with pytest.raises(KernelInputError):
        _reported(device, x, w, *_bad("out_of_range", idx, tw))
    assert_close(_reported(device, x, w, idx, tw).cpu(), _reference(device, x, w, idx, tw), device.dtype, "good call")


@pytest.mark.parametrize("kind", ["duplicate", "minus_one", "nan"])  # one per way a slot is repaired
def test_unchecked_bad_slots_contribute_nothing(kind, layer, device):
    """check=False (and capture): a bad slot gets an unused expert and weight 0, so the output is the
    reference's sum over the good slots (a duplicate keeps its first slot)."""
    x, w, idx, tw = layer
    bi, bw = _bad(kind, idx, tw)
    y = _call(device, x, w, bi, bw, check=False)
    good_w = tw.copy()
    diff = (bi != idx) | ~np.isfinite(bw)
    good_w[diff] = 0.0
    assert_close(y.cpu(), _reference(device, x, w, idx, good_w), device.dtype, f"sanitized {kind}")


def test_sticky_flag_of_captured_graphs(layer, device, monkeypatch):
    """Inside a capture nothing is read: the bad slot is recorded in the sticky flag, which
    check_captured_routing reads after replay, naming token and slot, and then clears."""
    from megamoe.kernels import KernelInputError, checks

    x, w, idx, tw = layer
    monkeypatch.setattr(checks, "capturing", lambda dev: True)  # what a capture looks like to the layer
    _call(device, x, w, *_bad("duplicate", idx, tw))  # no error here
    _call(device, x, w, *_bad("out_of_range", idx, tw))
    with pytest.raises(KernelInputError, match=r"topk_idx\[2, 2\] = \d+: token 2 names expert \d+ twice.*"
                                               r"2 bad slots in all"):
        checks.check_captured_routing(device.name, num_experts=CFG.num_experts, top_k=CFG.top_k)
    checks.check_captured_routing(device.name, num_experts=CFG.num_experts, top_k=CFG.top_k)  # cleared


def test_unread_calls_report_at_the_callers_sync(layer, device):
    """check=False reads nothing (no host synchronization); the bad slot is not lost: the sticky
    flag holds it until check_captured_routing, where the caller synchronizes anyway."""
    from megamoe.kernels import KernelInputError, checks

    x, w, idx, tw = layer
    _call(device, x, w, idx, tw, check=False)
    checks.check_captured_routing(device.name, num_experts=CFG.num_experts, top_k=CFG.top_k)  # a good routing
    _call(device, x, w, *_bad("out_of_range", idx, tw), check=False)  # no error here
    with pytest.raises(KernelInputError, match=r"topk_idx\[3, 1\] = 10 \(token 3, slot 1\) is outside \[0, 7\)"):
        checks.check_captured_routing(device.name, num_experts=CFG.num_experts, top_k=CFG.top_k)


def test_too_many_slots_or_wrong_dtypes(layer, device):
    from megamoe.kernels import KernelInputError

    x, w, idx, tw = layer
    wide = np.tile(idx, (1, 3))  # K = 9 > E = 7: no row can be distinct
    with pytest.raises(KernelInputError, match=r"K=9 slots per token; K must be in \[1, E=7\]"):
        _call(device, x, w, wide, np.ones(wide.shape))
    with pytest.raises(KernelInputError, match="topk_idx must hold integer expert ids"):
        _call(device, x, w, idx.astype(np.float32), tw)


@pytest.mark.gpu
def test_cuda_graph_capture_sanitizes_and_flags(layer, device):
    """On the GPU: a captured moe_experts replayed with a bad routing writes the good slots' sum
    (no illegal memory access, the context stays usable) and the sticky flag names the slot."""
    from megamoe.kernels import KernelInputError, checks, moe_experts

    x, w, idx, tw = layer
    t = w.to_torch("cuda", torch.bfloat16)
    xs, ids, ws = device.tensor(x), torch.as_tensor(idx).cuda(), torch.as_tensor(tw).cuda().float()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        moe_experts(xs, ids, ws, t.gate_up, t.down)  # warm-up: compiles, makes the flags
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ys = moe_experts(xs, ids, ws, t.gate_up, t.down)
    bi, _ = _bad("minus_one", idx, tw)
    ids.copy_(torch.as_tensor(bi))
    g.replay()
    torch.cuda.synchronize()
    good_w = tw.copy()
    good_w[0, 1] = 0.0
    assert_close(ys.cpu(), _reference(device, x, w, idx, good_w), "bfloat16", "captured, sanitized")
    with pytest.raises(KernelInputError, match=r"topk_idx\[0, 1\] = -1"):
        checks.check_captured_routing("cuda", num_experts=CFG.num_experts, top_k=CFG.top_k)


def test_check_keeps_torch_compile_fullgraph(layer, device):
    """Under torch.compile the flag is not read (no graph break); the result is the eager one."""
    from megamoe.kernels import moe_experts

    x, w, idx, tw = layer
    t = w.to_torch(device.name, device.torch_dtype())
    args = (device.tensor(x), torch.as_tensor(idx).to(device.name), torch.as_tensor(tw).to(device.name, torch.float32))
    f = torch.compile(lambda a, i, g: moe_experts(a, i, g, t.gate_up, t.down), fullgraph=True, backend="eager")
    assert torch.equal(f(*args), moe_experts(*args, t.gate_up, t.down))
